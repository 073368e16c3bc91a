// Capture layers: the decoder layers whose outputs a draft's fc reads
// (aux_hidden), id k = output of decoder layer k (SGLang convention). One
// id type for every place that holds them (stream requests, model
// descriptions, runtimes, drafts, exports, checkpoints), and every rule a
// set obeys (DESIGN §3 and §10):
//   * any stream's set: ascending, distinct, in [0, L) (ValidateCaptureLayerIds);
//   * EAGLE-3's default {1, L/2 - 1, L - 4} and what its servers can load
//     (DefaultEagle3CaptureLayers, ValidateEagle3CaptureLayers);
//   * the block drafts' (DFlash, DSpark) default spacing (DefaultBlockTargetLayerIds).
// Shared by the teacher, which checks a stream's Open, and the student, which
// checks what it will ask for and export. LibTorch-free. Thread-safety: pure
// functions.
#ifndef SPECSTREAM_COMMON_CAPTURE_LAYERS_H_
#define SPECSTREAM_COMMON_CAPTURE_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace specstream {

// The proto's type (teacher.proto's capture_layer_ids are int32); a model
// has far fewer layers.
using CaptureLayerId = int32_t;
using CaptureLayerIds = std::vector<CaptureLayerId>;

// Layer counts past this are refused where a rule computes ids (they would
// be no model, and the integer arithmetic stays far from overflow).
inline constexpr int64_t kMaxCaptureTargetLayers = int64_t{1} << 20;

// OK when `ids` are ascending, distinct and each in [0, num_layers) (so at
// most num_layers of them; empty is OK: the caller decides what it means).
// InvalidArgument otherwise, naming `field` (e.g. "open.capture_layer_ids"),
// the offending entry, the whole set and the rule.
absl::Status ValidateCaptureLayerIds(absl::Span<const CaptureLayerId> ids, int64_t num_layers,
                                     const std::string& field);

// "[1, 3, 4]", for messages.
std::string CaptureLayerIdsString(absl::Span<const CaptureLayerId> ids);

// Ids that arrive as int64 (a job spec's repeated int64, JSON): each must
// fit CaptureLayerId, else InvalidArgument naming `field`.
absl::StatusOr<CaptureLayerIds> NarrowCaptureLayerIds(absl::Span<const int64_t> ids,
                                                      const std::string& field);

// EAGLE-3's default capture layers: {1, L/2 - 1, L - 4}. InvalidArgument
// below 8 layers, where the ids collide or fall out of range; such models
// must name their capture ids explicitly.
absl::StatusOr<CaptureLayerIds> DefaultEagle3CaptureLayers(int64_t num_layers);

// Whether an EAGLE-3 draft trained on these capture ids can be served:
// exactly three (SGLang's and vLLM's loaders size fc for three), distinct
// and ascending, and each below num_layers - 1 (the servers capture at the
// input of layer id + 1). InvalidArgument with the reason otherwise;
// num_layers <= 0 skips the last check.
absl::Status ValidateEagle3CaptureLayers(absl::Span<const CaptureLayerId> ids, int64_t num_layers);

// The block drafts' default target layers for `num_draft_layers` draft
// layers over a target of `num_target_layers` layers: the public DFlash rule
// (`build_target_layer_ids` in z-lab dflash, SpecForge
// `modeling/draft/dflash.py`, SGLang). One draft layer reads the middle
// target layer, `[L / 2]`; n >= 2 read n ids evenly spaced from 1 to L - 3
// inclusive, `round(1 + i·(L − 4)/(n − 1))` for i in 0..n−1. Python's round()
// sends exact halves to the even integer (13 layers, 3 draft layers:
// 1 + 4.5 = 5.5 -> 6; 15 layers: 6.5 -> 6), and so does this (in integer
// arithmetic, so no float rounding can differ). Ascending and distinct.
// InvalidArgument naming model.draft.target_layer_ids when
// num_draft_layers < 1, num_target_layers < 1 or > kMaxCaptureTargetLayers,
// or (n >= 2) when n > L − 3: fewer than n layers lie in [1, L − 3], so the
// ids could not be distinct.
absl::StatusOr<CaptureLayerIds> DefaultBlockTargetLayerIds(int64_t num_draft_layers,
                                                           int64_t num_target_layers);

// The target layers a block draft reads: `configured` when set (each must
// be a layer of the target: < target_layers), else the default above for
// `num_layers` draft layers. Errors name model.draft.target_layer_ids.
absl::StatusOr<CaptureLayerIds> BlockTargetLayerIds(const CaptureLayerIds& configured,
                                                    int64_t num_layers, int64_t target_layers);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_CAPTURE_LAYERS_H_
