#include "common/hf_config.h"

#include <sys/stat.h>

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specstream {
namespace {

using Json = nlohmann::json;

// Per-model-type defaults, copied from the transformers config classes
// (LlamaConfig, Qwen2Config, ...) so a config.json missing a field means what
// it means to transformers.
struct TypeInfo {
  absl::string_view model_type;
  absl::string_view architecture;
  int64_t max_position_embeddings;
  double rope_theta;
  double rms_norm_eps;
  std::optional<int64_t> head_dim;        // nullopt: hidden_size / heads.
  std::optional<int64_t> sliding_window;  // Default window (before gating).
  bool qwen_sliding;                      // Window applies only when use_sliding_window is true.
  bool has_attention_bias_field;
  bool has_mlp_bias_field;
  bool moe;
};

constexpr int64_t kQwenMaxWindowLayers = 28;
// How deep config.json values may nest. Published configs nest a few levels
// (rope_parameters by layer type: 3); nlohmann's dump (in error messages)
// and its == recurse, so deeper input would overflow the stack.
constexpr int kMaxJsonDepth = 64;

// Thrown from inside the nlohmann parser callback to stop parsing; it never
// escapes ParseHfConfig.
struct TooDeep {};

const TypeInfo kTypes[] = {
    {"llama", "LlamaForCausalLM", 2048, 10000.0, 1e-6, std::nullopt, std::nullopt, false, true,
     true, false},
    {"qwen2", "Qwen2ForCausalLM", 32768, 10000.0, 1e-6, std::nullopt, 4096, true, false, false,
     false},
    {"qwen3", "Qwen3ForCausalLM", 32768, 10000.0, 1e-6, 128, 4096, true, true, false, false},
    {"mistral", "MistralForCausalLM", 131072, 10000.0, 1e-6, std::nullopt, 4096, false, false,
     false, false},
    {"qwen3_moe", "Qwen3MoeForCausalLM", 32768, 10000.0, 1e-6, std::nullopt, 4096, true, true,
     false, true},
    {"mixtral", "MixtralForCausalLM", 131072, 1e6, 1e-5, std::nullopt, std::nullopt, false, false,
     false, true},
};

std::string SupportedTypes() {
  std::vector<absl::string_view> names;
  for (const TypeInfo& t : kTypes) names.push_back(t.model_type);
  return absl::StrJoin(names, ", ");
}

const TypeInfo* FindType(absl::string_view model_type) {
  for (const TypeInfo& t : kTypes) {
    if (t.model_type == model_type) return &t;
  }
  return nullptr;
}

absl::Status FieldError(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("field \"", field, "\": ", reason));
}

// Typed access to the keys of one JSON object; an absent key or null leaves
// the output untouched, a wrong type is an error naming the key.
class FieldReader final {
 public:
  FieldReader(const Json& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  bool Has(absl::string_view key) const {
    auto it = object_.find(std::string(key));
    return it != object_.end() && !it->is_null();
  }
  bool HasKey(absl::string_view key) const { return object_.contains(std::string(key)); }

  absl::Status Int(absl::string_view key, int64_t* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number_integer())
      return Error(key, absl::StrCat("must be an integer, got ", v->dump()));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(key, absl::StrCat("integer out of range: ", v->dump()));
    }
    *out = v->get<int64_t>();
    return absl::OkStatus();
  }
  absl::Status OptInt(absl::string_view key, std::optional<int64_t>* out) const {
    if (!Has(key)) return absl::OkStatus();
    int64_t value = 0;
    RETURN_IF_ERROR(Int(key, &value));
    *out = value;
    return absl::OkStatus();
  }
  absl::Status Double(absl::string_view key, double* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return Error(key, absl::StrCat("must be a number, got ", v->dump()));
    *out = v->get<double>();
    return absl::OkStatus();
  }
  absl::Status OptDouble(absl::string_view key, std::optional<double>* out) const {
    if (!Has(key)) return absl::OkStatus();
    double value = 0;
    RETURN_IF_ERROR(Double(key, &value));
    *out = value;
    return absl::OkStatus();
  }
  absl::Status Bool(absl::string_view key, bool* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Error(key, absl::StrCat("must be true or false, got ", v->dump()));
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status String(absl::string_view key, std::string* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return Error(key, absl::StrCat("must be a string, got ", v->dump()));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }
  absl::Status IntList(absl::string_view key, std::vector<int64_t>* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_array())
      return Error(key, absl::StrCat("must be a list of integers, got ", v->dump()));
    out->clear();
    for (const Json& item : *v) {
      if (!item.is_number_integer()) {
        return Error(key, absl::StrCat("must be a list of integers, got ", v->dump()));
      }
      if (item.is_number_unsigned() && item.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Error(key, absl::StrCat("integer out of range: ", item.dump()));
      }
      out->push_back(item.get<int64_t>());
    }
    return absl::OkStatus();
  }
  absl::Status StringList(absl::string_view key, std::vector<std::string>* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_array())
      return Error(key, absl::StrCat("must be a list of strings, got ", v->dump()));
    out->clear();
    for (const Json& item : *v) {
      if (!item.is_string())
        return Error(key, absl::StrCat("must be a list of strings, got ", v->dump()));
      out->push_back(item.get<std::string>());
    }
    return absl::OkStatus();
  }
  absl::Status Required(absl::string_view key) const {
    if (!Has(key)) return Error(key, "missing (required)");
    return absl::OkStatus();
  }

  absl::Status Error(absl::string_view key, absl::string_view reason) const {
    return FieldError(absl::StrCat(prefix_, key), reason);
  }

 private:
  const Json* Find(absl::string_view key) const {
    auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  const Json& object_;
  std::string prefix_;  // "rope_scaling." for nested objects.
};

