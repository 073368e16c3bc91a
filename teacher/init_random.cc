#include "teacher/init_random.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specstream::teacher {
namespace {

// Why this init. With the usual N(0, 0.02) everywhere, the embedding is tiny
// and every attention branch adds a near-uniform average of the values of all
// earlier positions; that common component grows layer by layer until it
// dominates the residual stream, and the final argmax collapses to a handful
// of tokens whatever the input. Instead:
//   * embed_tokens has unit scale, so a token's own embedding (norm ~sqrt(H))
//     dominates the residual stream and different tokens lead to different
//     argmaxes (lm_head ~ 1/sqrt(H) makes the logits O(1));
//   * q/k/v/gate/up have scale 1/sqrt(fan_in): after RMSNorm their outputs are
//     O(1), so attention scores are O(1) and attention really mixes context;
//   * o_proj/down_proj have scale 0.5/sqrt(fan_in * 2L): each of the 2L
//     residual branches adds O(0.5/sqrt(2L)) per dimension, together about
//     half the embedding's scale, enough to move the argmax with the context
//     but not to wash out the token;
//   * RMSNorm weights (q_norm/k_norm included) are 1, qwen2 biases small.
// Values are uniform in [-sqrt(3) s, sqrt(3) s] (standard deviation s), like
// PyTorch's own Linear init; uniform needs no libm transcendental, so the
// bytes are the same on every IEEE-754 platform.
enum class InitKind { kUniform, kOnes };

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  InitKind kind = InitKind::kUniform;
  double stddev = 0.0;
};

constexpr const char* kArchs[][2] = {
    {"llama", "LlamaForCausalLM"},        {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},        {"mistral", "MistralForCausalLM"},
    {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"mixtral", "MixtralForCausalLM"},
};

// Beyond this a single tensor is surely a typo (2^40 elements = 4 TiB f32).
constexpr uint64_t kMaxTensorElements = uint64_t{1} << 40;

absl::Status FlagError(absl::string_view flag, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", reason));
}

absl::Status Positive(absl::string_view flag, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return FlagError(flag, absl::StrCat("must be positive, got ", value));
}

// SplitMix64 (Steele, Lea, Flood 2014): tiny, portable, and good enough for
// weights. One stream per tensor, seeded from the seed and the tensor's name.
class SplitMix64 final {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits; exact in double arithmetic.
  double NextUnit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

uint64_t Fnv1a64(absl::string_view text) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001B3ull;
  }
  return hash;
}

uint64_t TensorSeed(uint64_t seed, absl::string_view name) {
  SplitMix64 mix(seed ^ Fnv1a64(name));
  return mix.Next();
}

// Round to nearest even; NaN stays a (quiet) NaN.
uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// The tensor's bytes, little-endian as safetensors requires.
std::string GenerateTensor(const TensorPlan& plan, uint64_t elements, DType dtype, uint64_t seed) {
  const size_t width = DTypeSize(dtype);
  std::string bytes(elements * width, '\0');
  SplitMix64 rng(TensorSeed(seed, plan.name));
  const double half_width = std::sqrt(3.0) * plan.stddev;
  for (uint64_t i = 0; i < elements; ++i) {
    const float value = plan.kind == InitKind::kOnes
                            ? 1.0f
                            : static_cast<float>((2.0 * rng.NextUnit() - 1.0) * half_width);
    uint32_t bits;
    if (dtype == DType::kBF16) {
      bits = FloatToBf16(value);
    } else {
      std::memcpy(&bits, &value, sizeof(bits));
    }
    for (size_t b = 0; b < width; ++b) {
      bytes[i * width + b] = static_cast<char>((bits >> (8 * b)) & 0xFF);
    }
  }
  return bytes;
}

