#include "student/block_export.h"

#include <cmath>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/capture_layers.h"
#include "common/dtype.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/export.h"

namespace specstream::student {
namespace {

constexpr char kConfigFile[] = "config.json";
constexpr char kModelFile[] = "model.safetensors";
// The only Markov head BlockDraft trains (SGLang's VanillaMarkov: an
// embedding W1 and a bias-free Linear W2).
constexpr char kMarkovHeadType[] = "vanilla";

absl::Status ConfigError(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("config.", field, ": ", reason));
}

absl::Status TensorError(absl::string_view name, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", reason));
}

const char* Architecture(BlockDraftKind kind) {
  return kind == BlockDraftKind::kDFlash ? kDFlashArchitecture : kDSparkArchitecture;
}

// The Qwen3 part of config.json, as the target-config code writes Qwen3
// configs (so the field names are the ones transformers' Qwen3Config reads).
HfModelConfig DraftHfConfig(const BlockExport& in) {
  const DraftShape& s = in.shape;
  HfModelConfig c;
  c.model_type = "qwen3";
  c.architectures = {Architecture(in.options.kind)};
  c.vocab_size = s.target_vocab_size;
  c.hidden_size = s.hidden_size;
  c.intermediate_size = s.intermediate_size;
  c.num_hidden_layers = in.options.num_layers;
  c.num_attention_heads = s.num_attention_heads;
  c.num_key_value_heads = s.num_key_value_heads;
  c.head_dim = s.head_dim;
  c.max_position_embeddings = s.max_position_embeddings;
  c.rope_theta = s.rope_theta;
  c.rope_scaling = s.rope_scaling;
  c.rms_norm_eps = s.rms_norm_eps;
  c.tie_word_embeddings = false;
  c.attention_bias = false;
  c.hidden_act = "silu";
  c.max_window_layers = in.options.num_layers;
  c.torch_dtype = in.torch_dtype;
  c.bos_token_id = in.bos_token_id;
  c.eos_token_ids = in.eos_token_ids;
  c.eos_token_id_is_list = in.eos_token_id_is_list;
  return c;
}

absl::Status ValidateConfig(const BlockExport& in) {
  const DraftShape& s = in.shape;
  const BlockDraftOptions& o = in.options;
  const bool dspark = o.kind == BlockDraftKind::kDSpark;
  RETURN_IF_ERROR(ExportWeightDtype(in.torch_dtype).status());
  absl::Status qwen3 = ValidateHfConfig(DraftHfConfig(in));
  if (!qwen3.ok()) return absl::InvalidArgumentError(absl::StrCat("config: ", qwen3.message()));
  if (s.target_hidden_size != s.hidden_size) {
    return ConfigError(
        "hidden_size",
        absl::StrCat(s.hidden_size, " differs from the target's ", s.target_hidden_size,
                     " (the draft reads the target's embeddings and lm_head)"));
  }
  if (o.block_size < (dspark ? 1 : 2)) {
    return ConfigError("block_size",
                       absl::StrCat("must be >= ", dspark ? 1 : 2, ", got ", o.block_size));
  }
  if (o.mask_token_id < 0 || o.mask_token_id >= s.target_vocab_size) {
    return ConfigError("mask_token_id", absl::StrCat(o.mask_token_id, " is outside the vocab [0, ",
                                                     s.target_vocab_size, ")"));
  }
  if (in.num_target_layers <= 0) {
    return ConfigError("num_target_layers",
                       absl::StrCat("must be > 0, got ", in.num_target_layers));
  }
  if (o.target_layer_ids.empty()) return ConfigError("target_layer_ids", "must not be empty");
  if (static_cast<int64_t>(o.target_layer_ids.size()) != s.num_captures) {
    return ConfigError("target_layer_ids",
                       absl::StrCat(o.target_layer_ids.size(), " ids for ", s.num_captures,
                                    " captured layers (fc reads num_captures · hidden_size)"));
  }
  for (int64_t id : o.target_layer_ids) {
    // SGLang refuses ids outside the target (resolve_target_layer_ids).
    if (id < 0 || id >= in.num_target_layers) {
      return ConfigError(
          "target_layer_ids",
          absl::StrCat("id ", id, " is not a layer of the target's ", in.num_target_layers));
    }
  }
  if (dspark && o.markov_rank <= 0) {
    return ConfigError("markov_rank",
                       absl::StrCat("must be > 0 for a dspark draft, got ", o.markov_rank));
  }
  return absl::OkStatus();
}

absl::Status CheckTensor(const std::string& name, const std::vector<int64_t>& expected,
                         const torch::Tensor& t) {
  if (!t.defined()) return TensorError(name, "undefined");
  const std::vector<int64_t> shape = ShapeOf(t);
  if (shape != expected) {
    return TensorError(
        name, absl::StrCat("shape ", ShapeString(shape), ", expected ", ShapeString(expected)));
  }
  if (!t.is_floating_point()) {
    return TensorError(name, absl::StrCat("dtype ", c10::toString(t.scalar_type()),
                                          ", expected a floating-point weight"));
  }
  if (!torch::isfinite(t).all().item<bool>()) return TensorError(name, "contains NaN or infinity");
  return absl::OkStatus();
}

// The value of `key` in dflash_config when present, else at the top level
// (SGLang's parse_dflash_draft_config order).
const nlohmann::json* NestedOrTop(const nlohmann::json& j, const char* key) {
  auto nested = j.find("dflash_config");
  if (nested != j.end() && nested->is_object() && nested->contains(key) &&
      !(*nested)[key].is_null()) {
    return &(*nested)[key];
  }
  auto top = j.find(key);
  return top != j.end() && !top->is_null() ? &*top : nullptr;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> BlockExportTensorShapes(
    const BlockDraftOptions& o, const DraftShape& s) {
  const int64_t h = s.hidden_size, q = s.num_attention_heads * s.head_dim;
  const int64_t kv = s.num_key_value_heads * s.head_dim, d = s.head_dim;
  const int64_t i = s.intermediate_size;
  const int64_t c = static_cast<int64_t>(o.target_layer_ids.size());
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {
      {"fc.weight", {h, c * h}},
      {"hidden_norm.weight", {h}},
  };
  for (int64_t layer = 0; layer < o.num_layers; ++layer) {
    const std::string p = absl::StrCat("layers.", layer, ".");
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    out.push_back({p + "self_attn.q_norm.weight", {d}});
    out.push_back({p + "self_attn.k_norm.weight", {d}});
    out.push_back({p + "mlp.gate_proj.weight", {i, h}});
    out.push_back({p + "mlp.up_proj.weight", {i, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, i}});
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
  }
  out.push_back({"norm.weight", {h}});
  if (o.kind == BlockDraftKind::kDSpark) {
    const int64_t v = s.target_vocab_size, r = o.markov_rank;
    out.push_back({"markov_head.markov_w1.weight", {v, r}});
    out.push_back({"markov_head.markov_w2.weight", {v, r}});
    if (o.confidence_head) {
      out.push_back({"confidence_head.proj.weight", {1, o.confidence_with_markov ? h + r : h}});
      out.push_back({"confidence_head.proj.bias", {1}});
    }
  }
  return out;
}

absl::StatusOr<BlockExport> BlockExportFromDraft(const BlockDraft& draft,
                                                 const HfModelConfig& target,
                                                 const std::string& torch_dtype) {
  BlockExport out;
  out.options = draft.options();
  out.shape = draft.shape();
  out.num_target_layers = target.num_hidden_layers;
  out.bos_token_id = target.bos_token_id;
  out.eos_token_ids = target.eos_token_ids;
  out.eos_token_id_is_list = target.eos_token_id_is_list;
  out.torch_dtype = torch_dtype;
  RETURN_IF_ERROR(CatchTorch("block export", [&] {
    for (const auto& [name, p] : draft.parameters()) {
      out.tensors[name] = p.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
  }));
  return out;
}

absl::Status ValidateBlockExport(const BlockExport& in) {
  RETURN_IF_ERROR(ValidateConfig(in));
  const auto expected = BlockExportTensorShapes(in.options, in.shape);
  std::set<std::string> known;
  for (const auto& [name, shape] : expected) known.insert(name);
  for (const auto& [name, tensor] : in.tensors) {
    if (known.count(name) > 0) continue;
    if (absl::StrContains(name, "embed_tokens") || absl::StrContains(name, "lm_head")) {
      return TensorError(name,
                         "not exported (the servers use the target's embed_tokens and "
                         "lm_head)");
    }
    return TensorError(
        name, absl::StrCat("not part of a ", BlockDraftKindName(in.options.kind), " export"));
  }
  for (const auto& [name, shape] : expected) {
    auto it = in.tensors.find(name);
    if (it == in.tensors.end()) return TensorError(name, "missing");
    absl::Status status;
    RETURN_IF_ERROR(CatchTorch(absl::StrCat("tensor ", name),
                               [&] { status = CheckTensor(name, shape, it->second); }));
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> BlockExportConfigJson(const BlockExport& in) {
  RETURN_IF_ERROR(ValidateConfig(in));
  const BlockDraftOptions& o = in.options;
  nlohmann::json j = nlohmann::json::parse(HfConfigToJson(DraftHfConfig(in)), nullptr, false);
  if (!j.is_object()) return absl::InternalError("block export: cannot re-read the Qwen3 config");
  // Every draft layer attends fully (z-lab's attention reads layer_types[i];
  // SGLang treats full_attention like an absent list).
  j["layer_types"] = std::vector<std::string>(o.num_layers, "full_attention");
  j["block_size"] = o.block_size;
  j["num_target_layers"] = in.num_target_layers;
  if (o.kind == BlockDraftKind::kDFlash) {
    j["dflash_config"] = {{"target_layer_ids", o.target_layer_ids},
                          {"mask_token_id", o.mask_token_id},
                          {"block_size", o.block_size}};
  } else {
    j["mask_token_id"] = o.mask_token_id;
    j["target_layer_ids"] = o.target_layer_ids;
    j["markov_rank"] = o.markov_rank;
    j["markov_head_type"] = kMarkovHeadType;
    j["enable_confidence_head"] = o.confidence_head;
    j["confidence_head_with_markov"] = o.confidence_with_markov;
  }
  nlohmann::json training = {{"num_anchors", o.num_anchors},
                             {"loss_decay_gamma", o.loss_decay_gamma}};
  if (o.kind == BlockDraftKind::kDSpark) {
    training["loss_weights"] = {{"ce", o.ce_weight}, {"l1", o.l1_weight}, {"conf", o.conf_weight}};
  }
  j[kBlockTrainingKey] = training;
  return j;
}

absl::Status WriteBlockExport(const BlockExport& in, const std::string& out_dir) {
  RETURN_IF_ERROR(ValidateBlockExport(in));
  ASSIGN_OR_RETURN(torch::Dtype dtype, ExportWeightDtype(in.torch_dtype));
  ASSIGN_OR_RETURN(nlohmann::json config, BlockExportConfigJson(in));
  // The whole file in memory first: a conversion error leaves no trace.
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");  // What transformers' loaders expect.
  const auto expected = BlockExportTensorShapes(in.options, in.shape);
  for (const auto& [name, shape] : expected) {
    torch::Tensor t;
    RETURN_IF_ERROR(CatchTorch(absl::StrCat("tensor ", name), [&] {
      t = in.tensors.at(name).detach().to(torch::kCPU).to(dtype).contiguous();
    }));
    RETURN_IF_ERROR(AddTensor(writer, name, t));
  }
  ASSIGN_OR_RETURN(std::string model_bytes, writer.Serialize());
  RETURN_IF_ERROR(WriteDraftDirectory(out_dir, config.dump(2) + "\n", model_bytes));
  SS_LOG_INFO("export: wrote {} ({} draft, {} tensors, {})", out_dir,
              BlockDraftKindName(in.options.kind), expected.size(), in.torch_dtype);
  return absl::OkStatus();
}

absl::Status ExportBlockDraft(const BlockDraft& draft, const HfModelConfig& target,
                              const std::string& out_dir, const std::string& torch_dtype) {
  ASSIGN_OR_RETURN(BlockExport in, BlockExportFromDraft(draft, target, torch_dtype));
  return WriteBlockExport(in, out_dir);
}

absl::StatusOr<BlockExport> ReadBlockExport(const std::string& dir) {
  const std::string config_path = dir + "/" + kConfigFile;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  auto annotate = [&](const absl::Status& status) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", status.message()));
  };
  // The Qwen3 fields, read and checked by the target-config parser.
  absl::StatusOr<HfModelConfig> qwen3 = ParseHfConfig(text);
  if (!qwen3.ok()) return annotate(qwen3.status());
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return annotate(absl::InvalidArgumentError("not a JSON object"));

  BlockExport out;
  BlockDraftOptions& o = out.options;
  DraftShape& s = out.shape;
  const HfModelConfig& c = *qwen3;
  if (c.architectures == std::vector<std::string>{kDFlashArchitecture}) {
    o.kind = BlockDraftKind::kDFlash;
  } else if (c.architectures == std::vector<std::string>{kDSparkArchitecture}) {
    o.kind = BlockDraftKind::kDSpark;
  } else {
    return annotate(ConfigError(
        "architectures", absl::StrCat("[", absl::StrJoin(c.architectures, ", "),
                                      "] is not a block draft (expected [", kDFlashArchitecture,
                                      "] or [", kDSparkArchitecture, "])")));
  }
  const bool dflash = o.kind == BlockDraftKind::kDFlash;
  std::string key;
  try {
    auto read = [&](const char* name) -> const nlohmann::json& {
      key = name;
      const nlohmann::json* value = dflash ? NestedOrTop(j, name) : nullptr;
      if (value == nullptr) value = &j.at(name);  // throws; `key` names the field
      return *value;
    };
    o.num_layers = c.num_hidden_layers;
    o.block_size = read("block_size").get<int64_t>();
    o.mask_token_id = read("mask_token_id").get<int64_t>();
    ASSIGN_OR_RETURN(o.target_layer_ids,
                     NarrowCaptureLayerIds(read("target_layer_ids").get<std::vector<int64_t>>(),
                                           "target_layer_ids"));
    out.num_target_layers = read("num_target_layers").get<int64_t>();
    if (!dflash) {
      key = "markov_head_type";
      const std::string head = j.at(key).get<std::string>();
      if (head != kMarkovHeadType) {
        return annotate(ConfigError(
            key, absl::StrCat("\"", head, "\" is not supported (only \"", kMarkovHeadType, "\")")));
      }
      o.markov_rank = read("markov_rank").get<int64_t>();
      o.confidence_head = read("enable_confidence_head").get<bool>();
      o.confidence_with_markov = read("confidence_head_with_markov").get<bool>();
    }
    out.has_training_options = j.contains(kBlockTrainingKey);
    if (out.has_training_options) {
      const nlohmann::json& training = j.at(kBlockTrainingKey);
      key = absl::StrCat(kBlockTrainingKey, ".num_anchors");
      o.num_anchors = training.at("num_anchors").get<int64_t>();
      key = absl::StrCat(kBlockTrainingKey, ".loss_decay_gamma");
      o.loss_decay_gamma = training.at("loss_decay_gamma").get<double>();
      if (!dflash) {
        key = absl::StrCat(kBlockTrainingKey, ".loss_weights");
        const nlohmann::json& weights = training.at("loss_weights");
        o.ce_weight = weights.at("ce").get<double>();
        o.l1_weight = weights.at("l1").get<double>();
        o.conf_weight = weights.at("conf").get<double>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return annotate(ConfigError(key, e.what()));
  }
  // The draft's Qwen3 config has the shape a draft of its own sizes has.
  s = TargetDraftShape(c, static_cast<int64_t>(o.target_layer_ids.size()));
  out.bos_token_id = c.bos_token_id;
  out.eos_token_ids = c.eos_token_ids;
  out.eos_token_id_is_list = c.eos_token_id_is_list;
  out.torch_dtype = c.torch_dtype.empty() ? "bfloat16" : c.torch_dtype;

  ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/" + kModelFile));
  for (const std::string& name : file->names()) {
    ASSIGN_OR_RETURN(TensorView view, file->Get(name));
    ASSIGN_OR_RETURN(out.tensors[name], TensorFromView(view));
  }
  absl::Status valid = ValidateBlockExport(out);
  if (!valid.ok()) return Annotate(valid, absl::StrCat("block export ", dir));
  return out;
}

}  // namespace specstream::student
