// The coordinator as a library server (services/coordinator/coordinator_server.h),
// in-process: what it refuses before taking anything, the order it starts in
// (the database lock, then gRPC, metrics and the port files), and that Stop
// closes both ports and releases the database for the next coordinator.
#include "services/coordinator/coordinator_server.h"

#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "specstream/v1/coordinator.grpc.pb.h"
#include "tests/testing/grpc_health.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

using ::testing::HasSubstr;

CoordinatorServerOptions Options(const testing::TempDir& dir) {
  CoordinatorServerOptions options;
  options.host = "127.0.0.1";
  options.db = dir.Join("jobs.db");
  options.insecure_no_auth = true;
  options.port_file = dir.Join("port");
  options.metrics_port = 0;
  options.metrics_port_file = dir.Join("metrics.port");
  options.heartbeat_ms = 100;
  options.lost_after_s = 1;
  return options;
}

// List over a fresh channel: the call's status code.
grpc::StatusCode List(int port) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto stub = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListJobsRequest request;
  v1::ListJobsResponse response;
  return stub->List(&context, request, &response).error_code();
}

TEST(CoordinatorServerTest, RefusesBadOptionsNamingTheFlag) {
  testing::TempDir dir;
  struct Case {
    std::function<void(CoordinatorServerOptions&)> change;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {[](CoordinatorServerOptions& o) { o.heartbeat_ms = 0; }, "--heartbeat-ms"},
      {[](CoordinatorServerOptions& o) { o.lost_after_s = 0.05; }, "--lost-after-s"},
      {[](CoordinatorServerOptions& o) { o.db.clear(); }, "--db"},
      {[](CoordinatorServerOptions& o) { o.metrics_port = -2; }, "--metrics-port"},
      {[](CoordinatorServerOptions& o) { o.token_file = "t"; }, "--insecure-no-auth"},
      {[](CoordinatorServerOptions& o) { o.insecure_no_auth = false; }, "--daemon-token-file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    CoordinatorServerOptions options = Options(dir);
    c.change(options);
    absl::Status status = CoordinatorServer::Create(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.flag));
    EXPECT_FALSE(CheckCoordinatorOptions(options).ok());
  }
  // Nothing was taken: no database, no lock, no port file.
  EXPECT_FALSE(std::filesystem::exists(dir.Join("jobs.db")));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("jobs.db.lock")));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("port")));
}

TEST(CoordinatorServerTest, StartsInOrderAndStopReleasesPortsAndDatabase) {
  testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Create(Options(dir));
  ASSERT_TRUE(server.ok()) << server.status();
  // Created: the database is taken, nothing listens yet.
  EXPECT_EQ((*server)->port(), 0);
  EXPECT_EQ((*server)->metrics_port(), -1);
  EXPECT_FALSE(std::filesystem::exists(dir.Join("port")));
  absl::Status second = CoordinatorServer::Create(Options(dir)).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("--db: another coordinator"));

  ASSERT_TRUE((*server)->Start().ok());
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  ASSERT_GT((*server)->metrics_port(), 0);
  EXPECT_EQ(testing::ReadFile(dir.Join("port")), absl::StrCat(port, "\n"));
  EXPECT_EQ(testing::ReadFile(dir.Join("metrics.port")),
            absl::StrCat((*server)->metrics_port(), "\n"));
  EXPECT_EQ(testing::HealthCheck(absl::StrCat("127.0.0.1:", port)), "SERVING");
  EXPECT_EQ(List(port), grpc::StatusCode::OK);
  EXPECT_FALSE((*server)->Start().ok()) << "Start twice";

  std::thread waiter([&] { (*server)->Wait(); });
  (*server)->Stop();
  waiter.join();
  (*server)->Stop();  // idempotent
  EXPECT_EQ(List(port), grpc::StatusCode::UNAVAILABLE);
  server->reset();

  // The next coordinator takes the same database.
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> next = CoordinatorServer::Create(Options(dir));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE((*next)->Start().ok());
  EXPECT_EQ(List((*next)->port()), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace specstream::services
