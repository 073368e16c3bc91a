#include "common/capture_layers.h"

#include <vector>

#include "gtest/gtest.h"

namespace specstream {
namespace {

TEST(CaptureLayersTest, AscendingDistinctIdsWithinTheModelAreAccepted) {
  for (const std::vector<int32_t>& ids :
       {std::vector<int32_t>{}, {0}, {7}, {1, 3}, {0, 2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}}) {
    EXPECT_TRUE(ValidateCaptureLayerIds(ids, 8, "open.capture_layer_ids").ok())
        << CaptureLayerIdsString(ids);
  }
}

TEST(CaptureLayersTest, RefusalsNameTheFieldTheEntryAndTheRule) {
  struct Case {
    std::vector<int32_t> ids;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{3, 1}, "open.capture_layer_ids[1]: 1 follows 3 (not ascending) in [3, 1]"},
      {{2, 2}, "open.capture_layer_ids[1]: 2 repeats in [2, 2]"},
      {{0, 8}, "open.capture_layer_ids[1]: 8 is outside [0, 8) (the target has 8 layers)"},
      {{-1}, "open.capture_layer_ids[0]: -1 is outside [0, 8)"},
  };
  for (const Case& c : cases) {
    const absl::Status status = ValidateCaptureLayerIds(c.ids, 8, "open.capture_layer_ids");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status;
    EXPECT_NE(status.message().find("must be ascending, distinct and in [0, 8)"), std::string::npos)
        << status;
  }
  // A long hostile set is quoted only in part.
  std::vector<int32_t> many(10000, 3);
  const absl::Status status = ValidateCaptureLayerIds(many, 8, "ids");
  EXPECT_LT(status.message().size(), 1000u) << status.message().size();
  EXPECT_NE(status.message().find("ids[1]: 3 repeats"), std::string::npos) << status;
}

}  // namespace
}  // namespace specstream
