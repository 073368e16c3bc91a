#include "services/daemon/rank_process.h"

#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_env.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RankProcessOptions Shell(const std::string& script) {
  RankProcessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.stop_grace_seconds = 5;
  return options;
}

// Waits for the exit (or fails the test after `timeout`).
std::optional<int> WaitExit(RankProcess& process, absl::Duration timeout = absl::Seconds(10)) {
  std::optional<int> code;
  if (testing::WaitUntil([&] { return (code = process.ExitCode()).has_value(); }, timeout,
                         absl::Milliseconds(10))) {
    return code;
  }
  ADD_FAILURE() << "child did not exit within " << timeout;
  return std::nullopt;
}

// Waits until the child has printed `text` as a line (or 5 s pass).
bool AwaitLine(RankProcess& process, const std::string& text) {
  bool seen = false;
  return testing::WaitUntil(
      [&] {
        for (const auto& line : process.TakeOutput().lines) seen |= line.text == text;
        return seen;
      },
      absl::Seconds(5), absl::Milliseconds(10));
}

std::vector<std::string> Texts(const RankProcessOutput& output, const std::string& stream) {
  std::vector<std::string> texts;
  for (const RankOutputLine& line : output.lines) {
    if (line.stream == stream) texts.push_back(line.text);
  }
  return texts;
}

void AppendLine(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << "\n";
}

TEST(RankProcessTest, CapturesStdoutStderrAndExitCode) {
  auto process = RankProcess::Start(
      Shell("echo out-1; echo err-1 >&2; echo out-2; printf 'no-newline' >&2; exit 3"));
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_GT((*process)->pid(), 0);
  EXPECT_EQ(WaitExit(**process), 3);
  RankProcessOutput output = (*process)->TakeOutput();
  EXPECT_THAT(Texts(output, "stdout"), ElementsAre("out-1", "out-2"));
  EXPECT_THAT(Texts(output, "stderr"), ElementsAre("err-1", "no-newline"));
  EXPECT_EQ((*process)->LastStderr(20), "err-1\nno-newline");
  EXPECT_EQ((*process)->LastStderr(1), "no-newline");
  // Taken lines are not returned again.
  EXPECT_TRUE((*process)->TakeOutput().lines.empty());
}

// P13 item 13: a rank killed before it unlinked its shared-memory rings
// (SIGKILL, the OOM killer) leaves them in /dev/shm; its daemon reclaims
// them, and only its own.
TEST(RankProcessTest, RingsAKilledRankLeftAreReclaimed) {
  const std::string other = "/dev/shm/specstream-1-0-0-keep";  // pid 1's: not ours
  std::ofstream(other).put('x');
  auto process = RankProcess::Start(
      Shell("touch /dev/shm/specstream-$$-0-0-1 /dev/shm/specstream-$$-0-1-2; kill -9 $$"));
  ASSERT_TRUE(process.ok()) << process.status();
  const pid_t pid = (*process)->pid();
  EXPECT_EQ(WaitExit(**process), 128 + 9);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/specstream-" + std::to_string(pid) + "-0-0-1"));
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/specstream-" + std::to_string(pid) + "-0-1-2"));
  EXPECT_TRUE(std::filesystem::exists(other));
  std::filesystem::remove(other);
}

// P13 item 12: a failed job's reason was the tail of the rank's stderr, whose
// first line is the trainer's banner. It is now the line that says why.
TEST(RankProcessTest, TheErrorLineIsTheExitMessageOrTheLastLoggedError) {
  EXPECT_EQ(ErrorLineOf({"[t] [specstream] [info] trainer: rank 0/2 (dp 0/2)",
                         "[t] [specstream] [error] online: teacher a:1 lost",
                         "specstream-student: training step 7: loss is nan",
                         "[t] [specstream] [info] after"}),
            "specstream-student: training step 7: loss is nan");
  EXPECT_EQ(ErrorLineOf({"[t] [specstream] [info] trainer: rank 0/2",
                         "[t] [specstream] [error] checkpoint: disk full", "  "}),
            "[t] [specstream] [error] checkpoint: disk full");
  EXPECT_EQ(ErrorLineOf({"banner", "Segmentation fault", ""}), "Segmentation fault");
  EXPECT_EQ(ErrorLineOf({}), "");

  auto process =
      RankProcess::Start(Shell("echo '[t] [specstream] [info] trainer: rank 0/1 on cpu' >&2; "
                               "echo 'specstream-student: store /x: cannot open' >&2; exit 2"));
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(WaitExit(**process), 2);
  EXPECT_EQ((*process)->ErrorLine(), "specstream-student: store /x: cannot open");
}