// Every tensor of the checkpoint in layer order (the order shards split).
std::vector<TensorPlan> PlanTensors(const HfModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  const int64_t inter = c.intermediate_size;
  const double branches = 2.0 * static_cast<double>(c.num_hidden_layers);
  auto in_scale = [](int64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); };
  auto out_scale = [branches](int64_t fan_in) {
    return 0.5 / std::sqrt(static_cast<double>(fan_in) * branches);
  };
  constexpr double kBiasStd = 0.02;

  std::vector<TensorPlan> plans;
  auto uniform = [&plans](std::string name, std::vector<int64_t> shape, double stddev) {
    plans.push_back({std::move(name), std::move(shape), InitKind::kUniform, stddev});
  };
  auto ones = [&plans](std::string name, std::vector<int64_t> shape) {
    plans.push_back({std::move(name), std::move(shape), InitKind::kOnes, 0.0});
  };
  const bool qkv_bias = c.attention_bias;  // qwen2 (always), never for the others here.
  uniform("model.embed_tokens.weight", {c.vocab_size, h}, 1.0);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string attn = absl::StrCat("model.layers.", i, ".self_attn.");
    const std::string mlp = absl::StrCat("model.layers.", i, ".mlp.");
    uniform(attn + "q_proj.weight", {q_width, h}, in_scale(h));
    if (qkv_bias) uniform(attn + "q_proj.bias", {q_width}, kBiasStd);
    uniform(attn + "k_proj.weight", {kv_width, h}, in_scale(h));
    if (qkv_bias) uniform(attn + "k_proj.bias", {kv_width}, kBiasStd);
    uniform(attn + "v_proj.weight", {kv_width, h}, in_scale(h));
    if (qkv_bias) uniform(attn + "v_proj.bias", {kv_width}, kBiasStd);
    uniform(attn + "o_proj.weight", {h, q_width}, out_scale(q_width));
    if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
      ones(attn + "q_norm.weight", {c.head_dim});
      ones(attn + "k_norm.weight", {c.head_dim});
    }
    if (c.IsMoeLayer(i)) {
      // The router's logits are O(1), so tokens spread over the experts; the
      // renormalised top-k mix keeps the branch at one MLP's scale.
      const ExpertTensorNames names = MoeTensorNames(c, i);
      const int64_t expert_inter = c.expert_intermediate_size();
      uniform(names.block + "gate.weight", {c.num_experts, h}, in_scale(h));
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string expert = absl::StrCat(names.block, "experts.", e, ".");
        uniform(expert + names.gate, {expert_inter, h}, in_scale(h));
        uniform(expert + names.up, {expert_inter, h}, in_scale(h));
        uniform(expert + names.down, {h, expert_inter}, out_scale(expert_inter));
      }
      if (c.shared_expert_intermediate_size) {
        const int64_t shared = *c.shared_expert_intermediate_size;
        uniform(mlp + "shared_expert.gate_proj.weight", {shared, h}, in_scale(h));
        uniform(mlp + "shared_expert.up_proj.weight", {shared, h}, in_scale(h));
        uniform(mlp + "shared_expert.down_proj.weight", {h, shared}, out_scale(shared));
        uniform(mlp + "shared_expert_gate.weight", {1, h}, in_scale(h));
      }
    } else {
      uniform(mlp + "gate_proj.weight", {inter, h}, in_scale(h));
      uniform(mlp + "up_proj.weight", {inter, h}, in_scale(h));
      uniform(mlp + "down_proj.weight", {h, inter}, out_scale(inter));
    }
    ones(absl::StrCat("model.layers.", i, ".input_layernorm.weight"), {h});
    ones(absl::StrCat("model.layers.", i, ".post_attention_layernorm.weight"), {h});
  }
  ones("model.norm.weight", {h});
  if (!c.tie_word_embeddings) uniform("lm_head.weight", {c.vocab_size, h}, in_scale(h));
  return plans;
}

// Shard of each tensor: consecutive runs of roughly total/S bytes, every
// shard non-empty (the caller guarantees S <= number of tensors).
std::vector<int64_t> AssignShards(const std::vector<uint64_t>& sizes, int64_t num_shards) {
  uint64_t total = 0;
  for (uint64_t size : sizes) total += size;
  const int64_t n = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> shard_of(sizes.size());
  int64_t shard = 0;
  int64_t in_shard = 0;
  uint64_t before = 0;  // Bytes of the tensors already placed.
  for (int64_t i = 0; i < n; ++i) {
    const bool share_reached =
        static_cast<long double>(before) >=
        static_cast<long double>(total) * static_cast<long double>(shard + 1) / num_shards;
    const bool must_leave_one_each = n - i == num_shards - 1 - shard;
    if (shard < num_shards - 1 && in_shard > 0 && (share_reached || must_leave_one_each)) {
      ++shard;
      in_shard = 0;
    }
    shard_of[i] = shard;
    ++in_shard;
    before += sizes[i];
  }
  return shard_of;
}

