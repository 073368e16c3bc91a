// Parity of specstream::Tokenizer with the reference tokenizer
// (@lenml/tokenizers, a transformers.js derivative) on the real Qwen3 and
// Llama-3 tokenizer.json files. Fixtures come from
// tests/testing/fetch_fixtures.sh: <fixtures>/tokenizers/<name>/
// {tokenizer.json, reference.jsonl}. Missing fixtures skip the test locally
// and fail it under CI=true.
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer.h"
#include "common/unicode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

struct ParityCase {
  const char* name;
  bool nfc;  // the tokenizer normalizes to NFC, so Decode gives NFC(text)
};

void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.name; }

std::string IdsToString(const std::vector<int32_t>& ids) {
  std::ostringstream out;
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  return out.str();
}

class TokenizerParityTest : public ::testing::TestWithParam<ParityCase> {};

TEST_P(TokenizerParityTest, MatchesReferenceIdsAndRoundTrips) {
  const ParityCase& param = GetParam();
  const std::string dir = specstream::testing::FixturesDir() + "/tokenizers/" + param.name;
  const std::string reference_path = dir + "/reference.jsonl";
  if (!specstream::testing::FileExists(dir + "/tokenizer.json") ||
      !specstream::testing::FileExists(reference_path)) {
    const std::string message = "missing fixtures in " + dir +
                                "; run tests/testing/fetch_fixtures.sh " +
                                specstream::testing::FixturesDir();
    if (specstream::testing::RunningInCi()) FAIL() << message;
    GTEST_SKIP() << message;
  }
  auto tokenizer = Tokenizer::FromDirectory(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  std::istringstream lines(specstream::testing::ReadFile(reference_path));
  std::string line;
  int total = 0;
  int exact = 0;
  int round_trips = 0;
  int reported = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line);
    const std::string text = record.at("text").get<std::string>();
    const std::vector<int32_t> expected = record.at("ids").get<std::vector<int32_t>>();
    ++total;

    auto encoding = (*tokenizer)->Encode(text);
    ASSERT_TRUE(encoding.ok()) << encoding.status() << " for " << nlohmann::json(text).dump();
    if (encoding->ids == expected) {
      ++exact;
    } else if (reported++ < 10) {
      ADD_FAILURE() << param.name << ": ids differ for " << nlohmann::json(text).dump()
                    << "\n  expected " << IdsToString(expected) << "\n  actual   "
                    << IdsToString(encoding->ids);
    }

    // Offsets: one per id, inside the text, begins and ends non-decreasing.
    ASSERT_EQ(encoding->offsets.size(), encoding->ids.size());
    size_t last_begin = 0;
    size_t last_end = 0;
    for (const auto& [begin, end] : encoding->offsets) {
      EXPECT_LE(begin, end);
      EXPECT_LE(end, text.size());
      EXPECT_GE(begin, last_begin);
      EXPECT_GE(end, last_end);
      last_begin = begin;
      last_end = end;
    }

    std::string want = text;
    if (param.nfc) {
      auto normalized = unicode::NormalizeNfc(text);
      ASSERT_TRUE(normalized.ok()) << normalized.status();
      want = *normalized;
    }
    auto decoded = (*tokenizer)->Decode(expected);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (*decoded == want) {
      ++round_trips;
    } else {
      ADD_FAILURE() << param.name << ": Decode(ids) != text for " << nlohmann::json(text).dump()
                    << ": got " << nlohmann::json(*decoded).dump();
    }
  }
  std::printf("%s: %d/%d exact, %d/%d decode round trips\n", param.name, exact, total, round_trips,
              total);
  EXPECT_GT(total, 0);
  EXPECT_EQ(exact, total);
  EXPECT_EQ(round_trips, total);
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, TokenizerParityTest,
                         ::testing::Values(ParityCase{"qwen3", true}, ParityCase{"llama3", false}),
                         [](const ::testing::TestParamInfo<ParityCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace specstream
