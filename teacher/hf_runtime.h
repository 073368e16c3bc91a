// The "hf" target runtime: dense Llama / Qwen2 / Qwen3 / Mistral checkpoints
// in Hugging Face layout with HF numerics, right-padded batches, and tensor
// parallelism over c10d (column-parallel q/k/v/gate/up, row-parallel
// o/down, an all-reduce after each).
//
// Under TP every rank loads its shard. Rank 0 is the leader: its Forward()
// broadcasts the request to the other ranks, which sit in RunFollower()
// until the leader calls StopFollowers(). With tp_size 1 there are no
// followers and no process group is needed.
#ifndef SPECSTREAM_TEACHER_HF_RUNTIME_H_
#define SPECSTREAM_TEACHER_HF_RUNTIME_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/statusor.h"
#include "common/hf_config.h"
#include "common/torch/blocks.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {

struct HfRuntimeOptions {
  std::string model_dir;
  // "auto" (config's torch_dtype; float16 computes in float32 on CPU),
  // "float32" or "bfloat16".
  std::string dtype = "auto";
  std::vector<int> capture_layer_ids;  // empty: {1, L/2-1, L-4}
  int tp_rank = 0;
  int tp_size = 1;
  // Required when tp_size > 1, before Forward/RunFollower; may be attached
  // after Create (AttachGroup) so that loading errors surface first.
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  // Bound on attention score elements held at once (blockwise attention).
  int64_t max_score_elements = int64_t{1} << 22;
};

class HfRuntime final : public TargetRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<HfRuntime>> Create(HfRuntimeOptions options);
  ~HfRuntime() override;

  const ModelDescription& Describe() const override { return description_; }
  absl::StatusOr<std::vector<SequenceCapture>> Forward(const ForwardRequest& request) override;

  void AttachGroup(c10::intrusive_ptr<c10d::ProcessGroup> group) {
    options_.group = std::move(group);
  }

  // Followers (tp_rank > 0): serve the leader's broadcasts until stopped.
  absl::Status RunFollower();
  // Leader: releases the followers.
  absl::Status StopFollowers();

  // HF's output_hidden_states for one sequence (no TP broadcast; every rank
  // must call it together under TP): [0] = embeddings, [i+1] = output of
  // layer i, each [T, H]. For checking capture wiring.
  absl::StatusOr<std::vector<torch::Tensor>> HiddenStates(const std::vector<int32_t>& ids);

  const HfModelConfig& config() const { return config_; }

 private:
  struct Layer;
  HfRuntime() = default;
  absl::Status Load();
  absl::Status Validate(const ForwardRequest& request) const;
  // The computation every rank runs. ids [B, T] int64 right-padded.
  absl::StatusOr<std::vector<SequenceCapture>> Compute(const torch::Tensor& ids,
                                                       const std::vector<int64_t>& lengths,
                                                       bool want_target_ids,
                                                       std::vector<torch::Tensor>* all_hidden);

  HfRuntimeOptions options_;
  HfModelConfig config_;
  ModelDescription description_;
  torch::Dtype dtype_ = torch::kFloat32;
  std::vector<Layer> layers_;
  torch::Tensor embed_;    // [V, H]
  torch::Tensor norm_;     // [H]
  torch::Tensor lm_head_;  // [V, H] (the embedding when tied)
  std::optional<nn::Rotary> rotary_;
  bool followers_stopped_ = false;
  bool group_broken_ = false;  // a collective failed mid-forward
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_HF_RUNTIME_H_