absl::Status RemoveIfPresent(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfModelConfig> MakeRandomConfig(const InitRandomOptions& options) {
  const char* architecture = nullptr;
  for (const auto& arch : kArchs) {
    if (options.arch == arch[0]) architecture = arch[1];
  }
  if (architecture == nullptr) {
    return FlagError(
        "arch", absl::StrCat("unknown architecture \"", options.arch,
                             "\" (expected llama, qwen2, qwen3, mistral, qwen3_moe or mixtral)"));
  }
  const bool moe = options.arch == "qwen3_moe" || options.arch == "mixtral";
  if (moe) {
    RETURN_IF_ERROR(Positive("experts", options.experts));
    RETURN_IF_ERROR(Positive("top-k", options.top_k));
    if (options.top_k > options.experts) {
      return FlagError("top-k",
                       absl::StrCat(options.top_k, " exceeds --experts ", options.experts));
    }
  } else if (options.experts != 0 || options.top_k != 0) {
    return FlagError(options.experts != 0 ? "experts" : "top-k",
                     absl::StrCat("only mixture-of-experts architectures (qwen3_moe, mixtral) "
                                  "have experts; --arch is ",
                                  options.arch));
  }
  if (!options.mlp_only_layers.empty() && options.arch != "qwen3_moe") {
    return FlagError("mlp-only-layers", absl::StrCat("only qwen3_moe has dense layers among "
                                                     "sparse ones; --arch is ",
                                                     options.arch));
  }
  for (int64_t layer : options.mlp_only_layers) {
    if (layer < 0 || layer >= options.layers) {
      return FlagError("mlp-only-layers", absl::StrCat("layer ", layer, " is outside [0, --layers ",
                                                       options.layers, ")"));
    }
  }
  if (options.shared_expert_intermediate < 0 ||
      (options.shared_expert_intermediate > 0 && options.arch != "qwen3_moe")) {
    return FlagError(
        "shared-expert-intermediate",
        options.shared_expert_intermediate < 0
            ? absl::StrCat("must be positive, got ", options.shared_expert_intermediate)
            : absl::StrCat("only qwen3_moe checkpoints here carry a shared expert; "
                           "--arch is ",
                           options.arch));
  }
  RETURN_IF_ERROR(Positive("layers", options.layers));
  RETURN_IF_ERROR(Positive("hidden", options.hidden));
  RETURN_IF_ERROR(Positive("heads", options.heads));
  RETURN_IF_ERROR(Positive("kv-heads", options.kv_heads));
  RETURN_IF_ERROR(Positive("intermediate", options.intermediate));
  RETURN_IF_ERROR(Positive("vocab", options.vocab));
  if (options.head_dim < 0) {
    return FlagError("head-dim", absl::StrCat("must be positive (or 0: hidden / heads), got ",
                                              options.head_dim));
  }
  if (options.head_dim == 0 && options.hidden % options.heads != 0) {
    return FlagError("heads", absl::StrCat(options.heads, " does not divide --hidden ",
                                           options.hidden, "; pass --head-dim"));
  }
  if (options.heads % options.kv_heads != 0) {
    return FlagError("kv-heads",
                     absl::StrCat(options.kv_heads, " does not divide --heads ", options.heads));
  }
  if (options.dtype != "float32" && options.dtype != "bfloat16") {
    return FlagError("dtype", absl::StrCat("unsupported \"", options.dtype,
                                           "\" (expected float32 or bfloat16)"));
  }
  RETURN_IF_ERROR(Positive("max-position", options.max_position));
  if (!(options.rope_theta > 0) || !std::isfinite(options.rope_theta)) {
    return FlagError("rope-theta", absl::StrCat("must be positive, got ", options.rope_theta));
  }

  HfModelConfig c;
  c.model_type = options.arch;
  c.architectures = {architecture};
  c.vocab_size = options.vocab;
  c.hidden_size = options.hidden;
  c.intermediate_size = options.intermediate;
  c.num_hidden_layers = options.layers;
  c.num_attention_heads = options.heads;
  c.num_key_value_heads = options.kv_heads;
  c.head_dim = options.head_dim > 0 ? options.head_dim : options.hidden / options.heads;
  c.max_position_embeddings = options.max_position;
  c.rope_theta = options.rope_theta;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = options.tie_embeddings;
  c.attention_bias = options.arch == "qwen2";
  c.hidden_act = "silu";
  c.sliding_window.reset();
  if (options.arch == "qwen2" || options.arch == "qwen3" || options.arch == "qwen3_moe") {
    c.max_window_layers = options.layers;
  }
  if (moe) {
    c.num_experts = options.experts;
    c.num_experts_per_tok = options.top_k;
    c.norm_topk_prob = true;  // as released Qwen3-MoE checkpoints; mixtral always does
    if (options.arch == "qwen3_moe") {
      c.moe_intermediate_size = options.intermediate;
      c.router_aux_loss_coef = 0.001;
      if (options.shared_expert_intermediate > 0) {
        c.shared_expert_intermediate_size = options.shared_expert_intermediate;
      }
      c.mlp_only_layers = options.mlp_only_layers;
    } else {
      c.router_aux_loss_coef = 0.02;
    }
  }
  c.torch_dtype = options.dtype;

  // Sizes that overflow or could never be allocated, named by flag.
  if (c.head_dim > std::numeric_limits<int64_t>::max() / c.num_attention_heads) {
    return FlagError("head-dim", "times --heads overflows");
  }
  const std::tuple<const char*, int64_t, int64_t> matrices[] = {
      {"vocab", c.vocab_size, c.hidden_size},
      {"intermediate", c.intermediate_size, c.hidden_size},
      {"head-dim", c.num_attention_heads * c.head_dim, c.hidden_size}};
  for (const auto& [flag, rows, cols] : matrices) {
    absl::StatusOr<uint64_t> elements = NumElements({rows, cols});
    if (!elements.ok() || *elements > kMaxTensorElements) {
      return FlagError(flag,
                       absl::StrCat("makes a ", rows, " x ", cols, " weight matrix, too large"));
    }
  }

  absl::Status valid = ValidateHfConfig(c);
  if (!valid.ok()) return Annotate(valid, "generated config.json");
  return c;
}

absl::Status WriteRandomCheckpoint(const InitRandomOptions& options) {
  ASSIGN_OR_RETURN(HfModelConfig config, MakeRandomConfig(options));
  if (options.out.empty()) return FlagError("out", "required");
  const std::vector<TensorPlan> plans = PlanTensors(config);
  const int64_t num_tensors = static_cast<int64_t>(plans.size());
  if (options.shards < 1 || options.shards > num_tensors) {
    return FlagError("shards", absl::StrCat("must be between 1 and ", num_tensors,
                                            " (the number of tensors), got ", options.shards));
  }
  const DType dtype = options.dtype == "float32" ? DType::kF32 : DType::kBF16;

  std::vector<uint64_t> elements;
  std::vector<uint64_t> sizes;
  for (const TensorPlan& plan : plans) {
    ASSIGN_OR_RETURN(uint64_t n, NumElements(plan.shape));
    elements.push_back(n);
    sizes.push_back(n * DTypeSize(dtype));
  }

  std::error_code ec;
  std::filesystem::create_directories(options.out, ec);
  if (ec) {
    return FlagError("out", absl::StrCat("cannot create ", options.out, ": ", ec.message()));
  }
  const std::string dir = options.out;
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", HfConfigToJson(config)));

  const std::vector<int64_t> shard_of = AssignShards(sizes, options.shards);
  std::vector<std::string> files;
  for (int64_t s = 0; s < options.shards; ++s) {
    files.push_back(options.shards == 1
                        ? std::string("model.safetensors")
                        : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, options.shards));
  }
  // One shard in memory at a time.
  size_t next = 0;
  for (int64_t s = 0; s < options.shards; ++s) {
    SafetensorsWriter writer;
    writer.SetMetadata("format", "pt");
    for (; next < plans.size() && shard_of[next] == s; ++next) {
      const std::string bytes = GenerateTensor(plans[next], elements[next], dtype, options.seed);
      RETURN_IF_ERROR(
          writer.Add(plans[next].name, dtype, plans[next].shape, bytes.data(), bytes.size()));
    }
    RETURN_IF_ERROR(writer.WriteFile(dir + "/" + files[s]));
  }

  const std::string index_path = dir + "/model.safetensors.index.json";
  if (options.shards == 1) return RemoveIfPresent(index_path);
  uint64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < plans.size(); ++i) {
    total += sizes[i];
    weight_map[plans[i].name] = files[shard_of[i]];
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  RETURN_IF_ERROR(WriteFileAtomically(index_path, index.dump(2) + "\n"));
  return RemoveIfPresent(dir + "/model.safetensors");
}

}  // namespace specstream::teacher
