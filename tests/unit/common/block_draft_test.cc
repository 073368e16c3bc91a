#include "common/block_draft.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_tokenizer.h"

namespace specstream {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

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
           {0, 36}, {-1, 36}, {1, 0}, {2, 4}, {3, 5}, {34, 36}, {1, kMaxBlockTargetLayers + 1}}) {
    auto ids = DefaultBlockTargetLayerIds(n, layers);
    ASSERT_FALSE(ids.ok()) << n << " of " << layers;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ids.status().message()), HasSubstr("model.draft.target_layer_ids:"));
  }
  EXPECT_TRUE(DefaultBlockTargetLayerIds(33, 36).ok());  // n == L - 3: every layer in [1, 33]
}

// A target directory holding the tiny tokenizer: bytes 0..255, then
// <|endoftext|> (256), <mask> (257), and `extra` special tokens after.
class ResolveMaskTokenIdTest : public ::testing::Test {
 protected:
  void WriteTokenizer(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> specials = {"<|endoftext|>", "<mask>"};
    specials.insert(specials.end(), extra.begin(), extra.end());
    testing::WriteFile(dir_.Join("tokenizer.json"), testing::TinyTokenizerJson(specials));
  }
  void WriteConfig(const std::string& json) {
    testing::WriteFile(dir_.Join("tokenizer_config.json"), json);
  }
  absl::StatusOr<int64_t> Resolve(std::optional<int64_t> field, int64_t rows) {
    return ResolveMaskTokenId(field, dir_.path(), rows);
  }
  static void ExpectRefused(const absl::StatusOr<int64_t>& id, const std::string& why) {
    ASSERT_FALSE(id.ok()) << "resolved to " << *id;
    EXPECT_THAT(std::string(id.status().message()), HasSubstr("model.draft.mask_token_id:"));
    EXPECT_THAT(std::string(id.status().message()), HasSubstr(why));
  }

  testing::TempDir dir_;
};

TEST_F(ResolveMaskTokenIdTest, TheFieldWinsAndNeedsNoTokenizer) {
  EXPECT_EQ(*Resolve(5, 300), 5);  // no tokenizer.json in the directory
  WriteTokenizer();
  WriteConfig(R"({"mask_token": "<mask>"})");
  EXPECT_EQ(*Resolve(0, 300), 0);
  EXPECT_EQ(*Resolve(299, 300), 299);
}

TEST_F(ResolveMaskTokenIdTest, TheFieldMustBeARowOfTheEmbeddingTable) {
  const auto past = Resolve(300, 300);
  ExpectRefused(past, "[0, 300)");
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  ExpectRefused(Resolve(-1, 300), "[0, 300)");
  ExpectRefused(Resolve(std::nullopt, 0), "0 rows");
}

TEST_F(ResolveMaskTokenIdTest, TokenizerConfigMaskTokenAsStringOrAddedToken) {
  WriteTokenizer();
  WriteConfig(R"({"mask_token": "<mask>", "eos_token": "<|endoftext|>"})");
  EXPECT_EQ(*Resolve(std::nullopt, 300), 257);
  WriteConfig(R"({"mask_token": {"__type": "AddedToken", "content": "<mask>", "special": true}})");
  EXPECT_EQ(*Resolve(std::nullopt, 300), 257);
  // Used even when the table has no spare row.
  EXPECT_EQ(*Resolve(std::nullopt, 258), 257);
}

TEST_F(ResolveMaskTokenIdTest, SglangMaskTokenWhenTheConfigNamesNone) {
  WriteTokenizer({"<|MASK|>"});  // id 258
  WriteConfig(R"({"mask_token": null})");
  EXPECT_EQ(*Resolve(std::nullopt, 259), 258);
}

TEST_F(ResolveMaskTokenIdTest, FirstSpareEmbeddingRowWithoutAMaskToken) {
  WriteTokenizer();  // 258 tokens; no tokenizer_config.json at all
  EXPECT_EQ(*Resolve(std::nullopt, 300), 258);
  WriteConfig(R"({"mask_token": null, "pad_token": "<|endoftext|>"})");
  EXPECT_EQ(*Resolve(std::nullopt, 259), 258);
}

TEST_F(ResolveMaskTokenIdTest, RefusedWithNoMaskTokenAndNoSpareRow) {
  WriteTokenizer();
  WriteConfig(R"({"eos_token": "<|endoftext|>"})");
  const auto id = Resolve(std::nullopt, 258);
  ExpectRefused(id, "no spare embedding row");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ResolveMaskTokenIdTest, RefusesAMaskTokenTheTableOrTokenizerLacks) {
  WriteTokenizer();
  WriteConfig(R"({"mask_token": "<mask>"})");
  ExpectRefused(Resolve(std::nullopt, 257), "has id 257");
  WriteConfig(R"({"mask_token": "[MASK]"})");
  ExpectRefused(Resolve(std::nullopt, 300), "\"[MASK]\" is not a token of tokenizer.json");
  WriteConfig(R"({"mask_token": 7})");
  ExpectRefused(Resolve(std::nullopt, 300), "neither a string");
  WriteConfig("not json");
  ExpectRefused(Resolve(std::nullopt, 300), "not a JSON object");
}

TEST_F(ResolveMaskTokenIdTest, AnUnreadableTokenizerNamesTheField) {
  const auto id = Resolve(std::nullopt, 300);  // no tokenizer.json
  ExpectRefused(id, "set the field");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace specstream
