#include "common/capture_layers.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specstream {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

TEST(CaptureLayersTest, AscendingDistinctIdsWithinTheModelAreAccepted) {
  for (const CaptureLayerIds& ids :
       {CaptureLayerIds{}, {0}, {7}, {1, 3}, {0, 2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}}) {
    EXPECT_TRUE(ValidateCaptureLayerIds(ids, 8, "open.capture_layer_ids").ok())
        << CaptureLayerIdsString(ids);
  }
}

TEST(CaptureLayersTest, RefusalsNameTheFieldTheEntryAndTheRule) {
  struct Case {
    CaptureLayerIds ids;
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
  CaptureLayerIds many(10000, 3);
  const absl::Status status = ValidateCaptureLayerIds(many, 8, "ids");
  EXPECT_LT(status.message().size(), 1000u) << status.message().size();
  EXPECT_NE(status.message().find("ids[1]: 3 repeats"), std::string::npos) << status;
}

TEST(CaptureLayersTest, WideIdsAreNarrowedOrRefusedNamingTheField) {
  EXPECT_THAT(*NarrowCaptureLayerIds(std::vector<int64_t>{1, 14, 26}, "f"), ElementsAre(1, 14, 26));
  auto wide = NarrowCaptureLayerIds(std::vector<int64_t>{1, int64_t{1} << 40},
                                    "model.draft.target_layer_ids");
  ASSERT_FALSE(wide.ok());
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wide.status().message()),
              HasSubstr("model.draft.target_layer_ids[1]: 1099511627776 is no layer id"));
}

TEST(Eagle3CaptureLayersTest, DefaultIsOneHalfMinusOneAndMinusFour) {
  EXPECT_THAT(*DefaultEagle3CaptureLayers(32), ElementsAre(1, 15, 28));
  EXPECT_THAT(*DefaultEagle3CaptureLayers(36), ElementsAre(1, 17, 32));
  EXPECT_THAT(*DefaultEagle3CaptureLayers(28), ElementsAre(1, 13, 24));
  EXPECT_THAT(*DefaultEagle3CaptureLayers(8), ElementsAre(1, 3, 4));
  EXPECT_THAT(*DefaultEagle3CaptureLayers(9), ElementsAre(1, 3, 5));
  for (int layers : {0, 1, 4, 6, 7}) {
    auto ids = DefaultEagle3CaptureLayers(layers);
    ASSERT_FALSE(ids.ok()) << layers;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ids.status().message(), AllOf(HasSubstr("8"), HasSubstr("capture layer ids")));
  }
}

TEST(Eagle3CaptureLayersTest, ServableSetsAreThreeAscendingBelowTheLastLayer) {
  EXPECT_TRUE(ValidateEagle3CaptureLayers(CaptureLayerIds{1, 15, 28}, 32).ok());
  EXPECT_TRUE(ValidateEagle3CaptureLayers(CaptureLayerIds{1, 15, 30}, 32).ok());
  EXPECT_TRUE(ValidateEagle3CaptureLayers(CaptureLayerIds{1, 15, 31}, 0).ok());  // no layer count
  const std::vector<std::pair<CaptureLayerIds, std::string>> refused = {
      {{1, 15}, "need exactly 3 capture ids, got 2 ([1, 15])"},
      {{1, 15, 28, 29}, "need exactly 3 capture ids, got 4"},
      {{15, 1, 28}, "must be distinct, ascending and >= 0, got [15, 1, 28]"},
      {{1, 1, 28}, "must be distinct, ascending and >= 0"},
      {{-1, 15, 28}, "must be distinct, ascending and >= 0"},
      {{1, 15, 31}, "id 31 is not below target layers - 1 (31)"},
  };
  for (const auto& [ids, message] : refused) {
    const absl::Status status = ValidateEagle3CaptureLayers(ids, 32);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message));
  }
}

TEST(DefaultBlockTargetLayerIdsTest, OneDraftLayerReadsTheMiddleLayer) {
  EXPECT_THAT(*DefaultBlockTargetLayerIds(1, 36), ElementsAre(18));
  EXPECT_THAT(*DefaultBlockTargetLayerIds(1, 7), ElementsAre(3));
  EXPECT_THAT(*DefaultBlockTargetLayerIds(1, 1), ElementsAre(0));
}