// `field` names the object in errors: "rope_scaling", or "rope_parameters"
// (whose rope_type may be absent: the default RoPE).
absl::Status ParseRopeScaling(const Json& value, RopeScaling* out,
                              absl::string_view field = "rope_scaling") {
  *out = RopeScaling();
  if (value.is_null()) return absl::OkStatus();
  if (!value.is_object()) {
    return FieldError(field, absl::StrCat("must be null or an object, got ", value.dump()));
  }
  FieldReader r(value, absl::StrCat(field, "."));
  std::string type;
  if (r.Has("rope_type")) {
    RETURN_IF_ERROR(r.String("rope_type", &type));
  } else if (r.Has("type")) {
    RETURN_IF_ERROR(r.String("type", &type));  // Legacy name.
  } else if (field == "rope_parameters") {
    type = "default";
  } else {
    return FieldError(field, R"(missing "rope_type" (or legacy "type"))");
  }
  if (type == "default") return absl::OkStatus();
  if (type == "linear") {
    out->kind = RopeScaling::Kind::kLinear;
    RETURN_IF_ERROR(r.Required("factor"));
    RETURN_IF_ERROR(r.Double("factor", &out->factor));
  } else if (type == "llama3") {
    out->kind = RopeScaling::Kind::kLlama3;
    for (const char* key :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      RETURN_IF_ERROR(r.Required(key));
    }
    RETURN_IF_ERROR(r.Double("factor", &out->factor));
    RETURN_IF_ERROR(r.Double("low_freq_factor", &out->low_freq_factor));
    RETURN_IF_ERROR(r.Double("high_freq_factor", &out->high_freq_factor));
    RETURN_IF_ERROR(
        r.OptInt("original_max_position_embeddings", &out->original_max_position_embeddings));
  } else if (type == "yarn") {
    out->kind = RopeScaling::Kind::kYarn;
    RETURN_IF_ERROR(r.Required("factor"));
    RETURN_IF_ERROR(r.Double("factor", &out->factor));
    RETURN_IF_ERROR(
        r.OptInt("original_max_position_embeddings", &out->original_max_position_embeddings));
    RETURN_IF_ERROR(r.Double("beta_fast", &out->beta_fast));
    RETURN_IF_ERROR(r.Double("beta_slow", &out->beta_slow));
    RETURN_IF_ERROR(r.OptDouble("mscale", &out->mscale));
    RETURN_IF_ERROR(r.OptDouble("mscale_all_dim", &out->mscale_all_dim));
    RETURN_IF_ERROR(r.OptDouble("attention_factor", &out->attention_factor));
  } else {
    return FieldError(absl::StrCat(field, ".rope_type"),
                      absl::StrCat("unsupported rope scaling \"", type,
                                   "\" (supported: default, linear, llama3, yarn)"));
  }
  return absl::OkStatus();
}

