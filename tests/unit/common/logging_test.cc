#include "common/logging.h"

#include "gtest/gtest.h"

namespace specstream {
namespace {

LoggingOptions Options(const std::string& role, int rank, const std::string& level) {
  LoggingOptions options;
  options.role = role;
  options.rank = rank;
  options.level = level;
  return options;
}

TEST(LoggingTest, StampsRoleAndRank) {
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(InitLogging(Options("student", 3, "info")));
  SS_LOG_INFO("hello {}", 42);
  SetLogRank(5);
  SS_LOG_INFO("after rendezvous");
  SS_LOG_DEBUG("hidden at info");
  Logger()->flush();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[student:3] [info] hello 42"), std::string::npos) << err;
  EXPECT_NE(err.find("[student:5] [info] after rendezvous"), std::string::npos) << err;
  EXPECT_EQ(err.find("hidden at info"), std::string::npos) << err;
}

TEST(LoggingTest, UnknownLevelIsReported) {
  EXPECT_FALSE(InitLogging(Options("cli", -1, "loud")));
  EXPECT_TRUE(InitLogging(Options("cli", -1, "off")));
  EXPECT_TRUE(InitLogging(Options("cli", -1, "debug")));
}

}  // namespace
}  // namespace specstream
