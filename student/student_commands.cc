#include "student/student_commands.h"

#include "absl/strings/str_cat.h"
#include "common/hf_config.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/data_source.h"
#include "student/draft.h"

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

absl::Status ExportCheckpoint(const std::string& checkpoint, const std::string& out_dir) {
  ASSIGN_OR_RETURN(RestoredDraft restored, RestoreDraft(checkpoint));
  ASSIGN_OR_RETURN(HfModelConfig target,
                   LoadHfConfig(restored.state["target_dir"].get<std::string>()));
  return restored.draft->Export(target, out_dir);
}

absl::StatusOr<std::string> EvaluateCheckpoint(const std::string& checkpoint,
                                               const std::string& store, int ttt_steps,
                                               int64_t max_length, const std::string& target_dir) {
  ASSIGN_OR_RETURN(auto source, StoreSource::Open(store));
  RestoreOptions options;
  options.target_dir = target_dir;
  options.need_full_lm_head = !source->has_target_ids();
  options.ttt_steps = ttt_steps;
  ASSIGN_OR_RETURN(RestoredDraft restored, RestoreDraft(checkpoint, options));
  EvalOptions eval;
  eval.max_length = max_length;
  ASSIGN_OR_RETURN(DraftMetrics result, Evaluate(*restored.draft, *source, eval));
  nlohmann::json line = {{"type", restored.draft->type()},
                         {"loss", result.loss},
                         {"acc", result.acc_k},
                         {"sim_accept_len", result.sim_accept_len},
                         {"positions", result.positions}};
  if (result.tau) line["tau"] = *result.tau;
  if (result.calibration_error) line["conf_ece"] = *result.calibration_error;
  return line.dump();
}

}  // namespace specstream::student
