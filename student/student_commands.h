// What `specstream-student export` and `eval` do, for any draft type
// (student/draft.h), and the draft-shape record checkpoints share.
#ifndef SPECSTREAM_STUDENT_STUDENT_COMMANDS_H_
#define SPECSTREAM_STUDENT_STUDENT_COMMANDS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "student/draft_model.h"

namespace specstream::student {

// The draft's shape as stored in checkpoints' state.json.
nlohmann::json DraftShapeJson(const DraftShape& shape);
absl::StatusOr<DraftShape> DraftShapeFromJson(const nlohmann::json& json);

// The serving layout of the draft in a checkpoint (root or step directory).
absl::Status ExportCheckpoint(const std::string& checkpoint, const std::string& out_dir);

// One JSON line of a checkpoint's or an export's metrics over an offline
// store (student/draft.h Evaluate): {"type", "loss", "acc", "sim_accept_len",
// "positions"} and, for block drafts, "tau" and DSpark's "conf_ece".
// `ttt_steps` > 0 overrides an EAGLE-3 draft's recorded K; `target_dir`
// overrides a checkpoint's target and is required for an export.
absl::StatusOr<std::string> EvaluateCheckpoint(const std::string& checkpoint,
                                               const std::string& store, int ttt_steps,
                                               int64_t max_length,
                                               const std::string& target_dir = "");

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_STUDENT_COMMANDS_H_