// transformers 5 writes RoPE as one object: "rope_parameters": {"rope_type",
// "rope_theta", and the scaling's own keys}; hybrid models key one such
// object by layer type ({"full_attention": {...}, "sliding_attention":
// {...}}). Every layer here shares one RoPE, so per-layer-type objects must
// all be the same, and a partial rotary factor other than 1 is refused.
absl::Status ParseRopeParameters(const Json& value, double* theta, RopeScaling* scaling) {
  if (!value.is_object() || value.empty()) {
    return FieldError("rope_parameters", absl::StrCat("must be an object, got ", value.dump()));
  }
  const Json* params = &value;
  if (!value.contains("rope_type") && !value.contains("type") && !value.contains("rope_theta")) {
    params = nullptr;
    std::string first_type;
    for (const auto& [layer_type, per_type] : value.items()) {
      if (!per_type.is_object()) {
        return FieldError(absl::StrCat("rope_parameters.", layer_type),
                          absl::StrCat("must be an object, got ", per_type.dump()));
      }
      if (params != nullptr && *params != per_type) {
        return FieldError("rope_parameters",
                          absl::StrCat("layer types ", first_type, " and ", layer_type,
                                       " use different RoPE; one RoPE for every layer is all "
                                       "the runtimes model"));
      }
      if (params == nullptr) {
        params = &per_type;
        first_type = layer_type;
      }
    }
  }
  FieldReader r(*params, "rope_parameters.");
  RETURN_IF_ERROR(r.Double("rope_theta", theta));
  double partial = 1.0;
  RETURN_IF_ERROR(r.Double("partial_rotary_factor", &partial));
  if (partial != 1.0) {
    return FieldError("rope_parameters.partial_rotary_factor",
                      absl::StrCat(partial, " is not supported (RoPE over the whole head only)"));
  }
  return ParseRopeScaling(*params, scaling, "rope_parameters");
}

Json RopeScalingToJson(const RopeScaling& rs) {
  Json j = Json::object();
  switch (rs.kind) {
    case RopeScaling::Kind::kNone:
      return nullptr;
    case RopeScaling::Kind::kLinear:
      j["rope_type"] = "linear";
      j["factor"] = rs.factor;
      break;
    case RopeScaling::Kind::kLlama3:
      j["rope_type"] = "llama3";
      j["factor"] = rs.factor;
      j["low_freq_factor"] = rs.low_freq_factor;
      j["high_freq_factor"] = rs.high_freq_factor;
      if (rs.original_max_position_embeddings) {
        j["original_max_position_embeddings"] = *rs.original_max_position_embeddings;
      }
      break;
    case RopeScaling::Kind::kYarn:
      j["rope_type"] = "yarn";
      j["factor"] = rs.factor;
      j["beta_fast"] = rs.beta_fast;
      j["beta_slow"] = rs.beta_slow;
      if (rs.original_max_position_embeddings) {
        j["original_max_position_embeddings"] = *rs.original_max_position_embeddings;
      }
      if (rs.mscale) j["mscale"] = *rs.mscale;
      if (rs.mscale_all_dim) j["mscale_all_dim"] = *rs.mscale_all_dim;
      if (rs.attention_factor) j["attention_factor"] = *rs.attention_factor;
      break;
  }
  return j;
}

