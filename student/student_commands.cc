#include "student/student_commands.h"

#include <filesystem>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/hf_config.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/block_export.h"
#include "student/checkpoint.h"
#include "student/data_source.h"
#include "student/export.h"
#include "student/trainer.h"

namespace specstream::student {

nlohmann::json DraftShapeJson(const DraftShape& s) {
  return {{"hidden_size", s.hidden_size},
          {"target_hidden_size", s.target_hidden_size},
          {"num_captures", s.num_captures},
          {"intermediate_size", s.intermediate_size},
          {"num_attention_heads", s.num_attention_heads},
          {"num_key_value_heads", s.num_key_value_heads},
          {"head_dim", s.head_dim},
          {"draft_vocab_size", s.draft_vocab_size},
          {"target_vocab_size", s.target_vocab_size}};
}

absl::StatusOr<DraftShape> DraftShapeFromJson(const nlohmann::json& j) {
  DraftShape s;
  try {
    s.hidden_size = j.at("hidden_size").get<int64_t>();
    s.target_hidden_size = j.at("target_hidden_size").get<int64_t>();
    s.num_captures = j.at("num_captures").get<int64_t>();
    s.intermediate_size = j.at("intermediate_size").get<int64_t>();
    s.num_attention_heads = j.at("num_attention_heads").get<int64_t>();
    s.num_key_value_heads = j.at("num_key_value_heads").get<int64_t>();
    s.head_dim = j.at("head_dim").get<int64_t>();
    s.draft_vocab_size = j.at("draft_vocab_size").get<int64_t>();
    s.target_vocab_size = j.at("target_vocab_size").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("state.json draft_shape: ", e.what()));
  }
  return s;
}

absl::StatusOr<ExportInput> DraftExportInput(const Eagle3Draft& draft,
                                             const std::string& target_dir,
                                             const std::vector<int>& capture_layer_ids) {
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(target_dir));
  ExportInput in;
  ASSIGN_OR_RETURN(in.config, ExportConfigFromTarget(target));
  const DraftShape& s = draft.shape();
  in.config.hidden_size = s.hidden_size;
  in.config.intermediate_size = s.intermediate_size;
  in.config.num_attention_heads = s.num_attention_heads;
  in.config.num_key_value_heads = s.num_key_value_heads;
  in.config.head_dim = s.head_dim;
  in.config.draft_vocab_size = s.draft_vocab_size;
  in.config.vocab_size = s.target_vocab_size;
  in.config.target_hidden_size = s.target_hidden_size == s.hidden_size ? 0 : s.target_hidden_size;
  in.config.aux_layer_ids.assign(capture_layer_ids.begin(), capture_layer_ids.end());
  in.config.target_num_hidden_layers = target.num_hidden_layers;
  for (const auto& [name, p] : draft.parameters()) in.tensors[name] = p.detach().clone();
  const VocabMap& map = draft.vocab_map();
  in.tensors["d2t"] = torch::tensor(map.d2t, torch::kInt64);
  in.tensors["t2d"] =
      torch::tensor(std::vector<int64_t>(map.t2d.begin(), map.t2d.end())).to(torch::kBool);
  return in;
}

namespace {

// A draft of `shape` over the target at `target_dir`, its vocab map from the
// d2t/t2d tensors and its parameters from `tensors` (a checkpoint's draft
// tensors or an export's, which share the names). `what` names the source
// in errors.
absl::StatusOr<std::unique_ptr<Eagle3Draft>> BuildDraft(
    DraftShape shape, const std::string& target_dir,
    const std::map<std::string, torch::Tensor>& tensors, bool need_full_lm_head,
    const std::string& what) {
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(target_dir));
  shape.rms_norm_eps = target.rms_norm_eps;
  shape.rope_theta = target.rope_theta;
  shape.rope_scaling = target.rope_scaling;
  shape.max_position_embeddings = target.max_position_embeddings;
  auto d2t = tensors.find("d2t");
  auto t2d = tensors.find("t2d");
  if (d2t == tensors.end() || t2d == tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " lacks d2t/t2d"));
  }
  VocabMap map;
  torch::Tensor d = d2t->second.to(torch::kInt64).contiguous();
  torch::Tensor t = t2d->second.to(torch::kUInt8).contiguous();
  map.d2t.assign(d.data_ptr<int64_t>(), d.data_ptr<int64_t>() + d.numel());
  map.t2d.assign(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
  for (int64_t i = 0; i < map.draft_vocab(); ++i) map.used.push_back(map.d2t[i] + i);
  ASSIGN_OR_RETURN(std::unique_ptr<Eagle3Draft> draft,
                   Eagle3Draft::Create(shape, target_dir, map, 0, need_full_lm_head));
  torch::NoGradGuard no_grad;
  for (auto& [pname, param] : draft->parameters()) {
    auto it = tensors.find(pname);
    if (it == tensors.end() || !it->second.sizes().equals(param.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": draft tensor ", pname, " missing or mis-shaped"));
    }
    param.detach().copy_(it->second);
  }
  return draft;
}

