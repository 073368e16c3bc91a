// DFlash and DSpark (student/block_draft.h) as TrainableDrafts
// (student/draft.h): a step's plan is its anchors, its normaliser the
// weight sum, its export SGLang's DFlashDraftModel / Qwen3DSparkModel
// (student/block_export.h).
#ifndef SPECSTREAM_STUDENT_BLOCK_PLUGIN_H_
#define SPECSTREAM_STUDENT_BLOCK_PLUGIN_H_

#include "student/block_draft.h"
#include "student/draft.h"

namespace specstream::student {

// The registry line of "dflash" or "dspark".
DraftType BlockDraftType(BlockDraftKind kind);

// The BlockDraft inside a TrainableDraft of a block type; null for any
// other type (tests reach the block specifics through it).
BlockDraft* AsBlockDraft(TrainableDraft& draft);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_BLOCK_PLUGIN_H_