absl::Status Positive(absl::string_view field, int64_t value) {
  if (value <= 0) return FieldError(field, absl::StrCat("must be positive, got ", value));
  return absl::OkStatus();
}

absl::Status ValidateRopeScaling(const RopeScaling& rs) {
  if (rs.kind == RopeScaling::Kind::kNone) return absl::OkStatus();
  if (!(rs.factor >= 1.0) || !std::isfinite(rs.factor)) {
    return FieldError("rope_scaling.factor", absl::StrCat("must be >= 1, got ", rs.factor));
  }
  if (rs.original_max_position_embeddings && *rs.original_max_position_embeddings <= 0) {
    return FieldError("rope_scaling.original_max_position_embeddings",
                      absl::StrCat("must be positive, got ", *rs.original_max_position_embeddings));
  }
  if (rs.kind == RopeScaling::Kind::kLlama3) {
    if (!rs.original_max_position_embeddings) {
      return FieldError("rope_scaling.original_max_position_embeddings", "missing (required)");
    }
    if (!(rs.low_freq_factor > 0)) {
      return FieldError("rope_scaling.low_freq_factor",
                        absl::StrCat("must be positive, got ", rs.low_freq_factor));
    }
    if (!(rs.high_freq_factor > rs.low_freq_factor)) {
      return FieldError("rope_scaling.high_freq_factor",
                        absl::StrCat("must be greater than low_freq_factor (", rs.low_freq_factor,
                                     "), got ", rs.high_freq_factor));
    }
  }
  if (rs.kind == RopeScaling::Kind::kYarn && !(rs.beta_fast > rs.beta_slow)) {
    return FieldError(
        "rope_scaling.beta_fast",
        absl::StrCat("must be greater than beta_slow (", rs.beta_slow, "), got ", rs.beta_fast));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view RopeScalingKindName(RopeScaling::Kind kind) {
  switch (kind) {
    case RopeScaling::Kind::kNone:
      return "none";
    case RopeScaling::Kind::kLinear:
      return "linear";
    case RopeScaling::Kind::kLlama3:
      return "llama3";
    case RopeScaling::Kind::kYarn:
      return "yarn";
  }
  return "?";
}

bool HfModelConfig::IsMoeLayer(int64_t layer) const {
  if (!is_moe()) return false;
  for (int64_t dense : mlp_only_layers) {
    if (dense == layer) return false;
  }
  return decoder_sparse_step <= 1 || (layer + 1) % decoder_sparse_step == 0;
}

int64_t HfModelConfig::expert_intermediate_size() const {
  return model_type == "mixtral" ? intermediate_size : moe_intermediate_size;
}

const char* HfModelConfig::expert_intermediate_field() const {
  return model_type == "mixtral" ? "intermediate_size" : "moe_intermediate_size";
}

ExpertTensorNames MoeTensorNames(const HfModelConfig& config, int64_t layer) {
  if (config.model_type == "mixtral") {
    return {absl::StrCat("model.layers.", layer, ".block_sparse_moe."), "w1.weight", "w3.weight",
            "w2.weight"};
  }
  return {absl::StrCat("model.layers.", layer, ".mlp."), "gate_proj.weight", "up_proj.weight",
          "down_proj.weight"};
}

absl::StatusOr<HfModelConfig> ParseHfConfig(absl::string_view text) {
  Json root;
  const auto limit_depth = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    root = Json::parse(text.begin(), text.end(), limit_depth);
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(
        absl::StrCat("config nests values more than ", kMaxJsonDepth, " levels deep"));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config must be a JSON object, got ", root.type_name()));
  }
  FieldReader r(root, "");
  HfModelConfig c;

  RETURN_IF_ERROR(r.Required("model_type"));
  RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  const TypeInfo* type = FindType(c.model_type);
  if (type == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported model_type \"", c.model_type,
                                                   "\" (supported: ", SupportedTypes(), ")"));
  }
  RETURN_IF_ERROR(r.StringList("architectures", &c.architectures));
  if (c.architectures.empty()) c.architectures.emplace_back(type->architecture);

  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    RETURN_IF_ERROR(r.Required(key));
  }
  RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size));
  RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size));
  RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_hidden_layers));
  RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_attention_heads));
  RETURN_IF_ERROR(Positive("hidden_size", c.hidden_size));
  RETURN_IF_ERROR(Positive("num_attention_heads", c.num_attention_heads));

  c.num_key_value_heads = c.num_attention_heads;
  RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.num_key_value_heads));

  if (r.Has("head_dim")) {
    RETURN_IF_ERROR(r.Int("head_dim", &c.head_dim));
  } else if (type->head_dim) {
    c.head_dim = *type->head_dim;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return FieldError("num_attention_heads",
                        absl::StrCat(c.num_attention_heads, " does not divide hidden_size ",
                                     c.hidden_size, " (set head_dim explicitly)"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  c.max_position_embeddings = type->max_position_embeddings;
  RETURN_IF_ERROR(r.Int("max_position_embeddings", &c.max_position_embeddings));
  c.rope_theta = type->rope_theta;
  RETURN_IF_ERROR(r.Double("rope_theta", &c.rope_theta));
  if (r.HasKey("rope_scaling"))
    RETURN_IF_ERROR(ParseRopeScaling(root["rope_scaling"], &c.rope_scaling));
  if (r.Has("rope_parameters")) {
    // The newer form wins; the legacy keys, when also there, must agree.
    double theta = type->rope_theta;
    RopeScaling scaling;
    RETURN_IF_ERROR(ParseRopeParameters(root["rope_parameters"], &theta, &scaling));
    const bool legacy_theta = r.Has("rope_theta");
    if ((legacy_theta && theta != c.rope_theta) ||
        (r.Has("rope_scaling") &&
         RopeScalingToJson(scaling) != RopeScalingToJson(c.rope_scaling))) {
      return FieldError(
          "rope_parameters",
          absl::StrCat("disagrees with ", legacy_theta ? "rope_theta" : "rope_scaling",
                       " in the same config.json"));
    }
    c.rope_theta = theta;
    c.rope_scaling = scaling;
  }
  c.rms_norm_eps = type->rms_norm_eps;
  RETURN_IF_ERROR(r.Double("rms_norm_eps", &c.rms_norm_eps));
  RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(r.String("hidden_act", &c.hidden_act));

  if (type->has_attention_bias_field) RETURN_IF_ERROR(r.Bool("attention_bias", &c.attention_bias));
  if (type->model_type == "qwen2") c.attention_bias = true;  // Qwen2 always has q/k/v biases.
  if (type->has_mlp_bias_field) RETURN_IF_ERROR(r.Bool("mlp_bias", &c.mlp_bias));

  // Sliding window: an explicit null means none; absence means the default.
  // LlamaConfig has no such field (transformers' Llama ignores the key), so
  // a llama config.json's is ignored here too.
  c.sliding_window = type->sliding_window;
  if (type->model_type != "llama" && r.HasKey("sliding_window")) {
    c.sliding_window.reset();
    RETURN_IF_ERROR(r.OptInt("sliding_window", &c.sliding_window));
  }
  if (type->qwen_sliding) {
    bool use_sliding_window = false;
    RETURN_IF_ERROR(r.Bool("use_sliding_window", &use_sliding_window));
    if (!use_sliding_window) c.sliding_window.reset();
    c.max_window_layers = kQwenMaxWindowLayers;
    RETURN_IF_ERROR(r.OptInt("max_window_layers", &c.max_window_layers));
  }

  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  if (r.Has("torch_dtype")) {
    RETURN_IF_ERROR(r.String("torch_dtype", &c.torch_dtype));
  } else {
    RETURN_IF_ERROR(r.String("dtype", &c.torch_dtype));
  }

  RETURN_IF_ERROR(r.OptInt("bos_token_id", &c.bos_token_id));
  if (r.Has("eos_token_id")) {
    if (root["eos_token_id"].is_array()) {
      RETURN_IF_ERROR(r.IntList("eos_token_id", &c.eos_token_ids));
      c.eos_token_id_is_list = true;
    } else {
      int64_t eos = 0;
      RETURN_IF_ERROR(r.Int("eos_token_id", &eos));
      c.eos_token_ids = {eos};
    }
  }

  if (type->model_type == "qwen3_moe") {
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    c.router_aux_loss_coef = 0.001;
    RETURN_IF_ERROR(r.Int("num_experts", &c.num_experts));
    RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.num_experts_per_tok));
    RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c.moe_intermediate_size));
    RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c.norm_topk_prob));
    RETURN_IF_ERROR(r.Int("decoder_sparse_step", &c.decoder_sparse_step));
    RETURN_IF_ERROR(r.IntList("mlp_only_layers", &c.mlp_only_layers));
    RETURN_IF_ERROR(
        r.OptInt("shared_expert_intermediate_size", &c.shared_expert_intermediate_size));
    RETURN_IF_ERROR(r.Double("router_aux_loss_coef", &c.router_aux_loss_coef));
  } else if (type->model_type == "mixtral") {
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.norm_topk_prob = true;  // Mixtral always renormalises the top-k weights.
    c.router_aux_loss_coef = 0.02;
    RETURN_IF_ERROR(r.Int("num_local_experts", &c.num_experts));
    RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.num_experts_per_tok));
    RETURN_IF_ERROR(r.Double("router_aux_loss_coef", &c.router_aux_loss_coef));
  }

  RETURN_IF_ERROR(ValidateHfConfig(c));
  return c;
}

