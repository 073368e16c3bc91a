// The "sglang" target runtime: SGLang's execution model for dense Llama /
// Qwen2 / Qwen3 / Mistral and mixture-of-experts Qwen3-MoE / Mixtral
// checkpoints in Hugging Face layout.
//
//   * Token-packed ragged batches: the sequences of one Forward call are
//     concatenated into one [total_tokens, H] stream with per-sequence
//     offsets (cu_seqlens); no padding is ever computed. Attention runs per
//     sequence segment (causal), RoPE positions restart at each sequence.
//   * Fused weights built at load time from the HF checkpoint:
//     qkv_proj = cat(q, k, v) and gate_up_proj = cat(gate, up) (per TP rank:
//     cat of the rank's shards, as SGLang's QKVParallelLinear and
//     MergedColumnParallelLinear hold them), one matmul each.
//   * Tensor parallelism as the hf runtime: column-parallel qkv/gate_up,
//     row-parallel o/down, an all-reduce after each, the leader/follower
//     protocol of TensorParallelRuntime.
//   * Sparse layers (teacher/moe.h): top-k routing, experts grouped per
//     expert, an optional sigmoid-gated shared expert; with --ep > 1 the
//     experts are spread over EP ranks within the TP group and tokens reach
//     them by all-to-all dispatch and combine (layout: teacher/model_weights.h).
//
// The captures (shared/DESIGN.md §3) equal the hf runtime's within fp32
// rounding on dense models; on MoE models EP 1, EP 2 and a per-token expert
// loop agree likewise (tests/unit/teacher/sglang_runtime_test.cc).
#ifndef SPECSTREAM_TEACHER_SGLANG_RUNTIME_H_
#define SPECSTREAM_TEACHER_SGLANG_RUNTIME_H_

#include <memory>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "common/torch/blocks.h"
#include "teacher/tp_runtime.h"

namespace specstream::teacher {

using SglangRuntimeOptions = TargetRuntimeOptions;

class SglangRuntime final : public TensorParallelRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<SglangRuntime>> Create(SglangRuntimeOptions options);
  ~SglangRuntime() override;

  const ModelDescription& Describe() const override { return description_; }
  const HfModelConfig& config() const override { return config_; }

 private:
  struct Layer;
  SglangRuntime() = default;
  absl::Status Load();
  absl::StatusOr<std::vector<SequenceCapture>> Compute(const torch::Tensor& ids,
                                                       const std::vector<int64_t>& lengths,
                                                       bool want_target_ids,
                                                       const CaptureLayerIds& capture_ids) override;
  // A sparse layer's MLP over the packed tokens x [N, H]: this rank's partial
  // sum under TP (the caller all-reduces it). Throws on a failed collective.
  torch::Tensor SparseMlp(const Layer& layer, const torch::Tensor& x);

  HfModelConfig config_;
  ModelDescription description_;
  torch::Dtype dtype_ = torch::kFloat32;
  std::vector<Layer> layers_;
  torch::Tensor embed_;    // [V, H]
  torch::Tensor norm_;     // [H]
  torch::Tensor lm_head_;  // [V, H] (the embedding when tied)
  std::optional<nn::Rotary> rotary_;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_SGLANG_RUNTIME_H_