TEST(RankProcessTest, ExecFailureIsAnErrorNotAnExit) {
  RankProcessOptions options;
  options.argv = {"/nonexistent/specstream-student", "train"};
  auto process = RankProcess::Start(options);
  ASSERT_FALSE(process.ok());
  EXPECT_EQ(process.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(process.status().message(), HasSubstr("/nonexistent/specstream-student"));
}

TEST(RankProcessTest, RejectsRelativeArgv0AndBadEnv) {
  RankProcessOptions relative;
  relative.argv = {"sh", "-c", "true"};
  EXPECT_EQ(RankProcess::Start(relative).status().code(), absl::StatusCode::kInvalidArgument);
  RankProcessOptions bad_env = Shell("true");
  bad_env.env = {"NO_EQUALS_SIGN"};
  EXPECT_EQ(RankProcess::Start(bad_env).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RankProcessTest, TailsOnlyNewMetricsLines) {
  testing::TempDir dir;
  const std::string metrics = dir.Join("metrics.jsonl");
  AppendLine(metrics, R"({"step":1,"old":true})");
  AppendLine(metrics, R"({"step":2,"old":true})");
  RankProcessOptions options = Shell(
      "echo '{\"step\":3}' >> \"$METRICS\"; sleep 0.3; echo '{\"step\":4}' >> \"$METRICS\"; "
      "exit 0");
  options.env = {"METRICS=" + metrics};
  options.metrics_jsonl = metrics;
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(WaitExit(**process), 0);
  EXPECT_THAT((*process)->TakeOutput().metrics, ElementsAre(R"({"step":3})", R"({"step":4})"));
}

TEST(RankProcessTest, TailsAMetricsFileCreatedAfterStart) {
  testing::TempDir dir;
  const std::string metrics = dir.Join("later.jsonl");
  RankProcessOptions options =
      Shell("sleep 0.3; echo '{\"step\":1}' > \"$METRICS\"; echo '{\"step\":2}' >> \"$METRICS\"");
  options.env = {"METRICS=" + metrics};
  options.metrics_jsonl = metrics;
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  // While it runs, the poller picks lines up without waiting for the exit.
  std::vector<std::string> seen;
  testing::WaitUntil(
      [&] {
        for (std::string& line : (*process)->TakeOutput().metrics) seen.push_back(std::move(line));
        return seen.size() >= 2;
      },
      absl::Seconds(10));
  EXPECT_THAT(seen, ElementsAre(R"({"step":1})", R"({"step":2})"));
  EXPECT_EQ(WaitExit(**process), 0);
}

TEST(RankProcessTest, StopTerminatesPromptly) {
  auto process = RankProcess::Start(Shell("echo ready; exec sleep 100"));
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE(AwaitLine(**process, "ready"));
  EXPECT_FALSE((*process)->ExitCode().has_value());
  const absl::Time start = absl::Now();
  (*process)->Stop();
  EXPECT_TRUE((*process)->stopping());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));  // non-blocking
  EXPECT_EQ(WaitExit(**process, absl::Seconds(3)), 143);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(RankProcessTest, StopReachesTheWholeProcessGroup) {
  // The shell waits for its child `sleep`: SIGTERM must reach the sleep too,
  // else the shell (which defers the trap while waiting) lingers.
  auto process = RankProcess::Start(Shell("echo ready; sleep 100; echo after"));
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE(AwaitLine(**process, "ready"));
  const absl::Time start = absl::Now();
  (*process)->Stop();
  const std::optional<int> code = WaitExit(**process, absl::Seconds(4));
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 137) << "needed SIGKILL";
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// The grace runs on a clock the test moves: 30 s of it pass in no real time.
TEST(RankProcessTest, KillsAChildIgnoringSigtermAfterTheGrace) {
  RankProcessOptions options =
      Shell("trap '' TERM; echo ready; while :; do echo tick; sleep 0.02; done");
  options.stop_grace_seconds = 30;
  testing::FakeEnv clock;
  options.clock = &clock;
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE(AwaitLine(**process, "ready"));  // the trap is installed
  const absl::Time start = absl::Now();
  (*process)->Stop();
  (*process)->Stop();  // a second call changes nothing
  clock.Advance(absl::Seconds(29));
  // Lines the monitor reads after the clock moved: a kill due at 29 s would
  // have been sent on reading the first, and no second would come.
  (*process)->TakeOutput();
  ASSERT_TRUE(AwaitLine(**process, "tick"));
  ASSERT_TRUE(AwaitLine(**process, "tick")) << "killed before the grace ended";
  EXPECT_FALSE((*process)->ExitCode().has_value()) << "SIGTERM should have been ignored";
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(WaitExit(**process, absl::Seconds(5)), 137);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "the grace is on the test's clock";
}

TEST(RankProcessTest, EnvOverridesReplaceInheritedValues) {
  setenv("SPECSTREAM_RANK_PROCESS_TEST_INHERITED", "parent", 1);
  setenv("SPECSTREAM_RANK_PROCESS_TEST_OVERRIDDEN", "parent", 1);
  RankProcessOptions options = Shell(
      "echo \"inherited=$SPECSTREAM_RANK_PROCESS_TEST_INHERITED\"; "
      "echo \"overridden=$SPECSTREAM_RANK_PROCESS_TEST_OVERRIDDEN\"; "
      "echo \"rank=$RANK\"; env | grep -c '^SPECSTREAM_RANK_PROCESS_TEST_OVERRIDDEN='");
  options.env = {"SPECSTREAM_RANK_PROCESS_TEST_OVERRIDDEN=child", "RANK=7"};
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(WaitExit(**process), 0);
  EXPECT_THAT(Texts((*process)->TakeOutput(), "stdout"),
              ElementsAre("inherited=parent", "overridden=child", "rank=7", "1"));
  unsetenv("SPECSTREAM_RANK_PROCESS_TEST_INHERITED");
  unsetenv("SPECSTREAM_RANK_PROCESS_TEST_OVERRIDDEN");
}

TEST(RankProcessTest, WorkingDirectory) {
  testing::TempDir dir;
  RankProcessOptions options = Shell("pwd -P");
  options.working_directory = dir.path();
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(WaitExit(**process), 0);
  const std::vector<std::string> out = Texts((*process)->TakeOutput(), "stdout");
  ASSERT_EQ(out.size(), 1u);
  char resolved[4096];
  ASSERT_NE(realpath(dir.path().c_str(), resolved), nullptr);
  EXPECT_EQ(out[0], resolved);
}

TEST(RankProcessTest, BoundsBufferedLinesDroppingTheOldest) {
  RankProcessOptions options =
      Shell("i=1; while [ $i -le 100 ]; do echo line-$i; i=$((i+1)); done");
  options.max_buffered_lines = 10;
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(WaitExit(**process), 0);
  RankProcessOutput output = (*process)->TakeOutput();
  ASSERT_EQ(output.lines.size(), 11u);
  EXPECT_EQ(output.lines[0].stream, "daemon");
  EXPECT_THAT(output.lines[0].text, HasSubstr("90 earlier output lines dropped"));
  EXPECT_EQ(output.lines[1].text, "line-91");
  EXPECT_EQ(output.lines[10].text, "line-100");
  // The marker is reported once.
  EXPECT_TRUE((*process)->TakeOutput().lines.empty());
}

TEST(RankProcessTest, SplitsOverlongLinesAndRepairsUtf8) {
  RankProcessOptions options = Shell("printf 'abcdefghij\\n'; printf 'bad \\377 byte\\n'");
  options.max_line_bytes = 4;
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(WaitExit(**process), 0);
  const std::vector<std::string> out = Texts((*process)->TakeOutput(), "stdout");
  ASSERT_GE(out.size(), 3u);
  EXPECT_EQ(out[0], "abcd");
  EXPECT_EQ(out[1], "efgh");
  EXPECT_EQ(out[2], "ij");
  for (const std::string& line : out) {
    EXPECT_EQ(line.find('\xff'), std::string::npos) << line;
  }
}

TEST(RankProcessTest, DestructorStopsAndReaps) {
  pid_t pid = 0;
  const absl::Time start = absl::Now();
  {
    auto process = RankProcess::Start(Shell("exec sleep 100"));
    ASSERT_TRUE(process.ok()) << process.status();
    pid = (*process)->pid();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // Reaped: the pid no longer names our child.
  EXPECT_NE(kill(pid, 0), 0);
}

}  // namespace
}  // namespace specstream::services
