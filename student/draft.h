// One draft type as the trainer, `specstream-student eval / export` and
// `specstream-eval` see it (DESIGN.md §11, STYLE.md 16): EAGLE-3 (with
// EAGLE 3.1's flags), DFlash and DSpark are implementations of TrainableDraft
// registered in DraftTypes(); nothing outside a draft's own files and the
// registry branches on the type.
//
// A training step, as the trainer drives it (student/trainer.h):
//   1. Plan(host batch, sample keys, seed, step, CP layout): what the step
//      decides on the host before the batch moves (a block draft's anchors);
//   2. LossNormaliser(batch, plan): this rank's share of the loss
//      normaliser; the trainer sums it over the world;
//   3. Empty(global normaliser): whether nothing on any rank is trained
//      (the update is then skipped on every rank);
//   4. Forward(batch, plan, global normaliser, dtype, CP groups): the
//      loss to differentiate and the step's metric sums;
//   5. on the steps that record metrics, the sums are added over the world
//      and Metrics() turns them into numbers.
// Evaluation (Evaluate below) runs the same four calls one sample at a time
// and adds the sums over samples instead.
//
// Thread-safety: one thread uses a draft at a time.
#ifndef SPECSTREAM_STUDENT_DRAFT_H_
#define SPECSTREAM_STUDENT_DRAFT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "common/torch/compat.h"
#include "common/torch/speculative.h"
#include "nlohmann/json.hpp"
#include "specstream/v1/job.pb.h"
#include "student/context_parallel.h"
#include "student/data_source.h"
#include "student/draft_model.h"
#include "student/train_state.h"

namespace specstream::student {

struct TrainerConfig;  // student/trainer.h

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Sums a draft records over its positions, by name, float64 on the draft's
// device. They add: over ranks (a training step) and over samples
// (evaluation); Metrics() reads the totals.
using MetricSums = std::map<std::string, torch::Tensor>;

// What a draft reports of summed MetricSums (student/metrics_sink.h's
// StepMetrics carries the same fields).
struct DraftMetrics {
  double loss = 0;
  std::vector<double> loss_k;  // EAGLE-3: per TTT step; empty for block drafts
  std::vector<double> acc_k;   // per TTT step / per block slot
  double sim_accept_len = 0;   // Σ_k Π_{j≤k} acc_j over the trained steps or slots
  int64_t positions = 0;       // positions at the first trained step or slot
  std::optional<double> tau;   // block drafts: mean accepted length, bonus included
  std::optional<double> calibration_error;  // DSpark's confidence head
};

// What a draft decides about a step on the host, before the batch moves
// to the device; opaque to the trainer, handed back to the draft that made it.
class StepPlan {
 public:
  virtual ~StepPlan() = default;
};

// One forward: `loss` to differentiate (normalised by the global
// normaliser) and this rank's metric sums.
struct DraftStep {
  torch::Tensor loss;
  MetricSums sums;
};

class TrainableDraft {
 public:
  virtual ~TrainableDraft() = default;

  // The job's model.draft.type: "eagle3", "peagle", "dflash", "dspark".
  virtual const std::string& type() const = 0;
  // A one-line description for the log.
  virtual std::string Describe() const = 0;
  // The target layers the draft reads, in order (SGLang ids).
  virtual CaptureLayerIds capture_layer_ids() const = 0;
  // Trainable tensors by export name, in a fixed order.
  virtual const NamedTensors& parameters() const = 0;
  virtual torch::Device device() const = 0;

  // What a rank reads of a sample under context parallelism, besides its
  // own rows: `halo_rows` rows after them (EAGLE-3's TTT unroll), and
  // whether the whole token ids and loss mask (block drafts).
  virtual int64_t halo_rows() const = 0;
  virtual bool reads_whole_token_ids() const = 0;
  // Whether Plan reads each sample's whole loss mask (P-EAGLE's COD plan):
  // under CP the trainer then fills DraftBatch::whole_loss_mask.
  virtual bool plans_on_whole_loss_mask() const { return false; }

  // The steps of a training run: see the file comment. `batch` is on the
  // host for Plan and on device() for the others; under CP it is this
  // rank's shard. `sample_keys` identify the batch's samples (their indices
  // in the data set); the plan must depend only on them, the seed and the
  // step, so that it is the same on every rank and after a resume.
  virtual absl::StatusOr<std::unique_ptr<StepPlan>> Plan(const DraftBatch& batch,
                                                         const std::vector<int64_t>& sample_keys,
                                                         uint64_t seed, int64_t step,
                                                         const CpLayout& layout) const = 0;
  virtual absl::StatusOr<torch::Tensor> LossNormaliser(const DraftBatch& batch,
                                                       const StepPlan& plan) const = 0;
  // May read the normaliser back from the device (block drafts do; EAGLE-3
  // never skips and reads nothing).
  virtual absl::StatusOr<bool> Empty(const torch::Tensor& global_normaliser) const = 0;
  virtual absl::StatusOr<DraftStep> Forward(const DraftBatch& batch, const StepPlan& plan,
                                            const torch::Tensor& global_normaliser,
                                            torch::Dtype compute_dtype,
                                            const CpGroups& groups) = 0;
  // Metrics from summed sums (host tensors).
  virtual DraftMetrics Metrics(const MetricSums& totals) const = 0;