bool IsExportDirectory(const std::string& path) {
  return std::filesystem::exists(std::filesystem::path(path) / "config.json") &&
         std::filesystem::exists(std::filesystem::path(path) / "model.safetensors");
}

// An exported draft (the serving layout): its config gives the shape, the
// target is named by the caller (an export does not record it).
absl::StatusOr<RestoredDraft> RestoreExport(const std::string& path, const std::string& target_dir,
                                            bool need_full_lm_head) {
  if (target_dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint ", path,
                     " is an exported draft, which does not record its target model: pass "
                     "--target DIR"));
  }
  ASSIGN_OR_RETURN(ExportInput in, ReadExport(path));
  const ExportConfig& c = in.config;
  DraftShape shape;
  shape.hidden_size = c.hidden_size;
  shape.target_hidden_size = c.target_hidden_size > 0 ? c.target_hidden_size : c.hidden_size;
  shape.num_captures = static_cast<int64_t>(c.aux_layer_ids.size());
  shape.intermediate_size = c.intermediate_size;
  shape.num_attention_heads = c.num_attention_heads;
  shape.num_key_value_heads = c.num_key_value_heads;
  shape.head_dim = c.head_dim;
  shape.draft_vocab_size = c.draft_vocab_size;
  shape.target_vocab_size = c.vocab_size;
  RestoredDraft restored;
  ASSIGN_OR_RETURN(restored.draft, BuildDraft(shape, target_dir, in.tensors, need_full_lm_head,
                                              absl::StrCat("export ", path)));
  restored.state = {{"target_dir", target_dir}, {"capture_layer_ids", c.aux_layer_ids}};
  return restored;
}

// The contents of a checkpoint: `path` is a root (its newest good step) or
// one step directory.
absl::StatusOr<CheckpointContents> LoadCheckpointAt(const std::string& path) {
  // A step directory is "<root>/step-NNNNNNNN"; anything else is a root.
  std::filesystem::path p(path);
  while (p.has_filename() == false && p.has_parent_path()) p = p.parent_path();
  std::string root = path;
  std::optional<int64_t> step;
  const std::string name = p.filename().string();
  if (name.rfind("step-", 0) == 0) {
    root = p.parent_path().string();
    int64_t parsed = 0;
    if (!absl::SimpleAtoi(name.substr(5), &parsed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--checkpoint ", path, ": bad step directory"));
    }
    step = parsed;
  }
  CheckpointOptions options;
  options.root = root;
  options.read_only = true;
  ASSIGN_OR_RETURN(auto manager, CheckpointManager::Create(options));
  if (step) return manager->Load(*step);
  // The newest checkpoint that verifies.
  ASSIGN_OR_RETURN(std::optional<CheckpointManager::Loaded> loaded, manager->LoadNewest());
  if (!loaded) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
  return std::move(loaded->contents);
}

// Whether `path` holds a block draft (DFlash / DSpark): an export of one,
// or a checkpoint whose state records "block_draft".
}  // namespace

absl::StatusOr<bool> HoldsBlockDraft(const std::string& path) {
  if (IsExportDirectory(path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(path + "/config.json"));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    const nlohmann::json arch =
        j.is_object() ? j.value("architectures", nlohmann::json::array()) : nlohmann::json();
    return arch == nlohmann::json::array({kDFlashArchitecture}) ||
           arch == nlohmann::json::array({kDSparkArchitecture});
  }
  ASSIGN_OR_RETURN(CheckpointContents contents, LoadCheckpointAt(path));
  return contents.state.contains("block_draft");
}

