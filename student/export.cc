#include "student/export.h"

#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/capture_layers.h"
#include "common/dtype.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream::student {
namespace {

namespace fs = std::filesystem;

constexpr char kConfigFile[] = "config.json";
constexpr char kModelFile[] = "model.safetensors";

enum class Kind { kWeight, kD2t, kT2d };

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
  Kind kind;
};

}  // namespace

std::string FcNormTensorName(int64_t capture) {
  return absl::StrCat("fc_norm.", capture, ".weight");
}

namespace {

std::vector<Expected> ExpectedTensors(const ExportConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t th = c.target_hidden_size > 0 ? c.target_hidden_size : h;
  const int64_t q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  const int64_t i = c.intermediate_size;
  std::vector<Expected> out = {
      {"fc.weight", {h, 3 * th}, Kind::kWeight},
      {"midlayer.self_attn.q_proj.weight", {q, 2 * h}, Kind::kWeight},
      {"midlayer.self_attn.k_proj.weight", {kv, 2 * h}, Kind::kWeight},
      {"midlayer.self_attn.v_proj.weight", {kv, 2 * h}, Kind::kWeight},
      {"midlayer.self_attn.o_proj.weight", {h, q}, Kind::kWeight},
      {"midlayer.mlp.gate_proj.weight", {i, h}, Kind::kWeight},
      {"midlayer.mlp.up_proj.weight", {i, h}, Kind::kWeight},
      {"midlayer.mlp.down_proj.weight", {h, i}, Kind::kWeight},
      {"midlayer.input_layernorm.weight", {h}, Kind::kWeight},
      {"midlayer.hidden_norm.weight", {h}, Kind::kWeight},
      {"midlayer.post_attention_layernorm.weight", {h}, Kind::kWeight},
      {"norm.weight", {h}, Kind::kWeight},
      {"lm_head.weight", {c.draft_vocab_size, h}, Kind::kWeight},
      {"d2t", {c.draft_vocab_size}, Kind::kD2t},
      {"t2d", {c.vocab_size}, Kind::kT2d},
  };
  if (c.fc_norm) {
    for (int64_t k = 0; k < 3; ++k) {
      out.push_back({FcNormTensorName(k), {th}, Kind::kWeight});
    }
  }
  if (c.norm_before_fc) out.push_back({kNormBeforeFcTensor, {3 * th}, Kind::kWeight});
  if (c.parallel_drafting) out.push_back({kMaskHiddenTensor, {1, 1, 3 * th}, Kind::kWeight});
  return out;
}

absl::Status ConfigError(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("config.", field, ": ", reason));
}

absl::Status TensorError(absl::string_view name, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", reason));
}

