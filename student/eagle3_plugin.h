// EAGLE-3 (and EAGLE 3.1's flags) as a TrainableDraft (student/draft.h):
// the Eagle3Draft of student/draft_model.h with its TTT steps, its vocab
// map, the capture layers it reads and the LlamaForCausalLMEagle3 export
// (student/export.h).
#ifndef SPECSTREAM_STUDENT_EAGLE3_PLUGIN_H_
#define SPECSTREAM_STUDENT_EAGLE3_PLUGIN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "student/draft.h"
#include "student/draft_model.h"
#include "student/export.h"

namespace specstream::student {

// The registry line of "eagle3".
DraftType Eagle3DraftType();
// P-EAGLE: the EAGLE-3 draft with parallel drafting (Eagle3Options).
DraftType PeagleDraftType();

// The export tensors and config.json fields of a trained draft reading
// `capture_layer_ids` of the target at `target_dir`.
absl::StatusOr<ExportInput> DraftExportInput(const Eagle3Draft& draft,
                                             const std::string& target_dir,
                                             const CaptureLayerIds& capture_layer_ids);

// The Eagle3Draft inside a TrainableDraft of type "eagle3"; null for any
// other type (tests reach the EAGLE-3 specifics through it).
Eagle3Draft* AsEagle3Draft(TrainableDraft& draft);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_EAGLE3_PLUGIN_H_
