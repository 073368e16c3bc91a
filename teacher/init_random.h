// `specstream-teacher init-random`: a randomly initialised dense or MoE teacher
// checkpoint in Hugging Face layout, for tests and demos that need a target
// model but cannot download one. The weights are a deterministic function of
// the options (same seed, same bytes, on every platform); the init is chosen
// so that the model's next-token argmax depends on its input (see
// init_random.cc), so a draft trained against it has something to learn.
//
// Output directory:
//   config.json                          via HfConfigToJson (common/hf_config.h)
//   model.safetensors                    when shards == 1, or
//   model-0000i-of-0000S.safetensors     S shards, tensors in layer order,
//   model.safetensors.index.json         {"metadata": {"total_size"}, "weight_map"}
// Tensor names and shapes follow transformers' LlamaForCausalLM family (see
// WriteRandomCheckpoint). Files are written atomically; an existing
// checkpoint of the other layout (single vs sharded) in `out` is removed so
// that loaders see one.
//
// Pure functions of their arguments; thread-safe. No LibTorch.
#ifndef SPECSTREAM_TEACHER_INIT_RANDOM_H_
#define SPECSTREAM_TEACHER_INIT_RANDOM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/hf_config.h"

namespace specstream::teacher {

// One field per CLI flag; errors name the flag.
struct InitRandomOptions {
  std::string arch;                // --arch: llama, qwen2, qwen3, mistral, qwen3_moe or mixtral.
  int64_t layers = 0;              // --layers: decoder layers.
  int64_t hidden = 0;              // --hidden: hidden size H.
  int64_t heads = 0;               // --heads: attention heads A.
  int64_t kv_heads = 0;            // --kv-heads: key/value heads B (divides A).
  int64_t intermediate = 0;        // --intermediate: MLP size I.
  int64_t vocab = 0;               // --vocab: vocabulary size V.
  int64_t shards = 1;              // --shards: safetensors files (1: model.safetensors).
  uint64_t seed = 0;               // --seed.
  std::string dtype = "bfloat16";  // --dtype: float32 or bfloat16.
  bool tie_embeddings = false;     // --tie-embeddings: no lm_head.weight.
  int64_t head_dim = 0;            // --head-dim D; 0: hidden / heads (must divide).
  int64_t max_position = 4096;     // --max-position: max_position_embeddings.
  double rope_theta = 10000.0;     // --rope-theta.
  std::string out;                 // --out: output directory (created if needed).
  // Mixture of experts (qwen3_moe, mixtral only; 0 for dense archs).
  int64_t experts = 0;                     // --experts E.
  int64_t top_k = 0;                       // --top-k K (1 <= K <= E).
  int64_t shared_expert_intermediate = 0;  // --shared-expert-intermediate (qwen3_moe; 0: none).
  std::vector<int64_t> mlp_only_layers;    // --mlp-only-layers (qwen3_moe): dense layers.
};

// The config.json the checkpoint gets: model_type = arch, architectures
// {Llama,Qwen2,Qwen3,Mistral,Qwen3Moe,Mixtral}ForCausalLM, the given sizes,
// torch_dtype = dtype, no sliding window, no rope scaling. MoE archs: every
// layer sparse but qwen3_moe's --mlp-only-layers (dense MLPs of
// --intermediate), E experts of --intermediate each, top-K renormalised
// (norm_topk_prob true). InvalidArgument naming the flag
// (e.g. `--kv-heads: 3 does not divide --heads 8`) for a bad option; `out`
// and `shards` are not looked at.
absl::StatusOr<HfModelConfig> MakeRandomConfig(const InitRandomOptions& options);

// Validates `options` (all flags, `out` and `shards` included: 1 <= shards <=
// number of tensors) and writes the checkpoint. Tensors, per layer i:
//   model.layers.i.self_attn.{q_proj [A*D,H], k_proj [B*D,H], v_proj [B*D,H],
//     o_proj [H,A*D]}.weight; qwen2: {q,k,v}_proj.bias; qwen3 and
//     qwen3_moe: self_attn.{q_norm,k_norm}.weight [D];
//   model.layers.i.mlp.{gate_proj [I,H], up_proj [I,H], down_proj [H,I]}.weight
//     (dense archs); qwen3_moe: mlp.gate.weight [E,H] and
//     mlp.experts.e.{gate_proj,up_proj,down_proj}.weight, plus with a shared
//     expert mlp.shared_expert.{gate,up,down}_proj.weight and
//     mlp.shared_expert_gate.weight [1,H]; mixtral: block_sparse_moe.gate.weight
//     [E,H] and block_sparse_moe.experts.e.{w1 (gate), w3 (up) [I,H], w2 (down)
//     [H,I]}.weight;
//   model.layers.i.{input_layernorm,post_attention_layernorm}.weight [H];
// plus model.embed_tokens.weight [V,H], model.norm.weight [H] and, unless
// tied, lm_head.weight [V,H]. Each tensor's values depend only on the seed
// and its name, so the shard count does not change them.
absl::Status WriteRandomCheckpoint(const InitRandomOptions& options);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_INIT_RANDOM_H_
