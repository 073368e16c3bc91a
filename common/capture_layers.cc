#include "common/capture_layers.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specstream {
namespace {

constexpr char kBlockLayerIdsField[] = "model.draft.target_layer_ids";

}  // namespace

std::string CaptureLayerIdsString(absl::Span<const CaptureLayerId> ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ", "), "]");
}

absl::Status ValidateCaptureLayerIds(absl::Span<const CaptureLayerId> ids, int64_t num_layers,
                                     const std::string& field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const CaptureLayerId id = ids[i];
    std::string problem;
    if (id < 0 || id >= num_layers) {
      problem = absl::StrCat(id, " is outside [0, ", num_layers, ") (the target has ", num_layers,
                             " layers)");
    } else if (i > 0 && id == ids[i - 1]) {
      problem = absl::StrCat(id, " repeats");
    } else if (i > 0 && id < ids[i - 1]) {
      problem = absl::StrCat(id, " follows ", ids[i - 1], " (not ascending)");
    }
    if (!problem.empty()) {
      // The set itself is quoted at most in part: a hostile one may be long.
      constexpr size_t kShown = 64;
      const std::string shown = ids.size() <= kShown
                                    ? CaptureLayerIdsString(ids)
                                    : absl::StrCat(CaptureLayerIdsString(ids.subspan(0, kShown)),
                                                   " and ", ids.size() - kShown, " more");
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "]: ", problem, " in ", shown,
          "; capture layer ids must be ascending, distinct and in [0, ", num_layers, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CaptureLayerIds> NarrowCaptureLayerIds(absl::Span<const int64_t> ids,
                                                      const std::string& field) {
  CaptureLayerIds narrow;
  narrow.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < std::numeric_limits<CaptureLayerId>::min() ||
        ids[i] > std::numeric_limits<CaptureLayerId>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", ids[i], " is no layer id (out of int32 range)"));
    }
    narrow.push_back(static_cast<CaptureLayerId>(ids[i]));
  }
  return narrow;
}

absl::StatusOr<CaptureLayerIds> DefaultEagle3CaptureLayers(int64_t num_layers) {
  if (num_layers < 8 || num_layers > kMaxCaptureTargetLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the default EAGLE-3 capture layers {1, L/2-1, L-4} need at least 8 decoder layers (and at "
        "most ",
        kMaxCaptureTargetLayers, "), the model has ", num_layers,
        "; name the capture layer ids explicitly"));
  }
  const auto layers = static_cast<CaptureLayerId>(num_layers);
  return CaptureLayerIds{1, layers / 2 - 1, layers - 4};
}

absl::Status ValidateEagle3CaptureLayers(absl::Span<const CaptureLayerId> ids, int64_t num_layers) {
  if (ids.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("need exactly 3 capture ids, got ", ids.size(),
                                                   " (", CaptureLayerIdsString(ids), ")"));
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    if (ids[k] < 0 || (k > 0 && ids[k] <= ids[k - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("must be distinct, ascending and >= 0, got ", CaptureLayerIdsString(ids)));
    }
    if (num_layers > 0 && ids[k] >= num_layers - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", ids[k], " is not below target layers - 1 (", num_layers - 1,
                       "): the servers capture at the input of layer id + 1"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CaptureLayerIds> DefaultBlockTargetLayerIds(int64_t num_draft_layers,
                                                           int64_t num_target_layers) {
  const int64_t n = num_draft_layers;
  const int64_t layers = num_target_layers;
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kBlockLayerIdsField, ": no default for ", n, " draft layers (need >= 1)"));
  }
  if (layers < 1 || layers > kMaxCaptureTargetLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat(kBlockLayerIdsField, ": no default for a target of ", layers,
                     " layers (need 1 to ", kMaxCaptureTargetLayers, ")"));
  }
  if (n == 1) return CaptureLayerIds{static_cast<CaptureLayerId>(layers / 2)};
  // n ids in [1, L − 3] are distinct only if that range holds n layers: with
  // a spacing (L − 4)/(n − 1) >= 1 no two round to the same integer.
  if (n > layers - 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(kBlockLayerIdsField, ": cannot default ", n,
                     " distinct ids evenly spaced in [1, L - 3] for a ", "target of L = ", layers,
                     " layers (needs L >= ", n + 3, "); set ", kBlockLayerIdsField));
  }
  // round(1 + i·span/d), exact halves to even (Python's round), in integers:
  // i·span <= (L − 4)² stays far inside int64 for L <= kMaxCaptureTargetLayers.
  const int64_t span = layers - 4;
  const int64_t d = n - 1;
  CaptureLayerIds ids;
  ids.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t quotient = i * span / d;
    const int64_t twice_remainder = 2 * (i * span % d);
    int64_t id = 1 + quotient;
    if (twice_remainder > d || (twice_remainder == d && id % 2 == 1)) ++id;
    ids.push_back(static_cast<CaptureLayerId>(id));
  }
  return ids;
}

absl::StatusOr<CaptureLayerIds> BlockTargetLayerIds(const CaptureLayerIds& configured,
                                                    int64_t num_layers, int64_t target_layers) {
  if (configured.empty()) return DefaultBlockTargetLayerIds(num_layers, target_layers);
  for (CaptureLayerId id : configured) {
    if (id < 0 || id >= target_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(kBlockLayerIdsField, ": ", id, " is not a layer of the target (",
                       target_layers, " layers, ids 0..", target_layers - 1, ")"));
    }
  }
  return configured;
}

}  // namespace specstream
