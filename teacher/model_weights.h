// Loading of target checkpoints in Hugging Face layout for the target
// runtimes, sliced for one rank: dense Llama / Qwen2 / Qwen3 / Mistral (both
// runtimes) and the mixture-of-experts Qwen3-MoE / Mixtral (sglang runtime
// only), plus the checks and helpers the runtimes share (parallel layout,
// dtype, capture ids, request validation, the chunked full-vocab argmax).
// Internal to specstream_teacher.
//
// Parallel layout (SGLang's rules): the TP group of `tp_size` ranks shards
// attention and dense MLPs; expert parallelism runs within it. With `ep_size`
// EP ranks (ep_size divides tp_size), rank r belongs to EP rank
// r / (tp_size / ep_size), which owns experts [ep_rank * E / ep_size, ...) in
// full but for their intermediate dimension, sliced over the
// tp_size / ep_size ranks that share the EP rank (r % (tp_size / ep_size)).
#ifndef SPECSTREAM_TEACHER_MODEL_WEIGHTS_H_
#define SPECSTREAM_TEACHER_MODEL_WEIGHTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {

// A sparse layer's mixture of experts as this rank holds it.
struct MoeLayerWeights {
  torch::Tensor router;  // [E, H], every rank in full
  // The experts this rank's EP rank owns, in order, each sliced along its
  // intermediate dimension: gate/up [I', H], down [H, I'].
  std::vector<torch::Tensor> gate, up, down;
  int64_t first_expert = 0;  // global id of gate[0]
  // Shared expert (qwen3_moe with shared_expert_intermediate_size), sliced
  // over the whole TP group like a dense MLP; undefined when absent.
  torch::Tensor shared_gate, shared_up, shared_down;
  torch::Tensor shared_expert_gate;  // [1, H]: sigmoid gate on the shared expert
};

// One decoder layer's weights, already sliced to this rank.
struct LayerWeights {
  torch::Tensor input_norm, post_norm;
  torch::Tensor q, k, v, o;                     // q/k/v column shards, o row shard
  torch::Tensor q_bias, k_bias, v_bias;         // qwen2 (and llama attention_bias)
  torch::Tensor o_bias;                         // llama attention_bias (added once, after reduce)
  torch::Tensor q_norm, k_norm;                 // qwen3, over head_dim
  torch::Tensor gate, up, down;                 // dense MLP: gate/up column, down row shards
  torch::Tensor gate_bias, up_bias, down_bias;  // llama mlp_bias
  std::optional<MoeLayerWeights> moe;           // sparse layers (instead of gate/up/down)
  std::optional<int64_t> sliding_window;
};

struct ModelWeights {
  torch::Tensor embed;    // [V, H]
  torch::Tensor norm;     // [H]
  torch::Tensor lm_head;  // [V, H] (the embedding when tied)
  std::vector<LayerWeights> layers;
};

bool IsDenseModelType(const std::string& model_type);

// Where one rank sits in the tensor- and expert-parallel layout.
struct ParallelLayout {
  int tp_rank = 0;
  int tp_size = 1;
  int ep_size = 1;
  int moe_tp_size() const { return tp_size / ep_size; }
  int ep_rank() const { return tp_rank / moe_tp_size(); }
  int moe_tp_rank() const { return tp_rank % moe_tp_size(); }
};

// "auto" | "float32" | "bfloat16" → compute dtype (float16 computes in
// float32 on CPU).
absl::StatusOr<torch::Dtype> ResolveComputeDtype(const std::string& requested,
                                                 const HfModelConfig& config);

// The requested ids, or {1, L/2-1, L-4} when empty; each must name a layer.
absl::StatusOr<CaptureLayerIds> ResolveCaptureLayers(const CaptureLayerIds& requested,
                                                     const HfModelConfig& config);

// InvalidArgument naming --ep unless 1 <= ep_size and ep_size divides
// tp_size (the part of CheckParallelLayout that needs no config.json).
absl::Status CheckExpertParallelSize(int ep_size, int tp_size);

// InvalidArgument, naming the flag or config field, unless the layout can
// serve the model: heads, kv heads and dense intermediate sizes divide by
// tp_size; ep_size is 1 for dense models and otherwise divides tp_size and
// the expert count, with the expert intermediate size divisible by
// tp_size / ep_size; the rank is in range. Runs on config.json alone, before
// any weight is read.
absl::Status CheckParallelLayout(const HfModelConfig& config, const ParallelLayout& layout);

struct TargetRuntimeOptions;

// InvalidArgument unless the runtime serves the model's family (dense
// always, MoE when `allow_moe`) in `layout` (CheckParallelLayout).
absl::Status CheckRuntimeServes(const HfModelConfig& config, const std::string& runtime_name,
                                bool allow_moe, const ParallelLayout& layout);

// What the runtimes load the same way: the config (a dense family, or a MoE
// one when `allow_moe`), the parallel layout check, dtype, capture layers,
// the rank's weights and the description (runtime = `runtime_name`). Errors
// name the runtime.
struct LoadedModel {
  HfModelConfig config;
  ModelWeights weights;
  ModelDescription description;
  torch::Device device = torch::kCPU;  // options.device, where the weights are
};
absl::StatusOr<LoadedModel> LoadTargetModel(const TargetRuntimeOptions& options,
                                            const std::string& runtime_name, bool allow_moe);

// Reads every tensor the rank needs, checking shapes against the config and
// slicing for the rank (other EP ranks' experts are shape-checked, not read);
// warns about checkpoint tensors left unused. Each tensor is copied once,
// from the mapped file straight to `device`, so the host never holds the
// model.
absl::StatusOr<ModelWeights> LoadTargetWeights(const std::string& model_dir,
                                               const HfModelConfig& config, torch::Dtype dtype,
                                               const ParallelLayout& layout,
                                               torch::Device device = torch::kCPU);

// InvalidArgument for no sequences, an empty one, one over
// max_position_embeddings, an id outside the vocab or a capture layer
// outside [0, num_hidden_layers).
absl::Status ValidateForwardRequest(const ForwardRequest& request, const HfModelConfig& config);

// Argmax of last_hidden · lm_headᵀ over the full vocab, in row chunks whose
// logits stay under 256 MiB (never T × V logits at once for a long sequence
// or a large vocab; one GEMM when they fit). int32 [T], on last_hidden's
// device.
torch::Tensor FullVocabArgmax(const torch::Tensor& last_hidden, const torch::Tensor& lm_head);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_MODEL_WEIGHTS_H_
