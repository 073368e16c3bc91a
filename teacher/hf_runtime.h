// The "hf" target runtime: dense Llama / Qwen2 / Qwen3 / Mistral checkpoints
// in Hugging Face layout with HF numerics, right-padded batches, and tensor
// parallelism over c10d (column-parallel q/k/v/gate/up, row-parallel
// o/down, an all-reduce after each).
//
// Under TP every rank loads its shard; the leader/follower protocol is
// TensorParallelRuntime's (teacher/tp_runtime.h).
#ifndef SPECSTREAM_TEACHER_HF_RUNTIME_H_
#define SPECSTREAM_TEACHER_HF_RUNTIME_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/hf_config.h"
#include "common/torch/blocks.h"
#include "teacher/tp_runtime.h"

namespace specstream::teacher {

struct ModelWeights;

using HfRuntimeOptions = TargetRuntimeOptions;

class HfRuntime final : public TensorParallelRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<HfRuntime>> Create(HfRuntimeOptions options);
  ~HfRuntime() override;

  const ModelDescription& Describe() const override { return description_; }
  const HfModelConfig& config() const override { return config_; }

  // HF's output_hidden_states for one sequence (no TP broadcast; every rank
  // must call it together under TP): [0] = embeddings, [i+1] = output of
  // layer i, each [T, H]. For checking capture wiring.
  absl::StatusOr<std::vector<torch::Tensor>> HiddenStates(const std::vector<int32_t>& ids);

 private:
  HfRuntime() = default;
  absl::Status Load();
  // Right-pads the packed sequences (id 0) and runs ComputePadded.
  absl::StatusOr<std::vector<SequenceCapture>> Compute(
      const torch::Tensor& ids, const std::vector<int64_t>& lengths, bool want_target_ids,
      const std::vector<int>& capture_ids) override;
  // ids [B, T] int64 right-padded, on device_; causal attention keeps the
  // padding out of every real position.
  absl::StatusOr<std::vector<SequenceCapture>> ComputePadded(
      const torch::Tensor& ids, const std::vector<int64_t>& lengths, bool want_target_ids,
      const std::vector<int>& capture_ids, std::vector<torch::Tensor>* all_hidden);

  HfModelConfig config_;
  ModelDescription description_;
  torch::Dtype dtype_ = torch::kFloat32;
  std::unique_ptr<ModelWeights> weights_;
  std::optional<nn::Rotary> rotary_;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_HF_RUNTIME_H_