absl::Status ValidateConfig(const ExportConfig& c) {
  auto positive = [](int64_t v, absl::string_view field) -> absl::Status {
    if (v <= 0) return ConfigError(field, absl::StrCat("must be > 0, got ", v));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(positive(c.hidden_size, "hidden_size"));
  RETURN_IF_ERROR(positive(c.intermediate_size, "intermediate_size"));
  RETURN_IF_ERROR(positive(c.num_attention_heads, "num_attention_heads"));
  RETURN_IF_ERROR(positive(c.num_key_value_heads, "num_key_value_heads"));
  RETURN_IF_ERROR(positive(c.head_dim, "head_dim"));
  RETURN_IF_ERROR(positive(c.max_position_embeddings, "max_position_embeddings"));
  RETURN_IF_ERROR(positive(c.vocab_size, "vocab_size"));
  RETURN_IF_ERROR(positive(c.draft_vocab_size, "draft_vocab_size"));
  if (c.parallel_drafting && (c.mask_token_id < 0 || c.mask_token_id >= c.vocab_size)) {
    return ConfigError(
        "mask_token_id",
        absl::StrCat(c.mask_token_id, " is not a target token id [0, ", c.vocab_size, ")"));
  }
  if (c.fc_norm && c.norm_before_fc) {
    return ConfigError("fc_norm",
                       "true together with norm_before_fc: the captures are normalised per "
                       "layer or over their concatenation, not both");
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return ConfigError("num_key_value_heads",
                       absl::StrCat(c.num_key_value_heads, " does not divide num_attention_heads ",
                                    c.num_attention_heads));
  }
  if (c.draft_vocab_size > c.vocab_size) {
    return ConfigError("draft_vocab_size",
                       absl::StrCat(c.draft_vocab_size, " > vocab_size ", c.vocab_size));
  }
  if (c.target_hidden_size < 0) {
    return ConfigError("target_hidden_size",
                       absl::StrCat("must be >= 0, got ", c.target_hidden_size));
  }
  if (!(c.rms_norm_eps > 0)) {
    return ConfigError("rms_norm_eps", absl::StrCat("must be > 0, got ", c.rms_norm_eps));
  }
  if (!(c.rope_theta > 0)) {
    return ConfigError("rope_theta", absl::StrCat("must be > 0, got ", c.rope_theta));
  }
  if (!c.rope_scaling.is_null() && !c.rope_scaling.is_object()) {
    return ConfigError("rope_scaling", "must be null or an object");
  }
  if (c.bos_token_id.has_value() && *c.bos_token_id < 0) {
    return ConfigError("bos_token_id", "must be >= 0");
  }
  for (int64_t eos : c.eos_token_ids) {
    if (eos < 0) return ConfigError("eos_token_id", "must be >= 0");
  }
  const absl::Status capture =
      ValidateEagle3CaptureLayers(c.aux_layer_ids, c.target_num_hidden_layers);
  if (!capture.ok()) return ConfigError("eagle_aux_hidden_state_layer_ids", capture.message());
  return ExportWeightDtype(c.torch_dtype).status();
}

// Converts one validated input tensor to its exported CPU form.
absl::StatusOr<torch::Tensor> ConvertTensor(const Expected& e, const torch::Tensor& t,
                                            torch::Dtype weight_dtype) {
  torch::Tensor out;
  RETURN_IF_ERROR(CatchTorch(absl::StrCat("tensor ", e.name), [&] {
    torch::Dtype dtype = e.kind == Kind::kWeight ? weight_dtype
                         : e.kind == Kind::kD2t  ? torch::kInt64
                                                 : torch::kBool;
    out = t.detach().to(torch::kCPU).to(dtype).contiguous();
  }));
  return out;
}

absl::Status CheckTensor(const Expected& e, const torch::Tensor& t) {
  if (!t.defined()) return TensorError(e.name, "undefined");
  std::vector<int64_t> shape = ShapeOf(t);
  if (shape != e.shape) {
    return TensorError(
        e.name, absl::StrCat("shape ", ShapeString(shape), ", expected ", ShapeString(e.shape)));
  }
  const auto type = t.scalar_type();
  switch (e.kind) {
    case Kind::kWeight:
      if (!t.is_floating_point()) {
        return TensorError(e.name, absl::StrCat("dtype ", c10::toString(type),
                                                ", expected a floating-point weight"));
      }
      if (!torch::isfinite(t).all().item<bool>()) {
        return TensorError(e.name, "contains NaN or infinity");
      }
      break;
    case Kind::kD2t:
      if (type != torch::kInt64 && type != torch::kInt32) {
        return TensorError(
            e.name, absl::StrCat("dtype ", c10::toString(type), ", expected int64 (or int32)"));
      }
      break;
    case Kind::kT2d:
      if (type != torch::kBool && type != torch::kUInt8) {
        return TensorError(
            e.name, absl::StrCat("dtype ", c10::toString(type), ", expected bool (or 0/1 uint8)"));
      }
      if (type == torch::kUInt8 && t.numel() > 0 && t.max().item<int64_t>() > 1) {
        return TensorError(e.name, "uint8 values must be 0 or 1");
      }
      break;
  }
  return absl::OkStatus();
}

// d2t[i] + i must be strictly increasing target ids inside the vocab, and
// exactly the ids t2d marks.
absl::Status CheckVocabMap(const ExportConfig& c, const torch::Tensor& d2t,
                           const torch::Tensor& t2d) {
  torch::Tensor t2d_bool = t2d.to(torch::kCPU).to(torch::kBool);
  auto marked = t2d_bool.sum().item<int64_t>();
  if (marked != c.draft_vocab_size) {
    return TensorError(
        "t2d", absl::StrCat(marked, " ids marked, expected draft_vocab_size ", c.draft_vocab_size));
  }
  torch::Tensor used =
      d2t.to(torch::kCPU).to(torch::kInt64) + torch::arange(c.draft_vocab_size, torch::kInt64);
  auto ids = used.accessor<int64_t, 1>();
  auto mask = t2d_bool.accessor<bool, 1>();
  for (int64_t i = 0; i < c.draft_vocab_size; ++i) {
    int64_t id = ids[i];
    if (id < 0 || id >= c.vocab_size) {
      return TensorError("d2t", absl::StrCat("draft id ", i, " maps to target id ", id,
                                             ", outside [0, ", c.vocab_size, ")"));
    }
    if (i > 0 && id <= ids[i - 1]) {
      return TensorError("d2t", absl::StrCat("target ids must increase; draft id ", i, " maps to ",
                                             id, " after ", ids[i - 1]));
    }
    if (!mask[id]) {
      return TensorError("d2t", absl::StrCat("draft id ", i, " maps to target id ", id,
                                             ", which t2d does not mark"));
    }
  }
  return absl::OkStatus();
}

// An existing output directory may be replaced only when it holds nothing but
// a previous export; anything else (a typo'd path, a user's files) is kept.
absl::Status CheckReplaceable(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("export: ", dir, " exists and is not a directory"));
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name != kConfigFile && name != kModelFile) {
      return absl::FailedPreconditionError(
          absl::StrCat("export: ", dir, " exists and holds ", name,
                       ", which is not part of an export; refusing to replace it"));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("export: cannot list ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<torch::Dtype> ExportWeightDtype(const std::string& name) {
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kFloat16;
  if (name == "float32") return torch::kFloat32;
  return ConfigError("torch_dtype", absl::StrCat("unknown dtype \"", name,
                                                 "\" (known: bfloat16, float16, float32)"));
}

absl::StatusOr<ExportConfig> ExportConfigFromTarget(const HfModelConfig& target) {
  ExportConfig c;
  c.hidden_size = target.hidden_size;
  c.intermediate_size = target.intermediate_size;
  c.num_attention_heads = target.num_attention_heads;
  c.num_key_value_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.rms_norm_eps = target.rms_norm_eps;
  c.rope_theta = target.rope_theta;
  // HfConfigToJson owns the rope_scaling field names per kind; reuse them.
  nlohmann::json full = nlohmann::json::parse(HfConfigToJson(target), nullptr, false);
  if (!full.is_object()) return absl::InternalError("export: cannot re-read the target config");
  c.rope_scaling = full.value("rope_scaling", nlohmann::json(nullptr));
  c.max_position_embeddings = target.max_position_embeddings;
  c.vocab_size = target.vocab_size;
  c.bos_token_id = target.bos_token_id;
  c.eos_token_ids = target.eos_token_ids;
  c.eos_token_id_is_list = target.eos_token_id_is_list;
  c.target_num_hidden_layers = target.num_hidden_layers;
  auto ids = DefaultEagle3CaptureLayers(target.num_hidden_layers);
  if (ids.ok()) c.aux_layer_ids = *std::move(ids);
  return c;
}

absl::Status ValidateExport(const ExportInput& in) {
  const ExportConfig& c = in.config;
  RETURN_IF_ERROR(ValidateConfig(c));
  std::vector<Expected> expected = ExpectedTensors(c);
  std::set<std::string> known;
  for (const Expected& e : expected) known.insert(e.name);
  for (const auto& [name, tensor] : in.tensors) {
    if (known.count(name) == 0) {
      return TensorError(name, absl::StrContains(name, "embed_tokens")
                                   ? "not exported (the servers share the target's embeddings)"
                                   : "not part of an EAGLE-3 export");
    }
  }
  for (const Expected& e : expected) {
    auto it = in.tensors.find(e.name);
    if (it == in.tensors.end()) return TensorError(e.name, "missing");
    absl::Status status;
    RETURN_IF_ERROR(
        CatchTorch(absl::StrCat("tensor ", e.name), [&] { status = CheckTensor(e, it->second); }));
    RETURN_IF_ERROR(status);
  }
  absl::Status status;
  RETURN_IF_ERROR(CatchTorch("tensor d2t", [&] {
    status = CheckVocabMap(c, in.tensors.at("d2t"), in.tensors.at("t2d"));
  }));
  return status;
}

nlohmann::json ExportConfigJson(const ExportConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  j["architectures"] = {kEagle3Architecture};
  j["model_type"] = "llama";
  j["num_hidden_layers"] = 1;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = c.rope_scaling;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["vocab_size"] = c.vocab_size;
  j["draft_vocab_size"] = c.draft_vocab_size;
  if (c.target_hidden_size > 0 && c.target_hidden_size != c.hidden_size) {
    j["target_hidden_size"] = c.target_hidden_size;
  }
  j["tie_word_embeddings"] = false;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  // vLLM: hidden_norm applies after the residual is taken from h (EAGLE-3 as
  // SpecForge trains it; DESIGN §3 "residual is h").
  j["norm_before_residual"] = false;
  j["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id.has_value()) j["bos_token_id"] = *c.bos_token_id;
  if (!c.eos_token_ids.empty()) {
    if (c.eos_token_id_is_list || c.eos_token_ids.size() > 1) {
      j["eos_token_id"] = c.eos_token_ids;
    } else {
      j["eos_token_id"] = c.eos_token_ids.front();
    }
  }
  // See export.h: SGLang reads the nested key (output-of-layer ids), vLLM
  // the top-level key (input-of-layer ids, one more).
  j["eagle_config"] = {
      {"eagle_aux_hidden_state_layer_ids", c.aux_layer_ids},
      {"use_aux_hidden_state", true},
      {"use_input_layernorm_in_first_layer", true},
      {"use_last_layernorm", true},
  };
  std::vector<int64_t> vllm_ids;
  for (CaptureLayerId id : c.aux_layer_ids) vllm_ids.push_back(int64_t{id} + 1);
  j["eagle_aux_hidden_state_layer_ids"] = vllm_ids;
  // EAGLE 3.1: written only when set, so an EAGLE-3 export stays as it was.
  if (c.fc_norm) j["fc_norm"] = true;
  if (c.norm_output) j["norm_output"] = true;
  if (c.norm_before_fc) {
    // vLLM reads eagle_config's key first, then the top level's; NVIDIA's
    // drafts write both.
    j["norm_before_fc"] = true;
    j["eagle_config"]["norm_before_fc"] = true;
  }
  if (c.parallel_drafting) {
    j["parallel_drafting"] = true;
    // vLLM reads the mask token under any of the three names.
    j["mask_token_id"] = c.mask_token_id;
    j["pard_token"] = c.mask_token_id;
    j["ptd_token_id"] = c.mask_token_id;
    j["num_depths"] = c.num_depths;
    j["down_sample_ratio"] = c.down_sample_ratio;
    j["down_sample_ratio_min"] = c.down_sample_ratio_min;
  }
  return j;
}

absl::Status WriteDraftDirectory(const std::string& out_dir_arg, const std::string& config_text,
                                 const std::string& model_bytes, Env* env) {
  std::string out_dir = out_dir_arg;
  while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
  if (out_dir.empty()) return absl::InvalidArgumentError("export: empty output directory");
  RETURN_IF_ERROR(CheckReplaceable(out_dir));

  fs::path parent = fs::path(out_dir).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("export: cannot create ", parent.string(), ": ", ec.message()));
  }
  DirectoryReplaceOptions replace;
  replace.staging_prefix = out_dir + ".tmp-";
  replace.aside_prefix = out_dir + ".old-";
  return Annotate(
      ReplaceDirectory(Env::Or(env), out_dir,
                       {{kModelFile, model_bytes}, {kConfigFile, config_text}}, replace),
      absl::StrCat("export to ", out_dir));
}