absl::Status ValidateHfConfig(const HfModelConfig& c) {
  const TypeInfo* type = FindType(c.model_type);
  if (type == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported model_type \"", c.model_type,
                                                   "\" (supported: ", SupportedTypes(), ")"));
  }
  RETURN_IF_ERROR(Positive("vocab_size", c.vocab_size));
  RETURN_IF_ERROR(Positive("hidden_size", c.hidden_size));
  RETURN_IF_ERROR(Positive("intermediate_size", c.intermediate_size));
  RETURN_IF_ERROR(Positive("num_hidden_layers", c.num_hidden_layers));
  RETURN_IF_ERROR(Positive("num_attention_heads", c.num_attention_heads));
  RETURN_IF_ERROR(Positive("num_key_value_heads", c.num_key_value_heads));
  RETURN_IF_ERROR(Positive("head_dim", c.head_dim));
  RETURN_IF_ERROR(Positive("max_position_embeddings", c.max_position_embeddings));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return FieldError("num_key_value_heads",
                      absl::StrCat(c.num_key_value_heads, " does not divide num_attention_heads ",
                                   c.num_attention_heads));
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    return FieldError("rope_theta", absl::StrCat("must be positive, got ", c.rope_theta));
  }
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return FieldError("rms_norm_eps", absl::StrCat("must be positive, got ", c.rms_norm_eps));
  }
  RETURN_IF_ERROR(ValidateRopeScaling(c.rope_scaling));
  if (c.hidden_act != "silu") {
    return FieldError("hidden_act", absl::StrCat("unsupported activation \"", c.hidden_act,
                                                 "\" (expected silu)"));
  }
  if (c.sliding_window) {
    if (c.model_type == "llama") {
      return FieldError("sliding_window", "llama has no sliding window (transformers ignores it)");
    }
    RETURN_IF_ERROR(Positive("sliding_window", *c.sliding_window));
  }
  if (!c.torch_dtype.empty() && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16" &&
      c.torch_dtype != "float32") {
    return FieldError("torch_dtype", absl::StrCat("unsupported \"", c.torch_dtype,
                                                  "\" (expected bfloat16, float16 or float32)"));
  }
  if (c.bos_token_id && *c.bos_token_id < 0) {
    return FieldError("bos_token_id", absl::StrCat("must be non-negative, got ", *c.bos_token_id));
  }
  for (int64_t eos : c.eos_token_ids) {
    if (eos < 0) return FieldError("eos_token_id", absl::StrCat("must be non-negative, got ", eos));
  }

  const absl::string_view experts_field =
      c.model_type == "mixtral" ? "num_local_experts" : "num_experts";
  if (type->moe) {
    RETURN_IF_ERROR(Positive(experts_field, c.num_experts));
    RETURN_IF_ERROR(Positive("num_experts_per_tok", c.num_experts_per_tok));
    if (c.num_experts_per_tok > c.num_experts) {
      return FieldError("num_experts_per_tok", absl::StrCat(c.num_experts_per_tok, " exceeds ",
                                                            experts_field, " ", c.num_experts));
    }
    if (c.model_type == "qwen3_moe") {
      RETURN_IF_ERROR(Positive("moe_intermediate_size", c.moe_intermediate_size));
      RETURN_IF_ERROR(Positive("decoder_sparse_step", c.decoder_sparse_step));
    }
    std::set<int64_t> seen;
    for (int64_t layer : c.mlp_only_layers) {
      if (layer < 0 || layer >= c.num_hidden_layers) {
        return FieldError("mlp_only_layers", absl::StrCat("layer ", layer, " out of range [0, ",
                                                          c.num_hidden_layers, ")"));
      }
      if (!seen.insert(layer).second) {
        return FieldError("mlp_only_layers", absl::StrCat("layer ", layer, " listed twice"));
      }
    }
    if (c.shared_expert_intermediate_size) {
      RETURN_IF_ERROR(
          Positive("shared_expert_intermediate_size", *c.shared_expert_intermediate_size));
    }
  } else if (c.num_experts != 0) {
    return FieldError("num_experts", absl::StrCat("model_type \"", c.model_type,
                                                  "\" is dense, got ", c.num_experts));
  }
  return absl::OkStatus();
}

