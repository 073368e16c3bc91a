// The rules a set of capture layers named per stream obeys (DESIGN §3 and
// §10): the decoder layers whose outputs a draft's aux_hidden concatenates,
// id k = output of layer k (SGLang convention). Shared by the teacher, which
// checks a stream's Open, and the student, which checks what it will ask
// for. LibTorch-free. Thread-safety: pure functions.
#ifndef SPECSTREAM_COMMON_CAPTURE_LAYERS_H_
#define SPECSTREAM_COMMON_CAPTURE_LAYERS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace specstream {

// OK when `ids` are ascending, distinct and each in [0, num_layers) (so at
// most num_layers of them; empty is OK: the caller decides what it means).
// InvalidArgument otherwise, naming `field` (e.g. "open.capture_layer_ids"),
// the offending entry, the whole set and the rule.
absl::Status ValidateCaptureLayerIds(absl::Span<const int32_t> ids, int64_t num_layers,
                                     const std::string& field);

// "[1, 3, 4]", for messages.
std::string CaptureLayerIdsString(absl::Span<const int32_t> ids);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_CAPTURE_LAYERS_H_
