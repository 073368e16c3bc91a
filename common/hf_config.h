// Hugging Face model configuration (config.json) of the teacher models
// SpecStream supports, parsed into one struct, validated, and written back.
//
// Supported model_type values: llama, qwen2, qwen3, mistral, qwen3_moe,
// mixtral. Fields absent from config.json take the defaults of the matching
// transformers config class (e.g. rope_theta 1e6 for mixtral, head_dim 128 for
// qwen3), except the sizes that define the model (vocab_size, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads), which are
// required. Unknown keys are ignored, as transformers does.
//
// Model-type quirks folded into the struct:
//   * qwen2 always has q/k/v biases (attention_bias is true whatever the file
//     says); mistral and mixtral never have biases; only llama has mlp_bias.
//   * qwen2/qwen3/qwen3_moe apply sliding_window only when use_sliding_window
//     is true; `sliding_window` here is the effective value (nullopt = none).
//     llama has none: its config.json's key is ignored, as transformers
//     ignores it, and ValidateHfConfig refuses one set in code.
//   * mixtral names the expert count num_local_experts and always renormalises
//     the top-k router weights (norm_topk_prob is true).
//
// Pure functions; thread-safe.
#ifndef SPECSTREAM_COMMON_HF_CONFIG_H_
#define SPECSTREAM_COMMON_HF_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specstream {

// rope_scaling; kind kNone when null, absent or "default".
struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3, kYarn };
  Kind kind = Kind::kNone;
  double factor = 1.0;
  // llama3 (all required) and yarn (optional; transformers then uses
  // max_position_embeddings).
  std::optional<int64_t> original_max_position_embeddings;
  // llama3.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;
};

// "none", "linear", "llama3", "yarn".
absl::string_view RopeScalingKindName(RopeScaling::Kind kind);

struct HfModelConfig {
  std::string model_type;                  // One of the supported types.
  std::vector<std::string> architectures;  // e.g. {"LlamaForCausalLM"}.
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // Defaults to num_attention_heads.
  int64_t head_dim = 0;             // Defaults to hidden_size / num_attention_heads.
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v (and o for llama) projection biases.
  bool mlp_bias = false;        // llama only.
  std::string hidden_act = "silu";
  std::optional<int64_t> sliding_window;     // Effective window; nullopt: none.
  std::optional<int64_t> max_window_layers;  // qwen family, kept for round trips.
  std::string torch_dtype;                   // "bfloat16", "float16", "float32" or "".
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // Empty when null or absent.
  bool eos_token_id_is_list = false;   // Written back as a list.

  // Mixture of experts (qwen3_moe, mixtral); num_experts == 0 for dense models.
  int64_t num_experts = 0;  // num_experts / num_local_experts.
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;  // qwen3_moe (mixtral uses intermediate_size).
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;       // qwen3_moe.
  std::vector<int64_t> mlp_only_layers;  // qwen3_moe: dense layers.
  std::optional<int64_t> shared_expert_intermediate_size;
  double router_aux_loss_coef = 0.0;

  bool is_moe() const { return num_experts > 0; }
  // True when decoder layer `layer` (0-indexed) is sparse, as transformers
  // decides it for qwen3_moe (mlp_only_layers, decoder_sparse_step).
  bool IsMoeLayer(int64_t layer) const;
  // One expert's MLP size and its config field: moe_intermediate_size
  // (qwen3_moe) or intermediate_size (mixtral).
  int64_t expert_intermediate_size() const;
  const char* expert_intermediate_field() const;
};

// Checkpoint names of sparse layer `layer`'s tensors, as transformers lays
// them out: the router is `block + "gate.weight"`, expert e's matrices
// `block + "experts.<e>." + gate|up|down`.
//   qwen3_moe  block "model.layers.<i>.mlp.", gate_proj/up_proj/down_proj.weight
//   mixtral    block "model.layers.<i>.block_sparse_moe.", w1/w3/w2.weight
struct ExpertTensorNames {
  std::string block;
  const char* gate;
  const char* up;
  const char* down;
};
ExpertTensorNames MoeTensorNames(const HfModelConfig& config, int64_t layer);

// Parses and validates config.json text. Errors are InvalidArgument naming
// the field and the reason, e.g. `field "hidden_size": must be positive, got 0`
// or `unsupported model_type "gpt2" (supported: llama, ...)`; text that is not
// JSON, or whose values nest more than 64 levels deep, is refused whole.
absl::StatusOr<HfModelConfig> ParseHfConfig(absl::string_view json);

// Reads `path_or_dir` (a directory means <dir>/config.json) and parses it;
// errors are prefixed with the file's path.
absl::StatusOr<HfModelConfig> LoadHfConfig(const std::string& path_or_dir);

// A config.json that transformers loads back into the same model (keys
// sorted, two-space indent, model-type specific field names). Call on a
// config that ParseHfConfig accepted or that satisfies the same checks.
std::string HfConfigToJson(const HfModelConfig& config);

// Same checks ParseHfConfig runs after parsing (for configs built in code).
absl::Status ValidateHfConfig(const HfModelConfig& config);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_HF_CONFIG_H_
