#include "student/student_commands.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/hf_config.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/checkpoint.h"
#include "student/data_source.h"
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

absl::StatusOr<RestoredDraft> RestoreDraft(const std::string& path, bool need_full_lm_head) {
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
  if (!step) {
    ASSIGN_OR_RETURN(step, manager->LatestStep());
    if (!step) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
  }
  ASSIGN_OR_RETURN(CheckpointContents contents, manager->Load(*step));
  RestoredDraft restored;
  restored.state = contents.state;
  if (!contents.state.contains("draft_shape") || !contents.state.contains("target_dir")) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": state.json lacks draft_shape/target_dir"));
  }
  ASSIGN_OR_RETURN(DraftShape shape, DraftShapeFromJson(contents.state["draft_shape"]));
  const std::string target_dir = contents.state["target_dir"].get<std::string>();
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(target_dir));
  shape.rms_norm_eps = target.rms_norm_eps;
  shape.rope_theta = target.rope_theta;
  shape.rope_scaling = target.rope_scaling;
  shape.max_position_embeddings = target.max_position_embeddings;
  auto d2t = contents.draft.find("d2t");
  auto t2d = contents.draft.find("t2d");
  if (d2t == contents.draft.end() || t2d == contents.draft.end()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, " lacks d2t/t2d"));
  }
  VocabMap map;
  torch::Tensor d = d2t->second.to(torch::kInt64).contiguous();
  torch::Tensor t = t2d->second.to(torch::kUInt8).contiguous();
  map.d2t.assign(d.data_ptr<int64_t>(), d.data_ptr<int64_t>() + d.numel());
  map.t2d.assign(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
  for (int64_t i = 0; i < map.draft_vocab(); ++i) map.used.push_back(map.d2t[i] + i);
  ASSIGN_OR_RETURN(restored.draft,
                   Eagle3Draft::Create(shape, target_dir, map, 0, need_full_lm_head));
  torch::NoGradGuard no_grad;
  for (auto& [pname, param] : restored.draft->parameters()) {
    auto it = contents.draft.find(pname);
    if (it == contents.draft.end() || !it->second.sizes().equals(param.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", path, ": draft tensor ", pname, " missing or mis-shaped"));
    }
    param.detach().copy_(it->second);
  }
  return restored;
}

absl::Status ExportCheckpoint(const std::string& checkpoint, const std::string& out_dir) {
  ASSIGN_OR_RETURN(RestoredDraft restored, RestoreDraft(checkpoint, false));
  ASSIGN_OR_RETURN(
      ExportInput in,
      DraftExportInput(*restored.draft, restored.state["target_dir"].get<std::string>(),
                       restored.state["capture_layer_ids"].get<std::vector<int>>()));
  return ExportDraft(in, out_dir);
}

absl::StatusOr<std::string> EvaluateCheckpoint(const std::string& checkpoint,
                                               const std::string& store, int ttt_steps,
                                               int64_t max_length) {
  ASSIGN_OR_RETURN(auto source, StoreSource::Open(store));
  ASSIGN_OR_RETURN(RestoredDraft restored, RestoreDraft(checkpoint, !source->has_target_ids()));
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
