#include "common/jsonl.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

TEST(JsonlTest, VisitsNonBlankLinesWithLineNumbers) {
  testing::TempDir dir;
  testing::WriteFile(dir.Join("a.jsonl"), "{\"x\":1}\r\n\n   \n{\"x\":2}\n{\"x\":3}");
  std::vector<std::pair<int64_t, int>> seen;
  ASSERT_TRUE(ForEachJsonLine(dir.Join("a.jsonl"), [&](int64_t line, const nlohmann::json& v) {
                seen.emplace_back(line, v["x"].get<int>());
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, int>>{{1, 1}, {4, 2}, {5, 3}}));
}

TEST(JsonlTest, BadLineNamesFileAndLine) {
  testing::TempDir dir;
  testing::WriteFile(dir.Join("b.jsonl"), "{}\n{\"oops\": }\n{}\n");
  int calls = 0;
  absl::Status s = ForEachJsonLine(dir.Join("b.jsonl"), [&](int64_t, const nlohmann::json&) {
    ++calls;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("b.jsonl:2:"), std::string::npos) << s;
  EXPECT_EQ(calls, 1);
}

TEST(JsonlTest, CallbackErrorIsPrefixedAndStops) {
  testing::TempDir dir;
  testing::WriteFile(dir.Join("c.jsonl"), "{}\n{}\n{}\n");
  int calls = 0;
  absl::Status s = ForEachJsonLine(dir.Join("c.jsonl"), [&](int64_t line, const nlohmann::json&) {
    ++calls;
    return line == 2 ? absl::OutOfRangeError("too long") : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("c.jsonl:2: too long"), std::string::npos) << s;
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(ForEachJsonLine(dir.Join("missing.jsonl"), nullptr).code(),
            absl::StatusCode::kNotFound);
}

TEST(JsonlTest, ReadIntArrayChecksTypeAndRange) {
  std::vector<int64_t> out;
  nlohmann::json v = nlohmann::json::parse(R"({"a":[1,2,3],"b":[1,"x"],"c":[5,99],"d":3})");
  ASSERT_TRUE(ReadIntArray(v, "a", 0, 10, &out).ok());
  EXPECT_EQ(out, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_NE(ReadIntArray(v, "b", 0, 10, &out).message().find("\"b\"[1] is not an integer"),
            std::string::npos);
  EXPECT_NE(ReadIntArray(v, "c", 0, 10, &out).message().find("\"c\"[1] = 99"), std::string::npos);
  EXPECT_NE(ReadIntArray(v, "d", 0, 10, &out).message().find("must be an array"),
            std::string::npos);
  EXPECT_NE(ReadIntArray(v, "e", 0, 10, &out).message().find("missing \"e\""), std::string::npos);
}

}  // namespace
}  // namespace specstream
