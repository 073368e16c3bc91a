// A training run's state across restarts: the checkpoint every rank takes
// part in (the draft, the optimizer, every rank's RNG and the run's
// description, written by rank 0: student/checkpoint.h) and the checks that
// make a resume exact (same world and CP layout, same data plan, same vocab
// map and draft shape, every rank on the same step).
//
// Thread-safety: one thread (the trainer's); Save and Resume are collective
// over the group: every rank calls them together.
#ifndef SPECSTREAM_STUDENT_TRAIN_STATE_H_
#define SPECSTREAM_STUDENT_TRAIN_STATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/torch/compat.h"
#include "nlohmann/json.hpp"
#include "student/draft_model.h"
#include "student/optimizer.h"

namespace specstream::student {

// What a checkpoint says about the run that wrote it.
struct TrainRun {
  std::string checkpoint_dir;
  int64_t keep_last = 0;
  int rank = 0;
  int world_size = 1;
  int64_t cp_size = 1;
  int64_t ulysses_degree = 1;
  uint64_t seed = 0;
  int ttt_steps = 1;
  std::string target_dir;
  std::string store;
  CaptureLayerIds capture_layer_ids;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  LrSchedule schedule;
};

// What a checkpoint records of a draft besides its trainable tensors.
struct DraftRecord {
  // Saved with the draft's tensors; a resume needs them equal (EAGLE-3's
  // vocab map, d2t and t2d).
  std::map<std::string, torch::Tensor> fixed;
  // Merged into state.json: "draft_type", "draft_shape" and the type's
  // own options (student/draft.h TrainableDraft::Record).
  nlohmann::json state = nlohmann::json::object();
  // The keys of `state` a resume needs equal (the type and its options).
  std::vector<std::string> resume_keys;
};

class TrainState final {
 public:
  using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;
  // `params` (the draft's trainable tensors), `optimizer` and `group` (the
  // world's control group; null for one rank) outlive this.
  TrainState(TrainRun run, const NamedParams& params, DraftRecord record, AdamW& optimizer,
             c10::intrusive_ptr<CommGroup> group)
      : run_(std::move(run)),
        params_(params),
        record_(std::move(record)),
        optimizer_(optimizer),
        group_(std::move(group)) {}

  // The checkpoint of completed step `step`: every rank's RNG state goes to
  // rank 0, which writes it; no rank returns before it is written.
  absl::Status Save(int64_t step);
  // Loads the latest checkpoint into the draft, optimizer and this rank's
  // RNG and returns its step (0, with nothing loaded, when there is none).
  // FailedPrecondition naming what differs when it cannot continue exactly.
  absl::StatusOr<int64_t> Resume();

 private:
  TrainRun run_;
  const NamedParams& params_;
  DraftRecord record_;
  AdamW& optimizer_;
  c10::intrusive_ptr<CommGroup> group_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_TRAIN_STATE_H_
