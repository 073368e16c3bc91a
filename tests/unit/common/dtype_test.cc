#include "common/dtype.h"

#include "gtest/gtest.h"

namespace specstream {
namespace {

TEST(DTypeTest, NamesAndSizesRoundTrip) {
  struct Case {
    const char* name;
    size_t size;
  };
  for (Case c : {Case{"F32", 4}, Case{"F16", 2}, Case{"BF16", 2}, Case{"I64", 8}, Case{"I32", 4},
                 Case{"U8", 1}, Case{"BOOL", 1}}) {
    auto dtype = ParseDType(c.name);
    ASSERT_TRUE(dtype.ok()) << c.name;
    EXPECT_EQ(DTypeName(*dtype), c.name);
    EXPECT_EQ(DTypeSize(*dtype), c.size) << c.name;
  }
}

TEST(DTypeTest, UnknownDTypeIsNamed) {
  auto dtype = ParseDType("F8_E4M3");
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.status().message().find("F8_E4M3"), std::string::npos);
  EXPECT_FALSE(ParseDType("f32").ok());  // names are case-sensitive
}

TEST(DTypeTest, NumElements) {
  EXPECT_EQ(*NumElements({}), 1u);
  EXPECT_EQ(*NumElements({2, 3, 4}), 24u);
  EXPECT_EQ(*NumElements({5, 0}), 0u);
  EXPECT_FALSE(NumElements({-1}).ok());
  EXPECT_FALSE(NumElements({1LL << 40, 1LL << 40}).ok());
}

}  // namespace
}  // namespace specstream
