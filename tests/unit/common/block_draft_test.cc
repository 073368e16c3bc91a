#include "common/block_draft.h"

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

using ::testing::HasSubstr;

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