absl::Status ExportDraft(const ExportInput& in, const std::string& out_dir, Env* env) {
  RETURN_IF_ERROR(ValidateExport(in));
  ASSIGN_OR_RETURN(torch::Dtype weight_dtype, ExportWeightDtype(in.config.torch_dtype));

  // Build the whole file in memory first: conversion errors leave no trace.
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");  // What transformers' loaders expect.
  for (const Expected& e : ExpectedTensors(in.config)) {
    ASSIGN_OR_RETURN(torch::Tensor t, ConvertTensor(e, in.tensors.at(e.name), weight_dtype));
    RETURN_IF_ERROR(AddTensor(writer, e.name, t));
  }
  ASSIGN_OR_RETURN(std::string model_bytes, writer.Serialize());
  RETURN_IF_ERROR(
      WriteDraftDirectory(out_dir, ExportConfigJson(in.config).dump(2) + "\n", model_bytes, env));
  SS_LOG_INFO("export: wrote {} ({} tensors, {})", out_dir, ExpectedTensors(in.config).size(),
              in.config.torch_dtype);
  return absl::OkStatus();
}

absl::StatusOr<ExportInput> ReadExport(const std::string& dir) {
  const std::string config_path = dir + "/" + kConfigFile;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  }
  ExportInput out;
  ExportConfig& c = out.config;
  try {
    auto arch = j.value("architectures", nlohmann::json::array());
    if (arch != nlohmann::json::array({kEagle3Architecture})) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": architectures is ",
                                                     arch.dump(), ", expected [\"",
                                                     kEagle3Architecture, "\"]"));
    }
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.intermediate_size = j.at("intermediate_size").get<int64_t>();
    c.num_attention_heads = j.at("num_attention_heads").get<int64_t>();
    c.num_key_value_heads = j.value("num_key_value_heads", c.num_attention_heads);
    c.head_dim = j.value("head_dim", c.hidden_size / std::max<int64_t>(c.num_attention_heads, 1));
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.rope_scaling = j.value("rope_scaling", nlohmann::json(nullptr));
    c.max_position_embeddings = j.at("max_position_embeddings").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.draft_vocab_size = j.value("draft_vocab_size", c.vocab_size);
    c.target_hidden_size = j.value("target_hidden_size", int64_t{0});
    if (j.contains("bos_token_id") && !j["bos_token_id"].is_null()) {
      c.bos_token_id = j["bos_token_id"].get<int64_t>();
    }
    if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
      c.eos_token_ids = j["eos_token_id"].get<std::vector<int64_t>>();
      c.eos_token_id_is_list = true;
    } else if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
      c.eos_token_ids = {j["eos_token_id"].get<int64_t>()};
    }
    c.torch_dtype = j.value("torch_dtype", std::string("bfloat16"));
    c.fc_norm = j.value("fc_norm", false);
    c.norm_output = j.value("norm_output", false);
    c.norm_before_fc = j.value("norm_before_fc", false);
    if (j.contains("eagle_config") && j["eagle_config"].is_object()) {
      c.norm_before_fc = j["eagle_config"].value("norm_before_fc", c.norm_before_fc);
    }
    c.parallel_drafting = j.value("parallel_drafting", false);
    if (c.parallel_drafting) {
      for (const char* key : {"mask_token_id", "pard_token", "ptd_token_id"}) {
        if (j.contains(key) && !j[key].is_null()) {
          c.mask_token_id = j[key].get<int64_t>();
          break;
        }
      }
      c.num_depths = j.value("num_depths", int64_t{0});
      c.down_sample_ratio = j.value("down_sample_ratio", 0.7);
      c.down_sample_ratio_min = j.value("down_sample_ratio_min", 0.2);
    }
    if (j.contains("eagle_config") &&
        j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
      ASSIGN_OR_RETURN(
          c.aux_layer_ids,
          NarrowCaptureLayerIds(
              j["eagle_config"]["eagle_aux_hidden_state_layer_ids"].get<std::vector<int64_t>>(),
              absl::StrCat(config_path, ": eagle_config.eagle_aux_hidden_state_layer_ids")));
      if (j.contains("eagle_aux_hidden_state_layer_ids")) {
        auto vllm = j["eagle_aux_hidden_state_layer_ids"].get<std::vector<int64_t>>();
        bool agree = vllm.size() == c.aux_layer_ids.size();
        for (size_t k = 0; agree && k < vllm.size(); ++k) agree = vllm[k] == c.aux_layer_ids[k] + 1;
        if (!agree) {
          return absl::InvalidArgumentError(
              absl::StrCat(config_path,
                           ": eagle_aux_hidden_state_layer_ids (vLLM, input-of-layer) must be "
                           "eagle_config's ids (SGLang, output-of-layer) plus one"));
        }
      }
    } else if (j.contains("eagle_aux_hidden_state_layer_ids")) {
      std::vector<int64_t> ids;
      for (int64_t id : j["eagle_aux_hidden_state_layer_ids"].get<std::vector<int64_t>>()) {
        ids.push_back(id - 1);  // vLLM's convention only.
      }
      ASSIGN_OR_RETURN(c.aux_layer_ids,
                       NarrowCaptureLayerIds(
                           ids, absl::StrCat(config_path, ": eagle_aux_hidden_state_layer_ids")));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", e.what()));
  }

  ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/" + kModelFile));
  for (const std::string& name : file->names()) {
    ASSIGN_OR_RETURN(TensorView view, file->Get(name));
    ASSIGN_OR_RETURN(out.tensors[name], TensorFromView(view));
  }
  return out;
}

}  // namespace specstream::student