  // What a checkpoint records besides the parameters (train_state.h); its
  // state carries "draft_type" and what RestoreDraft needs.
  virtual DraftRecord Record() const = 0;
  // The serving layout (SGLang / vLLM) in `dir`, against the target's config.
  virtual absl::Status Export(const HfModelConfig& target, const std::string& dir) const = 0;
  // The same architecture freshly initialised (seed `seed`): the untrained
  // baseline speculative decoding compares against.
  virtual absl::StatusOr<std::unique_ptr<TrainableDraft>> Fresh(uint64_t seed) const = 0;

  // Speculative decoding (common/torch/speculative.h): the most tokens one
  // proposal holds (`chain_length` is EAGLE-3's K; a block draft proposes
  // its block), and a proposal after `ids` from the target's captures.
  virtual int64_t ProposalLength(int64_t chain_length) const = 0;
  virtual absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                               int64_t max_tokens, spec::TokenChooser& chooser,
                               std::vector<int32_t>* tokens) = 0;
};

// What a draft type is created from at the start of training.
struct DraftContext {
  const TrainerConfig& config;
  const HfModelConfig& target;
  SampleSource& source;     // its captures (model()), target ids and tokens
  std::string source_name;  // for errors: where the samples come from
  CpLayout layout;
  torch::Device device = torch::kCPU;
};

// A checkpoint's or an export's draft tensors and records, as RestoreDraft
// hands them to a draft type.
struct RestoreInput {
  std::string path;  // the checkpoint step or export directory
  std::string what;  // "checkpoint DIR" / "export DIR", for errors
  std::string target_dir;
  // A checkpoint's state.json and draft tensors; an export's config.json
  // (the type reads its own model.safetensors).
  nlohmann::json state;
  std::map<std::string, torch::Tensor> tensors;
  bool is_export = false;
  bool need_full_lm_head = false;  // EAGLE-3 over a store without target ids
  int ttt_steps = 0;               // EAGLE-3's K for evaluation; 0: recorded or 7
};

// One registry line (DraftTypes()).
struct DraftType {
  std::string name;  // model.draft.type
  // The type's own fields of a validated model.draft into `config`.
  std::function<absl::Status(const v1::DraftSpec&, TrainerConfig*)> configure;
  // The layers the teachers must capture for it (online training asks for
  // them); empty: the teachers' default.
  std::function<absl::StatusOr<std::vector<int>>(const TrainerConfig&, const HfModelConfig&)>
      capture_layers;
  std::function<absl::StatusOr<std::unique_ptr<TrainableDraft>>(const DraftContext&)> create;
  // Whether a checkpoint's state.json / an export's config.json holds this type.
  std::function<bool(const nlohmann::json& state)> holds_checkpoint;
  std::function<bool(const nlohmann::json& config)> holds_export;
  std::function<absl::StatusOr<std::unique_ptr<TrainableDraft>>(const RestoreInput&)> restore;
};

// A draft's shape over `target` reading `captures` layers: model.draft's
// sizes where set, else the target's; the draft vocab is the target's (an
// EAGLE-3 draft then sets its own).
DraftShape DraftShapeFor(const TrainerConfig& config, const HfModelConfig& target,
                         int64_t captures);

// The target's norm epsilon, RoPE and positions into a restored draft's
// shape (checkpoints and exports record only the draft's sizes).
void TakeTargetPositions(const HfModelConfig& target, DraftShape* shape);

// Every draft type, one line each (student/draft.cc).
const std::vector<DraftType>& DraftTypes();
// The type named `name`; InvalidArgument naming model.draft.type otherwise.
absl::StatusOr<const DraftType*> FindDraftType(const std::string& name);

// A draft restored from `path`: a checkpoint root (its newest good step), a
// step directory, or an export directory (config.json + model.safetensors,
// which needs `options.target_dir`). `state` is the checkpoint's state.json,
// or {"target_dir", "capture_layer_ids"} for an export.
struct RestoredDraft {
  std::unique_ptr<TrainableDraft> draft;
  nlohmann::json state;
};
struct RestoreOptions {
  std::string target_dir;  // overrides a checkpoint's; required for an export
  bool need_full_lm_head = false;
  int ttt_steps = 0;
};
absl::StatusOr<RestoredDraft> RestoreDraft(const std::string& path,
                                           const RestoreOptions& options = {});

// Metrics of a draft over every sample of a source, one sample at a time,
// no updates (plans from `seed` and step 0).
struct EvalOptions {
  uint64_t seed = 0;
  int64_t max_length = 0;
  torch::Dtype dtype = torch::kFloat32;
};
absl::StatusOr<DraftMetrics> Evaluate(TrainableDraft& draft, SampleSource& source,
                                      const EvalOptions& options = {});

// Sums every tensor of `sums` over `group`'s ranks in one collective (null
// group: unchanged) and copies the totals to the host.
absl::StatusOr<MetricSums> ReduceToHost(const MetricSums& sums, CommGroup* group);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_DRAFT_H_