absl::StatusOr<HfModelConfig> LoadHfConfig(const std::string& path_or_dir) {
  std::string path = path_or_dir;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) path += "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  absl::StatusOr<HfModelConfig> config = ParseHfConfig(text);
  if (!config.ok()) return Annotate(config.status(), path);
  return config;
}

std::string HfConfigToJson(const HfModelConfig& c) {
  const TypeInfo* type = FindType(c.model_type);
  Json j = Json::object();  // std::map-backed: keys come out sorted.
  j["model_type"] = c.model_type;
  j["architectures"] = c.architectures.empty() && type != nullptr
                           ? std::vector<std::string>{std::string(type->architecture)}
                           : c.architectures;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = RopeScalingToJson(c.rope_scaling);
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = c.hidden_act;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id_is_list) {
    j["eos_token_id"] = c.eos_token_ids;
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids.front();
  }
  if (type != nullptr && type->has_attention_bias_field) j["attention_bias"] = c.attention_bias;
  if (type != nullptr && type->has_mlp_bias_field) j["mlp_bias"] = c.mlp_bias;
  if (c.model_type != "llama") {  // Llama has no sliding window field.
    if (c.sliding_window) {
      j["sliding_window"] = *c.sliding_window;
    } else {
      j["sliding_window"] = nullptr;
    }
  }
  if (type != nullptr && type->qwen_sliding) {
    j["use_sliding_window"] = c.sliding_window.has_value();
    j["max_window_layers"] = c.max_window_layers.value_or(c.num_hidden_layers);
  }
  if (c.model_type == "qwen3_moe") {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    if (c.shared_expert_intermediate_size) {
      j["shared_expert_intermediate_size"] = *c.shared_expert_intermediate_size;
    }
  } else if (c.model_type == "mixtral") {
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  }
  return j.dump(2) + "\n";
}

}  // namespace specstream
