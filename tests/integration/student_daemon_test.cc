// The student daemon (services/daemon/student_daemon.h) in-process against
// an in-process coordinator: what Create refuses, what it binds and writes
// before Run, that Run registers it, and that Shutdown ends Run cleanly.
#include "services/daemon/student_daemon.h"

#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "specstream/v1/coordinator.grpc.pb.h"
#include "tests/testing/grpc_health.h"
#include "tests/testing/in_process_coordinator.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

using ::testing::HasSubstr;

StudentDaemonOptions DaemonOptions(const testing::TempDir& dir, const std::string& coordinator) {
  StudentDaemonOptions options;
  options.coordinator = coordinator;
  options.host = "127.0.0.1";
  options.name = "student-under-test";
  options.workdir = dir.Join("work");
  options.train_executable = "/bin/true";  // no rank is assigned here
  options.port_file = dir.Join("student.port");
  options.metrics_port = 0;
  options.metrics_port_file = dir.Join("student.metrics.port");
  options.devices = {"cpu"};
  return options;
}

TEST(StudentDaemonTest, CreateRefusesBadOptionsNamingTheFlag) {
  testing::TempDir dir;
  struct Case {
    std::function<void(StudentDaemonOptions&)> change;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {[](StudentDaemonOptions& o) { o.port = -1; }, "--port"},
      {[](StudentDaemonOptions& o) { o.metrics_port = -2; }, "--metrics-port"},
      {[](StudentDaemonOptions& o) { o.workdir.clear(); }, "--workdir"},
      {[](StudentDaemonOptions& o) { o.train_executable = "true"; }, "train executable"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    StudentDaemonOptions options = DaemonOptions(dir, "127.0.0.1:1");
    c.change(options);
    absl::Status status = StudentDaemon::Create(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.flag));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.Join("student.port")));
}

TEST(StudentDaemonTest, BindsBeforeRunRegistersInRunAndShutsDown) {
  testing::TempDir dir;
  testing::InProcessCoordinator coordinator(dir);
  ASSERT_TRUE(coordinator.ok());
  const std::string coordinator_address = coordinator.address();

  absl::StatusOr<std::unique_ptr<StudentDaemon>> daemon =
      StudentDaemon::Create(DaemonOptions(dir, coordinator_address));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // Created: both servers listen and their ports are written; nothing is
  // registered until Run.
  const int port = (*daemon)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*daemon)->address(), absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(testing::ReadFile(dir.Join("student.port")), absl::StrCat(port, "\n"));
  EXPECT_EQ(testing::ReadFile(dir.Join("student.metrics.port")),
            absl::StrCat((*daemon)->metrics_port(), "\n"));
  EXPECT_EQ(testing::HealthCheck((*daemon)->address()), "SERVING");
  EXPECT_TRUE(std::filesystem::is_directory(dir.Join("work")));

  absl::Status ran;
  std::thread runner([&] { ran = (*daemon)->Run(); });
  const v1::ListDaemonsResponse listed = coordinator.AwaitDaemons(1);
  ASSERT_EQ(listed.daemons_size(), 1);
  EXPECT_EQ(listed.daemons(0).info().kind(), v1::DAEMON_KIND_STUDENT);
  EXPECT_EQ(listed.daemons(0).info().name(), "student-under-test");
  EXPECT_EQ(listed.daemons(0).info().address(), (*daemon)->address());

  (*daemon)->Shutdown();
  runner.join();
  EXPECT_TRUE(ran.ok()) << ran;
  daemon->reset();
  EXPECT_THAT(testing::HealthCheck(absl::StrCat("127.0.0.1:", port), absl::Seconds(1)),
              HasSubstr("error"));
}

}  // namespace
}  // namespace specstream::services
