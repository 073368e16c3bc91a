// `specstream-teacher serve` as a library server
// (services/teacher/teacher_daemon.h), in-process over the fake target
// runtime: what it refuses before a model would load, the order it starts
// in (TeacherService and its port file, metrics, the registration), that
// it registers with an in-process coordinator, and that Stop closes it.
#include "services/teacher/teacher_daemon.h"

#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "specstream/v1/coordinator.grpc.pb.h"
#include "tests/testing/fake_target_runtime.h"
#include "tests/testing/grpc_health.h"
#include "tests/testing/in_process_coordinator.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

using ::testing::HasSubstr;

TEST(TeacherDaemonTest, RefusesBeforeAModelWouldLoadNamingTheFlag) {
  struct Case {
    std::function<void(TeacherDaemonOptions&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](TeacherDaemonOptions& o) { o.host = "0.0.0.0"; }, "--token-file: required to serve on"},
      {[](TeacherDaemonOptions& o) { o.coordinator = "127.0.0.1:1"; },
       "--token-file: required with --coordinator"},
      {[](TeacherDaemonOptions& o) { o.coordinator = "nowhere"; }, "--coordinator"},
      {[](TeacherDaemonOptions& o) { o.batch_tokens = 0; }, "--batch-tokens"},
      {[](TeacherDaemonOptions& o) { o.payload_dtype = "int8"; }, "--payload-dtype"},
      {[](TeacherDaemonOptions& o) { o.nccl_device = "gpu0"; }, "--nccl-device"},
      {[](TeacherDaemonOptions& o) { o.metrics_port = 70000; }, "--metrics-port"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    TeacherDaemonOptions options;
    c.change(options);
    absl::Status status = TeacherDaemon::Create(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
}

TEST(TeacherDaemonTest, StartsInOrderServesAndStops) {
  testing::TempDir dir;
  testing::FakeTargetRuntime runtime;
  TeacherDaemonOptions options;
  options.port_file = dir.Join("port");
  options.metrics_port = 0;
  options.metrics_port_file = dir.Join("metrics.port");
  options.nccl_device = "none";
  absl::StatusOr<std::unique_ptr<TeacherDaemon>> daemon = TeacherDaemon::Create(options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_EQ((*daemon)->port(), 0);
  EXPECT_EQ((*daemon)->metrics_port(), -1);
  EXPECT_FALSE(std::filesystem::exists(dir.Join("port")));

  ASSERT_TRUE((*daemon)->Start(runtime).ok());
  const int port = (*daemon)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*daemon)->address(), absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(testing::ReadFile(dir.Join("port")), absl::StrCat(port, "\n"));
  EXPECT_EQ(testing::ReadFile(dir.Join("metrics.port")),
            absl::StrCat((*daemon)->metrics_port(), "\n"));
  EXPECT_EQ(testing::HealthCheck((*daemon)->address()), "SERVING");
  EXPECT_FALSE((*daemon)->Start(runtime).ok()) << "Start twice";

  std::thread waiter([&] { (*daemon)->Wait(); });
  (*daemon)->Stop();
  waiter.join();
  (*daemon)->Stop();  // idempotent
  EXPECT_THAT(testing::HealthCheck(absl::StrCat("127.0.0.1:", port), absl::Seconds(1)),
              HasSubstr("error"));
}

TEST(TeacherDaemonTest, RegistersWithTheCoordinator) {
  testing::TempDir dir;
  testing::InProcessCoordinator coordinator(dir);
  ASSERT_TRUE(coordinator.ok());
  const std::string coordinator_address = coordinator.address();

  testing::FakeTargetRuntime runtime;
  TeacherDaemonOptions options;
  options.coordinator = coordinator_address;
  options.insecure_no_auth = true;
  options.model_name = "fake-target";
  options.nccl_device = "none";
  absl::StatusOr<std::unique_ptr<TeacherDaemon>> daemon = TeacherDaemon::Create(options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_TRUE((*daemon)->Start(runtime).ok());

  const v1::ListDaemonsResponse listed = coordinator.AwaitDaemons(1);
  ASSERT_EQ(listed.daemons_size(), 1);
  const v1::DaemonInfo& info = listed.daemons(0).info();
  EXPECT_EQ(info.kind(), v1::DAEMON_KIND_TEACHER);
  EXPECT_EQ(info.address(), (*daemon)->address());
  EXPECT_EQ(info.model_name(), "fake-target");
  (*daemon)->Stop();
}

}  // namespace
}  // namespace specstream::services
