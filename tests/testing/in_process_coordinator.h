// A coordinator for daemon tests, in-process (services/coordinator/
// coordinator_server.h): insecure, on 127.0.0.1, its database in a test's
// directory, heartbeats every 100 ms; and a wait for the daemons that have
// registered with it. Header-only: a test executable that uses it links
// specstream_coordinator.
#ifndef SPECSTREAM_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_
#define SPECSTREAM_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "services/coordinator/coordinator_server.h"
#include "specstream/v1/coordinator.grpc.pb.h"
#include "tests/testing/testing.h"

namespace specstream::testing {

class InProcessCoordinator {
 public:
  // Started on a free port with its database in `dir` (ASSERTs on failure:
  // check ok()).
  explicit InProcessCoordinator(const TempDir& dir) {
    services::CoordinatorServerOptions options;
    options.host = "127.0.0.1";
    options.db = dir.Join("jobs.db");
    options.insecure_no_auth = true;
    options.heartbeat_ms = 100;
    options.lost_after_s = 2;
    absl::StatusOr<std::unique_ptr<services::CoordinatorServer>> server =
        services::CoordinatorServer::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = *std::move(server);
    absl::Status started = server_->Start();
    EXPECT_TRUE(started.ok()) << started;
    if (!started.ok()) server_.reset();
  }

  bool ok() const { return server_ != nullptr; }
  std::string address() const { return absl::StrCat("127.0.0.1:", server_->port()); }

  // The registered daemons once there are at least `n` (waiting up to 30 s
  // for the daemons' registration threads; fewer when they never come).
  v1::ListDaemonsResponse AwaitDaemons(int n) const {
    auto stub = v1::RegistryService::NewStub(
        grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
    v1::ListDaemonsResponse listed;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      listed.Clear();
      if (stub->ListDaemons(&context, v1::ListDaemonsRequest(), &listed).ok() &&
          listed.daemons_size() >= n) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return listed;
  }

 private:
  std::unique_ptr<services::CoordinatorServer> server_;
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_
