// The daemons' credentials (P13 item 7): a name bound to its token, a shared
// token, and the file's errors.
#include "gtest/gtest.h"
#include "services/coordinator/coordinator_service.h"

namespace specstream::services {
namespace {

TEST(DaemonCredentialsTest, ANameIsBoundToItsTokenAndASharedTokenToNone) {
  auto credentials = DaemonCredentials::Parse(
      "# teachers\nteacher-0 tok-teacher\n\nstudent-0\ttok-student\n* tok-shared\n", "file");
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_TRUE(credentials->Check("teacher-0", "tok-teacher").ok());
  EXPECT_TRUE(credentials->Check("student-0", "tok-student").ok());
  // Another daemon's token does not open a name.
  EXPECT_EQ(credentials->Check("student-0", "tok-teacher").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(credentials->Check("teacher-1", "tok-teacher").code(),
            absl::StatusCode::kUnauthenticated);
  // The shared token opens any name.
  EXPECT_TRUE(credentials->Check("teacher-1", "tok-shared").ok());
  EXPECT_EQ(credentials->Check("teacher-0", "").code(), absl::StatusCode::kUnauthenticated);
}

TEST(DaemonCredentialsTest, ABareTokenIsShared) {
  auto credentials = DaemonCredentials::Parse("just-a-token\n", "file");
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_TRUE(credentials->Check("anyone", "just-a-token").ok());
  EXPECT_FALSE(credentials->Check("anyone", "other").ok());
}

TEST(DaemonCredentialsTest, MalformedFilesAreRefusedNamingTheLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"a b c\n", "file line 1: expected"},
      {"a tok\na tok2\n", "file line 2: daemon a is given twice"},
      {"a t\xc3\xa9\n", "file line 1: the token may only hold visible ASCII"},
      {"# nothing\n\n", "file: no credentials"},
  };
  for (const auto& [text, error] : cases) {
    auto credentials = DaemonCredentials::Parse(text, "file");
    ASSERT_FALSE(credentials.ok()) << text;
    EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(credentials.status().message().find(error), std::string::npos)
        << credentials.status();
  }
  auto missing = DaemonCredentials::Load("/nonexistent/daemon-tokens");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--daemon-token-file"), std::string::npos);
}

}  // namespace
}  // namespace specstream::services
