// Job specs: YAML files validated against specstream.v1.JobSpec
// (proto/specstream/v1/job.proto); docs/job-config.md documents every field.
//
// Parsing goes YAML -> JSON -> protobuf JSON parsing, so the proto stays the
// one schema: keys are the proto field names, unknown keys and ill-typed
// values are refused by protobuf's parser (its message names the field).
// YAML scalars are typed as JSON the way a reader expects: a plain scalar
// that reads as an integer is an integer, then a float, then true/false,
// null/~/empty is null; anything else, and every quoted scalar, is a string.
// Sequences become arrays and maps objects (duplicate keys are refused).
//
// ValidateJobSpec then fills the defaults and checks what the schema cannot
// say; refusals are InvalidArgument "field.path: reason", e.g.
// "optimizer.lr: must be > 0, got 0".
//
// Nothing here touches LibTorch, so the coordinator can validate at submit
// time with the same code. Pure functions; thread-safe.
#ifndef SPECSTREAM_COMMON_JOBSPEC_JOB_SPEC_H_
#define SPECSTREAM_COMMON_JOBSPEC_JOB_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "specstream/v1/job.pb.h"

namespace specstream::jobspec {

// Defaults ValidateJobSpec fills in where a field is 0 / empty.
inline constexpr double kDefaultBeta1 = 0.9;
inline constexpr double kDefaultBeta2 = 0.95;
inline constexpr double kDefaultEps = 1e-8;
inline constexpr int64_t kDefaultTttSteps = 7;
inline constexpr int64_t kMaxTttSteps = 32;
inline constexpr char kDefaultDtype[] = "bfloat16";
inline constexpr char kDefaultSchedule[] = "cosine";
inline constexpr int64_t kDefaultLogEvery = 1;
inline constexpr int64_t kDefaultCpSize = 1;
inline constexpr char kDefaultCpMode[] = "ring";
inline constexpr int64_t kDefaultMaxRestarts = 3;
inline constexpr int64_t kMaxWorldSize = 65536;
// Upper bounds of counts that are narrowed on the way (stream credits, the
// job store's 32-bit columns, the checkpoint manager's int).
inline constexpr int64_t kMaxInFlight = 65536;
// data.in_flight's default: samples outstanding per teacher stream (the
// credits a student grants), for a job and for a trainer built in code.
inline constexpr int64_t kDefaultInFlight = 8;
// data.teacher_grace_s: how long lost teachers are reconnected to.
inline constexpr double kDefaultTeacherGraceSeconds = 60;
inline constexpr double kMaxTeacherGraceSeconds = 86400;
// data.regenerate.max_new_tokens's default: answer tokens at most.
inline constexpr int64_t kDefaultRegenerateTokens = 256;
// model.draft: the draft types, and the defaults and bounds of the block-
// draft fields (dflash / dspark, DESIGN §10; docs/job-config.md).
inline constexpr char kDraftTypeEagle3[] = "eagle3";
inline constexpr char kDraftTypePeagle[] = "peagle";
inline constexpr char kDraftTypeDflash[] = "dflash";
inline constexpr char kDraftTypeDspark[] = "dspark";
inline constexpr int64_t kDefaultBlockDraftLayers = 1;
inline constexpr int64_t kMaxBlockDraftLayers = 64;
inline constexpr int64_t kDefaultDflashBlockSize = 16;
inline constexpr int64_t kDefaultDsparkBlockSize = 7;
inline constexpr int64_t kMaxBlockSize = 64;
inline constexpr int64_t kDefaultNumAnchors = 512;
inline constexpr int64_t kMaxNumAnchors = 65536;
inline constexpr double kDefaultDflashLossDecayGamma = 7;
inline constexpr double kDefaultDsparkLossDecayGamma = 4;
inline constexpr int64_t kDefaultMarkovRank = 256;
inline constexpr int64_t kMaxMarkovRank = 4096;
inline constexpr char kDefaultMarkovHeadType[] = "vanilla";
inline constexpr double kDefaultCeLossWeight = 0.1;
inline constexpr double kDefaultL1LossWeight = 0.9;
inline constexpr double kDefaultConfLossWeight = 1.0;
// A job spec's size limit, checked before anything is parsed (the CLI and
// the coordinator both parse with JobYamlToJson).
inline constexpr size_t kMaxSpecBytes = size_t{1} << 20;
inline constexpr int64_t kMaxRestarts = 10000;
inline constexpr int64_t kMaxBadSteps = 1000000;
inline constexpr int64_t kMaxKeepLast = 1000000;

// YAML text -> validated spec with defaults filled. Errors:
//   * Text: InvalidArgument for more than kMaxSpecBytes, and (naming line
//     and column) for invalid UTF-8, a control character YAML does not
//     allow, and values that expand to more than 100k or nest more than 64
//     levels deep (aliases, an alias inside its own anchor).
//   * YAML syntax: InvalidArgument "job spec YAML: line L, column C: <msg>"
//     (1-based, from yaml-cpp's mark).
//   * Schema (unknown key, wrong type): InvalidArgument "job spec: <protobuf
//     message naming the field>".
//   * Semantics: ValidateJobSpec's errors.
absl::StatusOr<specstream::v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml_text);

// Reads `path` and parses it; errors are prefixed with the path.
absl::StatusOr<specstream::v1::JobSpec> LoadJobSpec(const std::string& path);

// Fills defaults in place and checks the rules of docs/job-config.md. On
// error `spec` may be partly defaulted. Idempotent on a valid spec.
// model.draft.type selects the rules: eagle3 (the default) fills
// training.ttt_steps, refuses the block-draft fields and fc_norm together
// with norm_before_fc; dflash and dspark fill their own defaults and refuse
// EAGLE-3's vocabulary fields, ttt_steps and EAGLE 3.1's flags. What needs the target
// (model.draft.target_layer_ids when empty, model.draft.mask_token_id when unset) is left for the
// student to resolve at start with common/block_draft.h.
absl::Status ValidateJobSpec(specstream::v1::JobSpec& spec);

// A training.device value: "auto", "cpu", "cuda" or "cuda:N" (N digits).
bool IsTrainingDevice(absl::string_view device);

// The YAML -> JSON step alone (exposed for tests and tools).
absl::StatusOr<std::string> JobYamlToJson(absl::string_view yaml_text);

// A stable 16-hex-digit fingerprint of a (validated) spec: FNV-1a 64 over its
// deterministic binary serialization (tests check with it that validation is
// idempotent). Checkpoints do not record it: a resume checks what makes it
// exact instead (the draft's type and options, the data plan, the world
// layout: student/train_state.h), naming what differs.
std::string JobSpecFingerprint(const specstream::v1::JobSpec& spec);

}  // namespace specstream::jobspec

#endif  // SPECSTREAM_COMMON_JOBSPEC_JOB_SPEC_H_
