// Training checkpoints (shared/DESIGN.md §7): one directory per step under a
// root, written whole or not at all, with a `latest` pointer.
//
//   <root>/latest                       "step-00000123\n", replaced atomically
//   <root>/step-00000123/
//     draft.safetensors                 trainable draft weights
//     optimizer.safetensors             per-parameter optimizer state, e.g.
//                                       "<param>.exp_avg", "<param>.exp_avg_sq",
//                                       "step" (names are the caller's)
//     state.json                        step, epoch, data cursor, scheduler,
//                                       config fingerprint, world size, ...
//                                       (any JSON; the caller's)
//     rng-rank-<r>.bin                  opaque RNG bytes of rank r, r = 0..W-1
//     manifest.json                     written last: format, step, and the
//                                       size and CRC32C of every file above
//   <root>/corrupt-step-00000123[-k]/   a step that failed verification when
//                                       loaded, set aside (never deleted)
//
// Save writes everything into <root>/.tmp-step-00000123-XXXXXX/ (each file
// fsynced), renames the directory to step-00000123, fsyncs the root, then
// replaces `latest` and prunes old steps. A crash at any point leaves either
// the previous checkpoint as latest or the new one; never a half-written
// step-N. A step directory counts as complete when manifest.json parses,
// names this step and every file it lists exists with the recorded size.
// Load also checks every file against its CRC32C (manifests written before
// checksums existed have none; their files are only size-checked).
//
// Multi-rank contract: only rank 0 creates a writable manager and calls Save,
// with every rank's RNG bytes in `rng_by_rank` (the trainer gathers them to
// rank 0 first, e.g. with a gather over the world group; they are small).
// Other ranks open the root with `read_only = true` (so they never clean up
// under a save in progress), call Load / LoadLatest on the shared filesystem
// after rank 0 has saved (a barrier), and pick their own
// `rng_by_rank[rank]`.
//
// Tensors round-trip bitwise (F32, F16, BF16, I64, I32, U8, BOOL); they are
// copied to CPU and made contiguous on save, loaded as CPU tensors.
//
// Thread-safety: a CheckpointManager is not thread-safe; one writer per root.
#ifndef SPECSTREAM_STUDENT_CHECKPOINT_H_
#define SPECSTREAM_STUDENT_CHECKPOINT_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "nlohmann/json.hpp"

namespace specstream::student {

struct CheckpointContents {
  std::map<std::string, torch::Tensor> draft;
  std::map<std::string, torch::Tensor> optimizer;
  nlohmann::json state = nlohmann::json::object();
  std::map<int, std::string> rng_by_rank;  // Keys 0..W-1 (may be empty).
};

struct CheckpointOptions {
  std::string root;  // Created if missing.
  // Complete checkpoints kept after a Save (the new one included); 0 keeps
  // all. Steps above the one just saved (left by an abandoned run) are never
  // pruned.
  int keep_last = 0;
  // Test seam: called at each crash point of Save ("tmp_written": all files
  // in the temporary directory; "renamed": step-N in place, `latest` not yet
  // updated). Returning true makes Save stop right there, as if the process
  // had died, leaving the files as they are, and return Aborted.
  std::function<bool(absl::string_view point)> crash_at;
  // Readers (ranks other than 0, evaluation) set this: Create then neither
  // creates the root nor cleans it (a writer may be mid-save), and Save is
  // refused with FailedPrecondition.
  bool read_only = false;
  // The filesystem's durability steps (atomic writes, renames, directory
  // fsyncs): null is Env::Default(); tests inject faults through it.
  Env* env = nullptr;
};

// Directory name of a step: "step-00000123" (at least 8 digits).
std::string CheckpointDirName(int64_t step);

class CheckpointManager final {
 public:
  // Creates the root if needed and cleans up what a crashed Save can leave:
  // .tmp-* directories, and step-* directories that are not complete (missing
  // or truncated files, a bad manifest; logged at warning; directories that
  // merely cannot be read now are left alone). Read-only managers skip both.
  // InvalidArgument on an empty root or negative keep_last.
  static absl::StatusOr<std::unique_ptr<CheckpointManager>> Create(CheckpointOptions options);

  // Writes step `step` (>= 0). Replaces an existing step-N of the same
  // number. InvalidArgument (nothing written) when a tensor has a dtype
  // safetensors cannot hold, `state` is not a JSON object, or rng_by_rank's
  // keys are not 0..W-1.
  absl::Status Save(int64_t step, const CheckpointContents& contents);

  // The step `latest` points at when that directory is complete; otherwise
  // (no `latest`, unreadable, or pointing at an incomplete/missing dir) the
  // newest complete step-* directory; nullopt when there is none.
  absl::StatusOr<std::optional<int64_t>> LatestStep() const;

  // Complete steps, ascending.
  absl::StatusOr<std::vector<int64_t>> ListSteps() const;

  // Loads step `step`. NotFound when the directory or a file is missing,
  // DataLoss when a file is truncated or does not parse; every error names the
  // file.
  absl::StatusOr<CheckpointContents> Load(int64_t step) const;
  // The newest checkpoint that loads: `latest`'s step first, then the
  // complete steps from the newest down. A step that fails with DataLoss (a
  // checksum mismatch, a file that does not parse) is logged and skipped; a
  // writable manager also sets it aside as <root>/corrupt-step-N (never
  // deleted). nullopt when no step is left; other errors are returned.
  struct Loaded {
    int64_t step = 0;
    CheckpointContents contents;
  };
  absl::StatusOr<std::optional<Loaded>> LoadNewest();
  // LoadNewest's contents; NotFound when there is no checkpoint.
  absl::StatusOr<CheckpointContents> LoadLatest();

  const std::string& root() const { return options_.root; }
  std::string StepDir(int64_t step) const;

 private:
  explicit CheckpointManager(CheckpointOptions options) : options_(std::move(options)) {}

  // OK when <root>/step-N is complete; otherwise why not, naming the file.
  absl::Status CheckComplete(int64_t step) const;
  absl::Status Prune(int64_t just_saved) const;
  bool CrashAt(absl::string_view point) const {
    return options_.crash_at && options_.crash_at(point);
  }

  CheckpointOptions options_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_CHECKPOINT_H_
