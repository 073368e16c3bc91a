#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

using ::testing::HasSubstr;

// Everything the child writes to `fd` until it closes it (the pipes are
// non-blocking: poll, then read).
std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10'000) <= 0) break;
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

struct ShResult {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs `script` under /bin/sh with captured output.
ShResult Sh(const std::string& script, SubprocessOptions options = {}) {
  options.argv = {"/bin/sh", "-c", script};
  options.capture_output = true;
  absl::StatusOr<SpawnedProcess> child = Spawn(options);
  EXPECT_TRUE(child.ok()) << child.status();
  ShResult run;
  if (!child.ok()) return run;
  run.out = ReadAll(child->stdout_fd);
  run.err = ReadAll(child->stderr_fd);
  run.code = WaitForExit(child->pid, /*block=*/true).value_or(-1);
  return run;
}

TEST(SubprocessTest, CapturesOutputAndTheExitCode) {
  ShResult run = Sh("echo out; echo err >&2; exit 3");
  EXPECT_EQ(run.out, "out\n");
  EXPECT_EQ(run.err, "err\n");
  EXPECT_EQ(run.code, 3);
}

TEST(SubprocessTest, StdinIsEmptyWhenOutputIsCaptured) {
  EXPECT_EQ(Sh("cat; echo done").out, "done\n");
}

TEST(SubprocessTest, EnvironmentEntriesAreAddedReplacedAndUnset) {
  ASSERT_EQ(setenv("SPECSTREAM_SUBPROCESS_KEEP", "kept", 1), 0);
  ASSERT_EQ(setenv("SPECSTREAM_SUBPROCESS_REPLACE", "old", 1), 0);
  ASSERT_EQ(setenv("SPECSTREAM_SUBPROCESS_DROP", "dropped", 1), 0);
  SubprocessOptions options;
  options.env = {"SPECSTREAM_SUBPROCESS_REPLACE=new", "SPECSTREAM_SUBPROCESS_ADDED=a=b"};
  options.unset_env = {"SPECSTREAM_SUBPROCESS_DROP"};
  ShResult run =
      Sh("echo \"$SPECSTREAM_SUBPROCESS_KEEP $SPECSTREAM_SUBPROCESS_REPLACE "
         "$SPECSTREAM_SUBPROCESS_ADDED ${SPECSTREAM_SUBPROCESS_DROP-unset}\"; "
         "env | grep -c '^SPECSTREAM_SUBPROCESS_REPLACE='",
         options);
  EXPECT_EQ(run.out, "kept new a=b unset\n1\n");
  unsetenv("SPECSTREAM_SUBPROCESS_KEEP");
  unsetenv("SPECSTREAM_SUBPROCESS_REPLACE");
  unsetenv("SPECSTREAM_SUBPROCESS_DROP");
}

TEST(SubprocessTest, RunsInTheWorkingDirectoryAndItsOwnProcessGroup) {
  testing::TempDir dir;
  SubprocessOptions options;
  options.working_directory = dir.path();
  options.own_process_group = true;
  // /proc/<pid>/stat: pid (comm) state ppid pgrp ...
  ShResult run = Sh("pwd; cut -d' ' -f5 /proc/$$/stat; echo $$", options);
  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << run.out;
  char real[PATH_MAX];
  ASSERT_NE(realpath(dir.path().c_str(), real), nullptr);
  EXPECT_EQ(lines[0], real);
  EXPECT_EQ(lines[1], lines[2]) << "the child leads its own process group";
}

// No descriptor of the parent's but 0-2 reaches the child, and its signal
// mask and dispositions start clean.
TEST(SubprocessTest, TheChildStartsWithoutTheParentsDescriptorsOrSignalMask) {
  const int leaked = open("/dev/null", O_RDONLY);  // not close-on-exec
  ASSERT_GE(leaked, 3);
  sigset_t blocked, old;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGUSR1);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &blocked, &old), 0);
  ShResult run = Sh("ls /proc/self/fd | sort -n | tr '\\n' ' '; grep SigBlk /proc/self/status");
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(leaked);
  // ls's own directory descriptor is the one past stderr.
  EXPECT_THAT(run.out, HasSubstr("0 1 2 3 "));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("4 ")));
  EXPECT_THAT(run.out, HasSubstr("SigBlk:\t0000000000000000"));
}

TEST(SubprocessTest, RefusesBadOptionsAndReportsAFailedExec) {
  SubprocessOptions options;
  EXPECT_EQ(Spawn(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.argv = {"sh", "-c", "true"};
  absl::Status relative = Spawn(options).status();
  EXPECT_EQ(relative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(relative.message()), HasSubstr("argv[0]"));
  options.argv = {"/bin/true"};
  options.env = {"NOEQUALS"};
  absl::Status env = Spawn(options).status();
  EXPECT_EQ(env.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(env.message()), HasSubstr("NOEQUALS"));
  options.env = {};
  options.argv = {"/nonexistent/specstream-binary"};
  absl::Status missing = Spawn(options).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("/nonexistent/specstream-binary"));
  testing::TempDir dir;
  const std::string data = dir.Join("data.txt");  // exists, not executable
  testing::WriteFile(data, "not a program\n");
  options.argv = {data};
  EXPECT_EQ(Spawn(options).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SubprocessTest, WaitForExitReportsSignalsAndRunningChildren) {
  SubprocessOptions options;
  options.argv = {"/bin/sleep", "30"};
  absl::StatusOr<SpawnedProcess> child = Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(WaitForExit(child->pid, /*block=*/false), std::nullopt);
  ASSERT_EQ(kill(child->pid, SIGTERM), 0);
  EXPECT_EQ(WaitForExit(child->pid, /*block=*/true), 128 + SIGTERM);
  // Already reaped: not our child any more.
  EXPECT_EQ(WaitForExit(child->pid, /*block=*/true), 1);
}

}  // namespace
}  // namespace specstream
