// What `specstream-student export` and `eval` do, and the draft <-> export
// conversion the trainer shares with them.
#ifndef SPECSTREAM_STUDENT_STUDENT_COMMANDS_H_
#define SPECSTREAM_STUDENT_STUDENT_COMMANDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "student/block_draft.h"
#include "student/draft_model.h"
#include "student/export.h"

namespace specstream::student {

// The draft's shape and capture ids as stored in checkpoints' state.json.
nlohmann::json DraftShapeJson(const DraftShape& shape);
absl::StatusOr<DraftShape> DraftShapeFromJson(const nlohmann::json& json);

// Export tensors and config.json fields for a trained draft.
absl::StatusOr<ExportInput> DraftExportInput(const Eagle3Draft& draft,
                                             const std::string& target_dir,
                                             const std::vector<int>& capture_layer_ids);

// A draft restored from a checkpoint (`path` is a checkpoint root, whose
// newest good step is used, or one step directory) with its state.json, or
// from an exported draft directory (config.json + model.safetensors; its
// state is {"target_dir", "capture_layer_ids"}). `target_dir` overrides the
// checkpoint's target and is required for an export, which does not record
// it.
struct RestoredDraft {
  std::unique_ptr<Eagle3Draft> draft;
  nlohmann::json state;
};
absl::StatusOr<RestoredDraft> RestoreDraft(const std::string& path, bool need_full_lm_head,
                                           const std::string& target_dir = "");

// The same for a DFlash / DSpark draft: a checkpoint whose state.json
// records "block_draft", or an export (DFlashDraftModel / Qwen3DSparkModel,
// which needs `target_dir`).
struct RestoredBlockDraft {
  std::unique_ptr<BlockDraft> draft;
  nlohmann::json state;
};
absl::StatusOr<RestoredBlockDraft> RestoreBlockDraft(const std::string& path,
                                                     const std::string& target_dir = "");

// Whether `path` (a checkpoint or an export) holds a DFlash / DSpark draft
// rather than an EAGLE-3 one.
absl::StatusOr<bool> HoldsBlockDraft(const std::string& path);

// Export and evaluation take either kind of draft (EAGLE-3 or block).
absl::Status ExportCheckpoint(const std::string& checkpoint, const std::string& out_dir);

// {"loss":..,"acc":[..],"sim_accept_len":..,"positions":..} of a checkpoint
// or an export (RestoreDraft) over an offline store.
absl::StatusOr<std::string> EvaluateCheckpoint(const std::string& checkpoint,
                                               const std::string& store, int ttt_steps,
                                               int64_t max_length,
                                               const std::string& target_dir = "");

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_STUDENT_COMMANDS_H_
