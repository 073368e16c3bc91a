// Loading of dense Llama / Qwen2 / Qwen3 / Mistral checkpoints (Hugging Face
// layout) for the target runtimes, sliced for one TP rank, and the checks and
// helpers both runtimes share (dtype, capture ids, request validation, the
// chunked full-vocab argmax). Internal to specstream_teacher.
#ifndef SPECSTREAM_TEACHER_DENSE_WEIGHTS_H_
#define SPECSTREAM_TEACHER_DENSE_WEIGHTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/hf_config.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {

// One decoder layer's weights, already sliced to this TP rank.
struct DenseLayerWeights {
  torch::Tensor input_norm, post_norm;
  torch::Tensor q, k, v, o;                     // q/k/v column shards, o row shard
  torch::Tensor q_bias, k_bias, v_bias;         // qwen2 (and llama attention_bias)
  torch::Tensor o_bias;                         // llama attention_bias (added once, after reduce)
  torch::Tensor q_norm, k_norm;                 // qwen3, over head_dim
  torch::Tensor gate, up, down;                 // gate/up column shards, down row shard
  torch::Tensor gate_bias, up_bias, down_bias;  // llama mlp_bias
  std::optional<int64_t> sliding_window;
};

struct DenseModelWeights {
  torch::Tensor embed;    // [V, H]
  torch::Tensor norm;     // [H]
  torch::Tensor lm_head;  // [V, H] (the embedding when tied)
  std::vector<DenseLayerWeights> layers;
};

bool IsDenseModelType(const std::string& model_type);

// "auto" | "float32" | "bfloat16" → compute dtype (float16 computes in
// float32 on CPU).
absl::StatusOr<torch::Dtype> ResolveComputeDtype(const std::string& requested,
                                                 const HfModelConfig& config);

// The requested ids, or {1, L/2-1, L-4} when empty; each must name a layer.
absl::StatusOr<std::vector<int>> ResolveCaptureLayers(const std::vector<int>& requested,
                                                      const HfModelConfig& config);

// InvalidArgument unless heads, kv heads and intermediate size divide by
// tp_size and the rank is in range.
absl::Status CheckTensorParallelLayout(const HfModelConfig& config, int tp_rank, int tp_size);

struct TargetRuntimeOptions;

// What both dense runtimes load the same way: the config (a dense family),
// the tensor-parallel layout check, dtype, capture layers, the rank's weights
// and the description (runtime = `runtime_name`). Errors name the runtime.
struct LoadedDenseModel {
  HfModelConfig config;
  DenseModelWeights weights;
  ModelDescription description;
};
absl::StatusOr<LoadedDenseModel> LoadDenseModel(const TargetRuntimeOptions& options,
                                                const std::string& runtime_name);

// Reads every dense tensor, checking shapes against the config and slicing
// for the rank; warns about checkpoint tensors left unused.
absl::StatusOr<DenseModelWeights> LoadDenseWeights(const std::string& model_dir,
                                                   const HfModelConfig& config, torch::Dtype dtype,
                                                   int tp_rank, int tp_size);

// InvalidArgument for no sequences, an empty one, one over
// max_position_embeddings or an id outside the vocab.
absl::Status ValidateForwardRequest(const ForwardRequest& request, const HfModelConfig& config);

// Argmax of last_hidden · lm_headᵀ over the full vocab, in row chunks (never
// T × V logits at once). int32 [T].
torch::Tensor FullVocabArgmax(const torch::Tensor& last_hidden, const torch::Tensor& lm_head);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_DENSE_WEIGHTS_H_
