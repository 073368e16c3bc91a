// JobService over a real in-process gRPC server on 127.0.0.1 port 0 (store,
// scheduler and adapter as the coordinator wires them), called by clients
// with gRPC's default 4 MiB receive limit and by the `specstream` CLI: what
// the coordinator refuses is never stored, and no stored job, however large,
// makes List fail (P13 item 17); and roles and per-peer limits hold against
// hostile clients (items 4 and 7).
#include <stdio.h>
#include <sys/wait.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc/auth.h"
#include "common/grpc/server_defaults.h"
#include "common/jobspec/job_spec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/job_store.h"
#include "services/coordinator/scheduler.h"
#include "specstream/v1/coordinator.grpc.pb.h"
#include "tests/testing/grpc_health.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

using ::testing::HasSubstr;

constexpr int kCoordinatorMaxReceiveBytes = 64 << 20;  // as coordinator_main sets it

std::string Spec(const std::string& name) {
  return "name: " + name +
         "\ndata:\n  tokenized: /data.jsonl\nmodel:\n  target: /models/target\n"
         "  draft:\n    draft_vocab_size: 64\noptimizer:\n  lr: 1.0e-3\n"
         "training:\n  max_steps: 4\n  batch_size: 1\n";
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = JobStore::Open(dir_.Join("jobs.db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    SchedulerOptions options;
    options.store = store_.get();
    auto scheduler = Scheduler::Create(options);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = std::move(*scheduler);
    service_ = std::make_unique<JobServiceImpl>(scheduler_.get(), CoordinatorAuth{});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxReceiveMessageSize(kCoordinatorMaxReceiveBytes);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port_);
    // Default channel arguments: a 4 MiB receive limit.
    stub_ =
        v1::JobService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (service_ != nullptr) service_->Shutdown();
    if (server_ != nullptr) server_->Shutdown();
  }

  grpc::Status Submit(const std::string& spec_yaml, const std::string& id, v1::Job* job = nullptr) {
    v1::Job ignored;
    if (job == nullptr) job = &ignored;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SubmitJobRequest request;
    request.set_spec_yaml(spec_yaml);
    request.set_id(id);
    return stub_->Submit(&context, request, job);
  }

  grpc::Status List(const v1::ListJobsRequest& request, v1::ListJobsResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->List(&context, request, response);
  }

  // Every page from the first; fails the test on an error.
  std::vector<std::string> ListAll(int* pages) {
    std::vector<std::string> ids;
    v1::ListJobsRequest request;
    *pages = 0;
    do {
      v1::ListJobsResponse response;
      grpc::Status status = List(request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) break;
      for (const v1::Job& job : response.jobs()) ids.push_back(job.id());
      request.set_page_token(response.next_page_token());
      if (++*pages > 100) {
        ADD_FAILURE() << "pages never end";
        break;
      }
    } while (!request.page_token().empty());
    return ids;
  }

  // `specstream <args> --address <ours>`: exit code, stdout and stderr
  // together.
  std::pair<int, std::string> RunCli(const std::string& args) {
    const std::string command =
        absl::StrCat("env -u SPECSTREAM_TOKEN -u SPECSTREAM_ADDRESS ", SPECSTREAM_CLI_PATH, " ",
                     args, " --address ", address_, " 2>&1");
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return {-1, "popen failed"};
    std::string out;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    const int status = pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }

  testing::TempDir dir_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<JobServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(CoordinatorServiceTest, ARefusedSubmitStoresNothing) {
  v1::Job job;
  // Over the spec size limit (but under the transport's), invalid, a bad id.
  const std::string oversize = Spec("big") + "# " + std::string(jobspec::kMaxSpecBytes, 'x');
  EXPECT_EQ(Submit(oversize, "big").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Submit(Spec("bad") + "nonsense: 1\n", "bad").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Submit(Spec("id"), "../id").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Past the coordinator's receive limit: refused by the transport.
  EXPECT_EQ(Submit(std::string(kCoordinatorMaxReceiveBytes + 1, 'y'), "huge").error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  for (const char* id : {"big", "bad", "huge"}) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id(id);
    EXPECT_EQ(stub_->Get(&context, request, &job).error_code(), grpc::StatusCode::NOT_FOUND) << id;
  }
  int pages = 0;
  EXPECT_TRUE(ListAll(&pages).empty());
  EXPECT_TRUE(store_->List(0)->empty());

  // An accepted spec near the limit is stored and its Submit answer fits a
  // default client.
  const std::string near = Spec("near") + "# " + std::string(jobspec::kMaxSpecBytes - 400, 'z');
  grpc::Status accepted = Submit(near, "near", &job);
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  EXPECT_EQ(job.spec_yaml(), near);
  EXPECT_EQ(store_->List(0)->size(), 1u);
}

TEST_F(CoordinatorServiceTest, ListSucceedsWhateverTheStoredJobsHold) {
  // Jobs no Submit would accept, written straight to the store: 9 x 8 MiB
  // specs (72 MiB, past even the CLI's 64 MiB receive limit) and reasons
  // that fill pages.
  constexpr int kJobs = 9;
  for (int i = 0; i < kJobs; ++i) {
    v1::Job job;
    job.set_id(absl::StrCat("stored-", i));
    job.set_name(absl::StrCat("stored", i));
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.set_created_unix_ms(1000 + i);
    job.set_spec_yaml(std::string(8 << 20, 'x'));
    job.set_reason(std::string(300 << 10, 'r'));
    ASSERT_TRUE(store_->Insert(job, "hash").ok());
  }
  int pages = 0;
  std::vector<std::string> ids = ListAll(&pages);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(ids.front(), "stored-8");
  EXPECT_EQ(ids.back(), "stored-0");
  EXPECT_GT(pages, 1);  // 300 KiB reasons: three jobs per 1 MiB page

  v1::ListJobsRequest limited;
  limited.set_limit(2);
  v1::ListJobsResponse page;
  ASSERT_TRUE(List(limited, &page).ok());
  EXPECT_EQ(page.jobs_size(), 2);
  EXPECT_TRUE(page.jobs(0).spec_yaml().empty());
  EXPECT_FALSE(page.next_page_token().empty());

  v1::ListJobsRequest malformed;
  malformed.set_page_token("not-a-token");
  grpc::Status refused = List(malformed, &page);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("page_token"));

  // The CLI, as every user runs it.
  auto [code, out] = RunCli("list");
  ASSERT_EQ(code, 0) << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), static_cast<size_t>(kJobs + 1)) << out.substr(0, 2000);
  EXPECT_THAT(lines[1], ::testing::StartsWith("stored-8 "));
  auto [limit_code, limit_out] = RunCli("list --limit 4");
  ASSERT_EQ(limit_code, 0) << limit_out;
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(limit_out, '\n', absl::SkipEmpty())).size(),
            5u);
}

