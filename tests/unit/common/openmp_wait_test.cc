#include "common/openmp_wait.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

// Forks; the child sets OMP_WAIT_POLICY to `policy` (unset when null) and
// calls PreferPassiveOpenMpWait with /bin/sh as the binary, which writes the
// policy it sees to `out`. A child that returns from the call writes
// "returned" and exits 7. Returns the child's exit status.
int RunChild(const char* policy, const std::string& out) {
  const std::string script = "printf %s \"$OMP_WAIT_POLICY\" > '" + out + "'";
  pid_t pid = fork();
  if (pid == 0) {
    if (policy) {
      setenv("OMP_WAIT_POLICY", policy, 1);
    } else {
      unsetenv("OMP_WAIT_POLICY");
    }
    char* argv[] = {const_cast<char*>("/bin/sh"), const_cast<char*>("-c"),
                    const_cast<char*>(script.c_str()), nullptr};
    PreferPassiveOpenMpWait(argv, "/bin/sh");
    testing::WriteFile(out, "returned");
    _exit(7);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(OpenMpWaitTest, UnsetPolicyReexecutesWithPassive) {
  testing::TempDir dir;
  EXPECT_EQ(RunChild(nullptr, dir.Join("seen")), 0);
  EXPECT_EQ(testing::ReadFile(dir.Join("seen")), "PASSIVE");
}

TEST(OpenMpWaitTest, PolicyTheUserSetIsKept) {
  testing::TempDir dir;
  EXPECT_EQ(RunChild("ACTIVE", dir.Join("seen")), 7);
  EXPECT_EQ(testing::ReadFile(dir.Join("seen")), "returned");
}

// Where the binary cannot be executed, the call returns and children still
// inherit the policy.
TEST(OpenMpWaitTest, FailedExecReturnsWithThePolicySet) {
  pid_t pid = fork();
  if (pid == 0) {
    unsetenv("OMP_WAIT_POLICY");
    char* argv[] = {const_cast<char*>("missing"), nullptr};
    PreferPassiveOpenMpWait(argv, "/nonexistent/binary");
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    _exit(policy && std::string(policy) == "PASSIVE" ? 7 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

}  // namespace
}  // namespace specstream