TEST(DefaultBlockTargetLayerIdsTest, EvenlySpacedFromOneToLMinusThree) {
  // The public DSpark recipes for Qwen3-4B/8B (36 layers, 5 draft layers).
  EXPECT_THAT(*DefaultBlockTargetLayerIds(5, 36), ElementsAre(1, 9, 17, 25, 33));
  EXPECT_THAT(*DefaultBlockTargetLayerIds(5, 48), ElementsAre(1, 12, 23, 34, 45));
  EXPECT_THAT(*DefaultBlockTargetLayerIds(4, 32), ElementsAre(1, 10, 20, 29));  // 10.33, 19.67
  EXPECT_THAT(*DefaultBlockTargetLayerIds(6, 28), ElementsAre(1, 6, 11, 15, 20, 25));
  EXPECT_THAT(*DefaultBlockTargetLayerIds(2, 5), ElementsAre(1, 2));  // the smallest target for 2
}

TEST(DefaultBlockTargetLayerIdsTest, ExactHalvesRoundToEvenAsPythonDoes) {
  EXPECT_THAT(*DefaultBlockTargetLayerIds(3, 13), ElementsAre(1, 6, 10));  // 5.5 -> 6
  EXPECT_THAT(*DefaultBlockTargetLayerIds(3, 15), ElementsAre(1, 6, 12));  // 6.5 -> 6
  EXPECT_THAT(*DefaultBlockTargetLayerIds(3, 17), ElementsAre(1, 8, 14));  // 7.5 -> 8
}

// Every (n, L) against the reference computed in doubles the way the Python
// does it (nearbyint rounds halves to even in the default rounding mode).
TEST(DefaultBlockTargetLayerIdsTest, MatchesTheFloatReferenceAndIsDistinct) {
  for (int64_t layers = 5; layers <= 96; ++layers) {
    for (int64_t n = 2; n <= layers - 3; ++n) {
      auto ids = DefaultBlockTargetLayerIds(n, layers);
      ASSERT_TRUE(ids.ok()) << n << " of " << layers << ": " << ids.status();
      std::vector<int64_t> reference;
      for (int64_t i = 0; i < n; ++i) {
        reference.push_back(static_cast<int64_t>(std::nearbyint(
            1.0 + static_cast<double>(i * (layers - 4)) / static_cast<double>(n - 1))));
      }
      ASSERT_THAT(*ids, ElementsAreArray(reference)) << n << " of " << layers;
      EXPECT_EQ(ids->front(), 1);
      EXPECT_EQ(ids->back(), layers - 3);
      for (size_t i = 1; i < ids->size(); ++i) {
        ASSERT_GT((*ids)[i], (*ids)[i - 1]) << n << " of " << layers;
      }
    }
  }
}

TEST(DefaultBlockTargetLayerIdsTest, RefusesWhenNoDistinctDefaultExists) {
  for (const auto& [n, layers] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 36}, {-1, 36}, {1, 0}, {2, 4}, {3, 5}, {34, 36}, {1, kMaxCaptureTargetLayers + 1}}) {
    auto ids = DefaultBlockTargetLayerIds(n, layers);
    ASSERT_FALSE(ids.ok()) << n << " of " << layers;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ids.status().message()), HasSubstr("model.draft.target_layer_ids:"));
  }
  EXPECT_TRUE(DefaultBlockTargetLayerIds(33, 36).ok());  // n == L - 3: every layer in [1, 33]
}

TEST(BlockTargetLayerIdsTest, TheSpecsIdsWhenSetElseTheDefault) {
  EXPECT_THAT(*BlockTargetLayerIds({}, 1, 36), ElementsAre(18));
  EXPECT_THAT(*BlockTargetLayerIds({2, 30}, 1, 36), ElementsAre(2, 30));
  for (const CaptureLayerIds& ids : {CaptureLayerIds{2, 36}, CaptureLayerIds{-1}}) {
    auto refused = BlockTargetLayerIds(ids, 2, 36);
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(std::string(refused.status().message()),
                AllOf(HasSubstr("model.draft.target_layer_ids: "),
                      HasSubstr("is not a layer of the target (36 layers, ids 0..35)")));
  }
}

}  // namespace
}  // namespace specstream