// The coordinator against hostile clients (P13 items 4 and 7, P24 item 4): a
// user's token cannot act as a daemon nor a daemon's as a user, and a peer
// that keeps presenting wrong tokens is refused at once past its limit,
// while the health check answers within a second and the right tokens from
// the same address (a NAT, a node) are still served.
TEST(CoordinatorAuthTest, RolesHoldAndAFloodOfWrongTokensIsCutShort) {
  testing::TempDir dir;
  auto store = JobStore::Open(dir.Join("jobs.db"));
  ASSERT_TRUE(store.ok()) << store.status();
  SchedulerOptions options;
  options.store = store->get();
  auto scheduler = Scheduler::Create(options);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  CoordinatorAuth auth;
  auth.user_token = "user-token";
  auto daemons = DaemonCredentials::Parse("student-0 daemon-token\n", "test");
  ASSERT_TRUE(daemons.ok()) << daemons.status();
  auth.daemons = *std::move(daemons);
  auth.limiter = std::make_shared<PeerLimiter>();
  JobServiceImpl jobs(scheduler->get(), auth);
  RegistryServiceImpl registry(scheduler->get(), auth);
  EnableServerDefaults();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&jobs);
  builder.RegisterService(&registry);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto job_stub = v1::JobService::NewStub(channel);
  auto registry_stub = v1::RegistryService::NewStub(channel);

  auto list = [&](const std::string& token) {
    grpc::ClientContext context;
    AddBearer(context, token);
    v1::ListJobsResponse response;
    return job_stub->List(&context, v1::ListJobsRequest(), &response);
  };
  auto register_as = [&](const std::string& name, const std::string& token) {
    grpc::ClientContext context;
    AddBearer(context, token);
    v1::RegisterRequest request;
    request.mutable_info()->set_name(name);
    request.mutable_info()->set_kind(v1::DAEMON_KIND_STUDENT);
    v1::RegisterResponse response;
    return registry_stub->Register(&context, request, &response);
  };
  // Roles, and a name bound to its credential.
  EXPECT_TRUE(list("user-token").ok());
  EXPECT_EQ(list("daemon-token").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(register_as("student-0", "user-token").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(register_as("student-1", "daemon-token").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(register_as("student-0", "daemon-token").ok());

  // The flood: 3 refusals above count already; past 32 in the window the
  // peer is refused before any check.
  int unauthenticated = 3;
  int limited = 0;
  for (int i = 0; i < 40; ++i) {
    const absl::Time start = absl::Now();
    const grpc::StatusCode code = list("forged").error_code();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    if (code == grpc::StatusCode::UNAUTHENTICATED) ++unauthenticated;
    if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) ++limited;
  }
  EXPECT_EQ(unauthenticated, 32);
  EXPECT_EQ(limited, 11);
  // The flood goes on from a thread while a user and a daemon at the same
  // address call with their right tokens: every one is served.
  std::atomic<bool> flooding{true};
  std::atomic<int> flood_limited{0};
  std::thread flood([&] {
    while (flooding.load()) {
      if (list("forged").error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++flood_limited;
    }
  });
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(list("user-token").ok()) << "call " << i;
    EXPECT_TRUE(register_as("student-0", "daemon-token").ok()) << "call " << i;
  }
  flooding = false;
  flood.join();
  EXPECT_GT(flood_limited.load(), 0);
  const absl::Time start = absl::Now();
  EXPECT_EQ(testing::HealthCheck(address, absl::Seconds(1)), "SERVING");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  server->Shutdown();
}

}  // namespace
}  // namespace specstream::services