absl::StatusOr<RestoredBlockDraft> RestoreBlockDraft(const std::string& path,
                                                     const std::string& target_dir) {
  RestoredBlockDraft restored;
  BlockDraftOptions options;
  DraftShape shape;
  std::map<std::string, torch::Tensor> tensors;
  std::string target = target_dir;
  std::string what;
  if (IsExportDirectory(path)) {
    if (target.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--checkpoint ", path,
                       " is an exported draft, which does not record its target model: pass "
                       "--target DIR"));
    }
    ASSIGN_OR_RETURN(BlockExport in, ReadBlockExport(path));
    options = in.options;
    shape = in.shape;
    tensors = std::move(in.tensors);
    restored.state = {{"target_dir", target}};
    what = absl::StrCat("export ", path);
  } else {
    ASSIGN_OR_RETURN(CheckpointContents contents, LoadCheckpointAt(path));
    if (!contents.state.contains("block_draft") || !contents.state.contains("draft_shape") ||
        !contents.state.contains("target_dir")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", path, ": state.json lacks block_draft/draft_shape/target_dir"));
    }
    ASSIGN_OR_RETURN(options, BlockDraftOptionsFromJson(contents.state["block_draft"]));
    ASSIGN_OR_RETURN(shape, DraftShapeFromJson(contents.state["draft_shape"]));
    if (target.empty()) target = contents.state["target_dir"].get<std::string>();
    tensors = std::move(contents.draft);
    restored.state = contents.state;
    what = absl::StrCat("checkpoint ", path);
  }
  ASSIGN_OR_RETURN(HfModelConfig config, LoadHfConfig(target));
  shape.rms_norm_eps = config.rms_norm_eps;
  shape.rope_theta = config.rope_theta;
  shape.rope_scaling = config.rope_scaling;
  shape.max_position_embeddings = config.max_position_embeddings;
  ASSIGN_OR_RETURN(restored.draft, BlockDraft::Create(shape, options, target, 0));
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : restored.draft->parameters()) {
    auto it = tensors.find(name);
    if (it == tensors.end() || !it->second.sizes().equals(param.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": draft tensor ", name, " missing or mis-shaped"));
    }
    param.detach().copy_(it->second);
  }
  return restored;
}

absl::StatusOr<RestoredDraft> RestoreDraft(const std::string& path, bool need_full_lm_head,
                                           const std::string& target_dir) {
  if (IsExportDirectory(path)) return RestoreExport(path, target_dir, need_full_lm_head);
  ASSIGN_OR_RETURN(CheckpointContents contents, LoadCheckpointAt(path));
  RestoredDraft restored;
  restored.state = contents.state;
  if (!contents.state.contains("draft_shape") || !contents.state.contains("target_dir")) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": state.json lacks draft_shape/target_dir"));
  }
  ASSIGN_OR_RETURN(DraftShape shape, DraftShapeFromJson(contents.state["draft_shape"]));
  const std::string target =
      target_dir.empty() ? contents.state["target_dir"].get<std::string>() : target_dir;
  ASSIGN_OR_RETURN(restored.draft, BuildDraft(shape, target, contents.draft, need_full_lm_head,
                                              absl::StrCat("checkpoint ", path)));
  return restored;
}

absl::Status ExportCheckpoint(const std::string& checkpoint, const std::string& out_dir) {
  ASSIGN_OR_RETURN(bool block, HoldsBlockDraft(checkpoint));
  if (block) {
    ASSIGN_OR_RETURN(RestoredBlockDraft restored, RestoreBlockDraft(checkpoint));
    ASSIGN_OR_RETURN(HfModelConfig target,
                     LoadHfConfig(restored.state["target_dir"].get<std::string>()));
    return ExportBlockDraft(*restored.draft, target, out_dir);
  }
  ASSIGN_OR_RETURN(RestoredDraft restored, RestoreDraft(checkpoint, false));
  ASSIGN_OR_RETURN(
      ExportInput in,
      DraftExportInput(*restored.draft, restored.state["target_dir"].get<std::string>(),
                       restored.state["capture_layer_ids"].get<std::vector<int>>()));
  return ExportDraft(in, out_dir);
}

absl::StatusOr<std::string> EvaluateCheckpoint(const std::string& checkpoint,
                                               const std::string& store, int ttt_steps,
                                               int64_t max_length, const std::string& target_dir) {
  ASSIGN_OR_RETURN(auto source, StoreSource::Open(store));
  ASSIGN_OR_RETURN(bool block, HoldsBlockDraft(checkpoint));
  if (block) {
    ASSIGN_OR_RETURN(RestoredBlockDraft restored, RestoreBlockDraft(checkpoint, target_dir));
    ASSIGN_OR_RETURN(BlockEvalResult result,
                     EvaluateBlock(*restored.draft, *source, 0, max_length, torch::kFloat32));
    nlohmann::json line = {{"type", BlockDraftKindName(restored.draft->options().kind)},
                           {"loss", result.base.loss},
                           {"acc", result.base.acc_k},
                           {"sim_accept_len", result.base.sim_accept_len},
                           {"tau", result.tau},
                           {"positions", result.base.positions}};
    if (result.calibration_error) line["conf_ece"] = *result.calibration_error;
    return line.dump();
  }
  ASSIGN_OR_RETURN(RestoredDraft restored,
                   RestoreDraft(checkpoint, !source->has_target_ids(), target_dir));
  const int k = ttt_steps > 0 ? ttt_steps : restored.state.value("ttt_steps", 7);
  ASSIGN_OR_RETURN(EvalResult result,
                   Evaluate(*restored.draft, *source, k, max_length, torch::kFloat32));
  nlohmann::json line = {{"loss", result.loss},
                         {"acc", result.acc_k},
                         {"sim_accept_len", result.sim_accept_len},
                         {"positions", result.positions}};
  return line.dump();
}

}  // namespace specstream::student
