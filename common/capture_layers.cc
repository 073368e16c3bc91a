#include "common/capture_layers.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specstream {

std::string CaptureLayerIdsString(absl::Span<const int32_t> ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ", "), "]");
}

absl::Status ValidateCaptureLayerIds(absl::Span<const int32_t> ids, int64_t num_layers,
                                     const std::string& field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
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

}  // namespace specstream
