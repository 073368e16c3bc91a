// The `specstream` job commands run as a user would (the real binary, its
// stdout, stderr and exit code) against an in-process fake JobService on
// 127.0.0.1 port 0 whose jobs, events and errors each test scripts.
#include "services/cli/job_commands.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "specstream/v1/coordinator.grpc.pb.h"
#include "tests/testing/testing.h"

extern char** environ;

namespace specstream::services {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using v1::Job;
using v1::JobEvent;
using v1::JobState;

bool IsTerminal(JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_STOPPED;
}

JobEvent StateEvent(JobState state, const std::string& reason = "", int attempt = 0) {
  JobEvent event;
  event.mutable_state()->set_state(state);
  event.mutable_state()->set_reason(reason);
  event.mutable_state()->set_attempt(attempt);
  return event;
}

JobEvent LogEvent(int rank, const std::string& text) {
  JobEvent event;
  event.mutable_log()->set_rank(rank);
  event.mutable_log()->set_stream("stdout");
  event.mutable_log()->set_text(text);
  return event;
}

JobEvent MetricsEvent(int64_t step, int64_t total, const std::string& json) {
  JobEvent event;
  event.mutable_metrics()->set_step(step);
  event.mutable_metrics()->set_total_steps(total);
  event.mutable_metrics()->set_json(json);
  return event;
}

Job MakeJob(const std::string& id, JobState state, int64_t created_unix_ms) {
  Job job;
  job.set_id(id);
  job.set_name(id.substr(0, id.find('-')));
  job.set_state(state);
  job.set_created_unix_ms(created_unix_ms);
  return job;
}

// Answers the call with an error when the bearer token is wrong or an error
// was scripted for `method`.
#define RETURN_IF_REFUSED(context, method)                      \
  do {                                                          \
    grpc::Status refused = RefusedLocked(*(context), (method)); \
    if (!refused.ok()) return refused;                          \
  } while (false)

// JobService as the coordinator documents it, over scripted state. Watch
// with follow blocks until new events arrive or the job's terminal event.
class FakeJobService final : public v1::JobService::Service {
 public:
  void SetToken(const std::string& token) {
    absl::MutexLock lock(&mu_);
    token_ = token;
  }
  void PutJob(const Job& job) {
    absl::MutexLock lock(&mu_);
    jobs_[job.id()] = job;
    order_.push_back(job.id());
  }
  // Appends an event (seq assigned) and applies it to the job.
  void Append(const std::string& id, JobEvent event) {
    absl::MutexLock lock(&mu_);
    AppendLocked(id, std::move(event));
  }
  // The next call of `method` ("Watch", "Get", ...) fails with `status`.
  void FailNext(const std::string& method, grpc::Status status) {
    absl::MutexLock lock(&mu_);
    fail_next_[method].push_back(std::move(status));
  }
  // The next Watch sends `events` (> 0) events, then fails with UNAVAILABLE.
  void FailWatchAfter(int events) {
    absl::MutexLock lock(&mu_);
    fail_watch_after_ = events;
  }
  // Events a submitted job plays at once (a scripted run).
  void SetOnSubmit(std::vector<JobEvent> events) {
    absl::MutexLock lock(&mu_);
    on_submit_ = std::move(events);
  }

  bool AwaitWatchCalls(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(watch_after_seqs_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(20));
  }
  std::vector<int64_t> watch_after_seqs() {
    absl::MutexLock lock(&mu_);
    return watch_after_seqs_;
  }
  std::vector<v1::SubmitJobRequest> submits() {
    absl::MutexLock lock(&mu_);
    return submits_;
  }
  std::vector<std::string> authorizations() {
    absl::MutexLock lock(&mu_);
    return authorizations_;
  }
  Job job(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return jobs_[id];
  }

  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                      Job* response) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_REFUSED(context, "Submit");
    submits_.push_back(*request);
    if (absl::StrContains(request->spec_yaml(), "lr: -1")) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "training.optimizer.lr: must be > 0, got -1");
    }
    std::string id = request->id().empty() ? "tiny-0000abcd" : request->id();
    if (jobs_.count(id) > 0) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "job " + id + " exists");
    }
    Job job = MakeJob(id, v1::JOB_STATE_QUEUED, absl::ToUnixMillis(absl::Now()));
    job.set_spec_yaml(request->spec_yaml());
    job.set_world_size(2);
    jobs_[id] = job;
    order_.push_back(id);
    *response = job;
    for (const JobEvent& event : on_submit_) AppendLocked(id, event);
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::GetJobRequest* request,
                   Job* response) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_REFUSED(context, "Get");
    auto it = jobs_.find(request->id());
    if (it == jobs_.end()) return NotFound(request->id());
    *response = it->second;
    return grpc::Status::OK;
  }

  // In insertion order (the CLI sorts newest first itself), in pages of at
  // most `limit` and at most `page_size` (SetListPageSize) jobs; the page
  // token is the index of the page's first job.
  grpc::Status List(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                    v1::ListJobsResponse* response) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_REFUSED(context, "List");
    list_requests_.push_back(*request);
    size_t start = 0;
    if (!request->page_token().empty() && !absl::SimpleAtoi(request->page_token(), &start)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "page_token: malformed");
    }
    size_t end = order_.size();
    if (list_page_size_ > 0) end = std::min(end, start + list_page_size_);
    if (request->limit() > 0) end = std::min(end, start + request->limit());
    for (size_t i = start; i < end; ++i) *response->add_jobs() = jobs_[order_[i]];
    if (end < order_.size()) response->set_next_page_token(absl::StrCat(end));
    return grpc::Status::OK;
  }
  void SetListPageSize(size_t jobs) {
    absl::MutexLock lock(&mu_);
    list_page_size_ = jobs;
  }
  std::vector<v1::ListJobsRequest> list_requests() {
    absl::MutexLock lock(&mu_);
    return list_requests_;
  }

  grpc::Status Stop(grpc::ServerContext* context, const v1::StopJobRequest* request,
                    Job* response) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_REFUSED(context, "Stop");
    auto it = jobs_.find(request->id());
    if (it == jobs_.end()) return NotFound(request->id());
    if (!IsTerminal(it->second.state())) {
      AppendLocked(request->id(),
                   StateEvent(v1::JOB_STATE_STOPPED,
                              request->reason().empty() ? "stopped by user" : request->reason()));
    }
    *response = jobs_[request->id()];
    return grpc::Status::OK;
  }

  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                     grpc::ServerWriter<JobEvent>* writer) override {
    int64_t next = request->after_seq();
    int fail_after = -1;
    {
      absl::MutexLock lock(&mu_);
      watch_after_seqs_.push_back(request->after_seq());
      RETURN_IF_REFUSED(context, "Watch");
      if (jobs_.count(request->id()) == 0) return NotFound(request->id());
      std::swap(fail_after, fail_watch_after_);
    }
    int sent = 0;
    while (true) {
      std::vector<JobEvent> batch;
      {
        absl::MutexLock lock(&mu_);
        const auto& events = events_[request->id()];
        auto more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return static_cast<int64_t>(events_[request->id()].size()) > next;
        };
        if (request->follow()) {
          mu_.AwaitWithTimeout(absl::Condition(&more), absl::Milliseconds(50));
        }
        for (size_t i = next; i < events.size(); ++i) batch.push_back(events[i]);
      }
      for (const JobEvent& event : batch) {
        if (!writer->Write(event)) return grpc::Status::CANCELLED;
        if (++sent == fail_after) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator restarting");
        }
        next = event.seq();
        if (event.has_state() && IsTerminal(event.state().state())) return grpc::Status::OK;
      }
      if (!request->follow()) return grpc::Status::OK;
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
    }
  }

 private:
  grpc::Status RefusedLocked(const grpc::ServerContext& context, const std::string& method)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = context.client_metadata().find("authorization");
    std::string sent = it == context.client_metadata().end()
                           ? ""
                           : std::string(it->second.data(), it->second.size());
    authorizations_.push_back(sent);
    if (!token_.empty() && sent != "Bearer " + token_) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          sent.empty() ? "missing bearer token" : "wrong bearer token");
    }
    auto& failures = fail_next_[method];
    if (!failures.empty()) {
      grpc::Status status = failures.front();
      failures.pop_front();
      return status;
    }
    return grpc::Status::OK;
  }

  static grpc::Status NotFound(const std::string& id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "job " + id + " not found");
  }

  void AppendLocked(const std::string& id, JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto& events = events_[id];
    event.set_seq(static_cast<int64_t>(events.size()) + 1);
    event.set_job_id(id);
    event.set_unix_ms(absl::ToUnixMillis(absl::Now()));
    Job& job = jobs_[id];
    if (event.has_state()) {
      job.set_state(event.state().state());
      job.set_reason(event.state().reason());
      job.set_attempt(event.state().attempt());
      if (IsTerminal(job.state())) job.set_finished_unix_ms(event.unix_ms());
    }
    if (event.has_metrics()) *job.mutable_metrics() = event.metrics();
    events.push_back(std::move(event));
  }

  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<JobEvent>> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<grpc::Status>> fail_next_ ABSL_GUARDED_BY(mu_);
  int fail_watch_after_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<JobEvent> on_submit_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> watch_after_seqs_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::SubmitJobRequest> submits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);
  size_t list_page_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::ListJobsRequest> list_requests_ ABSL_GUARDED_BY(mu_);
};

struct CliResult {
  int exit_code = -1;  // -1: killed after the test's limit
  std::string out;
  std::string err;
  double seconds = 0;
};

class JobCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    address_ = absl::StrCat("127.0.0.1:", port_);
    testing::WriteFile(dir_.Join("job.yaml"), "name: tiny\ntraining:\n  max_steps: 10\n");
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // Runs the real binary with `args` and the environment's SPECSTREAM_*
  // variables replaced by `env` (TZ=UTC always); kills it after 30 s.
  CliResult RunCli(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    int n;
    {
      absl::MutexLock lock(&run_mu_);
      n = runs_++;
    }
    const std::string out_path = dir_.Join(absl::StrCat("stdout", n));
    const std::string err_path = dir_.Join(absl::StrCat("stderr", n));
    std::vector<std::string> argv_strings = {SPECSTREAM_CLI_PATH};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<std::string> env_strings = {"TZ=UTC"};
    for (char** e = environ; *e != nullptr; ++e) {
      if (!absl::StartsWith(*e, "SPECSTREAM_") && !absl::StartsWith(*e, "TZ=")) {
        env_strings.push_back(*e);
      }
    }
    env_strings.insert(env_strings.end(), env.begin(), env.end());
    std::vector<char*> argv, envp;
    for (auto& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CliResult result;
    absl::Time start = absl::Now();
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn: " << rc;
      return result;
    }
    int status = 0;
    if (!testing::WaitUntil([&] { return waitpid(pid, &status, WNOHANG) != 0; }, absl::Seconds(30),
                            absl::Milliseconds(10))) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "killed after 30 s: " << absl::StrJoin(args, " ");
      status = -1;
    }
    result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
    result.out = testing::ReadFile(out_path);
    result.err = testing::ReadFile(err_path);
    return result;
  }

  std::future<CliResult> RunCliAsync(std::vector<std::string> args,
                                     std::vector<std::string> env = {}) {
    return std::async(std::launch::async, [this, args, env] { return RunCli(args, env); });
  }

  // args + --address.
  std::vector<std::string> With(std::vector<std::string> args) {
    args.push_back("--address");
    args.push_back(address_);
    return args;
  }

  FakeJobService fake_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  testing::TempDir dir_;
  absl::Mutex run_mu_;
  int runs_ ABSL_GUARDED_BY(run_mu_) = 0;
};

std::string Describe(const CliResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout\n", r.out, "--- stderr\n", r.err);
}

TEST_F(JobCommandsTest, SubmitSendsTheFileAndTheBearerTokenAndPrintsTheId) {
  fake_.SetToken("s3cret");
  testing::WriteFile(dir_.Join("token"), "s3cret\n");
  CliResult r = RunCli(With({"submit", dir_.Join("job.yaml"), "--token-file", dir_.Join("token")}));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "tiny-0000abcd\n");
  ASSERT_EQ(fake_.submits().size(), 1u);
  EXPECT_EQ(fake_.submits()[0].spec_yaml(), testing::ReadFile(dir_.Join("job.yaml")));
  EXPECT_EQ(fake_.submits()[0].id(), "");
  EXPECT_THAT(fake_.authorizations(), ElementsAre("Bearer s3cret"));
}

TEST_F(JobCommandsTest, SubmitJsonParsesBackWithProtoFieldNames) {
  CliResult r = RunCli(With({"submit", dir_.Join("job.yaml"), "--id", "mine", "-o", "json"}));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  nlohmann::json job = nlohmann::json::parse(r.out);
  EXPECT_EQ(job["id"], "mine");
  EXPECT_EQ(job["name"], "mine");
  EXPECT_EQ(job["state"], "JOB_STATE_QUEUED");
  EXPECT_EQ(job["spec_yaml"], testing::ReadFile(dir_.Join("job.yaml")));
  EXPECT_EQ(job["world_size"], 2);
  EXPECT_TRUE(job.contains("max_restarts"));  // defaults are printed too
  EXPECT_EQ(fake_.submits().at(0).id(), "mine");
}

TEST_F(JobCommandsTest, UsageErrorsExitTwo) {
  // A missing spec file, named; nothing is sent.
  CliResult missing = RunCli(With({"submit", dir_.Join("nope.yaml")}));
  EXPECT_EQ(missing.exit_code, 2) << Describe(missing);
  EXPECT_THAT(missing.err, HasSubstr(dir_.Join("nope.yaml")));
  EXPECT_TRUE(fake_.submits().empty());

  // A spec the coordinator refuses: its message names the field.
  testing::WriteFile(dir_.Join("bad.yaml"), "name: tiny\ntraining:\n  optimizer:\n    lr: -1\n");
  CliResult bad = RunCli(With({"submit", dir_.Join("bad.yaml")}));
  EXPECT_EQ(bad.exit_code, 2) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr("training.optimizer.lr: must be > 0"));
  EXPECT_EQ(bad.out, "");

  // No address anywhere.
  CliResult no_address = RunCli({"status", "x"});
  EXPECT_EQ(no_address.exit_code, 2) << Describe(no_address);
  EXPECT_THAT(no_address.err, HasSubstr("SPECSTREAM_ADDRESS"));

  // Bad flags (CLI11).
  EXPECT_EQ(RunCli(With({"list", "-o", "yaml"})).exit_code, 2);
  EXPECT_EQ(RunCli(With({"status"})).exit_code, 2);
  EXPECT_EQ(RunCli(With({"submit", dir_.Join("job.yaml"), "--wait", "--follow"})).exit_code, 2);

  // A taken id.
  fake_.PutJob(MakeJob("taken", v1::JOB_STATE_RUNNING, 1));
  EXPECT_EQ(RunCli(With({"submit", dir_.Join("job.yaml"), "--id", "taken"})).exit_code, 2);
}

TEST_F(JobCommandsTest, AddressComesFromTheEnvironment) {
  fake_.PutJob(MakeJob("a-1", v1::JOB_STATE_QUEUED, 1));
  CliResult r = RunCli({"status", "a-1"}, {"SPECSTREAM_ADDRESS=" + address_});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("QUEUED"));
}

TEST_F(JobCommandsTest, UnreachableCoordinatorExitsThree) {
  const std::string dead = testing::DeadLoopbackAddress();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"status", "x"}, {"list"}, {"wait", "x"}, {"submit", dir_.Join("job.yaml")}}) {
    std::vector<std::string> full = args;
    full.insert(full.end(), {"--address", dead});
    CliResult r = RunCli(full);
    EXPECT_EQ(r.exit_code, 3) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator at " + dead));
  }
}

TEST_F(JobCommandsTest, MissingOrWrongTokenExitsThreeWithAHint) {
  fake_.SetToken("right");
  fake_.PutJob(MakeJob("a-1", v1::JOB_STATE_QUEUED, 1));
  CliResult none = RunCli(With({"status", "a-1"}));
  EXPECT_EQ(none.exit_code, 3) << Describe(none);
  EXPECT_THAT(none.err, HasSubstr("unauthenticated: check --token-file / SPECSTREAM_TOKEN"));
  CliResult wrong = RunCli(With({"list"}), {"SPECSTREAM_TOKEN=wrong"});
  EXPECT_EQ(wrong.exit_code, 3) << Describe(wrong);
  EXPECT_THAT(wrong.err, HasSubstr("unauthenticated"));
  CliResult right = RunCli(With({"status", "a-1"}), {"SPECSTREAM_TOKEN=right"});
  EXPECT_EQ(right.exit_code, 0) << Describe(right);
  EXPECT_THAT(fake_.authorizations(), ElementsAre("", "Bearer wrong", "Bearer right"));
}

TEST_F(JobCommandsTest, UnknownJobExitsFour) {
  for (const auto& command : {"status", "stop", "wait", "logs"}) {
    CliResult r = RunCli(With({command, "ghost"}));
    EXPECT_EQ(r.exit_code, 4) << command << "\n" << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("ghost not found")) << command;
  }
  EXPECT_EQ(RunCli(With({"logs", "ghost", "-f"})).exit_code, 4);
}

TEST_F(JobCommandsTest, StatusPrintsAKeyValueTable) {
  Job job = MakeJob("tiny-0000abcd", v1::JOB_STATE_RUNNING, 1'780'000'000'000);
  job.set_reason("restarted: daemon s2 lost");
  job.set_attempt(1);
  job.set_max_restarts(3);
  job.set_world_size(2);
  job.set_started_unix_ms(1'780'000'060'000);
  job.mutable_metrics()->set_step(120);
  job.mutable_metrics()->set_total_steps(1000);
  job.mutable_metrics()->set_json(
      R"({"step":120,"loss":2.314,"acc_k":[0.71,0.52,0.4],"sim_accept_len":3.21,)"
      R"("tokens_per_s":12345})");
  auto* r0 = job.add_ranks();
  r0->set_rank(0);
  r0->set_daemon_name("gpu-a");
  auto* r1 = job.add_ranks();
  r1->set_rank(1);
  r1->set_daemon_name("gpu-b");
  fake_.PutJob(job);

  CliResult r = RunCli(With({"status", "tiny-0000abcd"}));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out,
            "id:             tiny-0000abcd\n"
            "name:           tiny\n"
            "state:          RUNNING\n"
            "reason:         restarted: daemon s2 lost\n"
            "attempt:        1/3\n"
            "world size:     2\n"
            "step:           120/1000\n"
            "loss:           2.3140\n"
            "acc:            0.710 0.520 0.400\n"
            "sim_accept_len: 3.21\n"
            "tokens/s:       12.3k\n"
            "ranks:          0 gpu-a\n"
            "                1 gpu-b\n"
            "created:        2026-05-28 20:26:40\n"
            "started:        2026-05-28 20:27:40\n"
            "finished:       -\n");

  CliResult json = RunCli(With({"status", "tiny-0000abcd", "-o", "json"}));
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  nlohmann::json parsed = nlohmann::json::parse(json.out);
  EXPECT_EQ(parsed["ranks"][1]["daemon_name"], "gpu-b");
  EXPECT_EQ(parsed["metrics"]["total_steps"], "1000");  // int64 as a JSON string
}

TEST_F(JobCommandsTest, ListPrintsAlignedColumnsNewestFirst) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  Job old_job = MakeJob("old-1", v1::JOB_STATE_SUCCEEDED, now - 3 * 3600 * 1000);
  old_job.mutable_metrics()->set_step(1000);
  old_job.mutable_metrics()->set_total_steps(1000);
  Job mid_job = MakeJob("middle-22", v1::JOB_STATE_FAILED, now - 5 * 60 * 1000);
  mid_job.set_reason("rank 1 exited 1:\nCUDA out of memory");
  Job new_job = MakeJob("new-333", v1::JOB_STATE_QUEUED, now - 2000);
  new_job.set_reason("waiting for 2 student daemons");
  fake_.PutJob(old_job);
  fake_.PutJob(mid_job);
  fake_.PutJob(new_job);

  CliResult r = RunCli(With({"list"}));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r.out;
  EXPECT_THAT(lines[0], ::testing::MatchesRegex("ID +NAME +STATE +STEP +AGE +REASON"));
  EXPECT_THAT(lines[1], ::testing::StartsWith("new-333 "));
  EXPECT_THAT(lines[2], ::testing::StartsWith("middle-22 "));
  EXPECT_THAT(lines[3], ::testing::StartsWith("old-1 "));
  // Every column starts where its header does.
  for (const char* header : {"NAME", "STATE", "STEP", "AGE", "REASON"}) {
    size_t at = lines[0].find(header);
    for (size_t i = 1; i < lines.size(); ++i) {
      if (at >= lines[i].size()) continue;  // an empty trailing REASON
      EXPECT_EQ(lines[i][at - 1], ' ') << header << " in " << lines[i];
      EXPECT_NE(lines[i][at], ' ') << header << " in " << lines[i];
    }
  }
  EXPECT_THAT(lines[1], ::testing::MatchesRegex("new-333 +new +QUEUED +- +[0-9]s +waiting for 2 "
                                                "student daemons"));
  EXPECT_THAT(lines[2], ::testing::MatchesRegex(
                            "middle-22 +middle +FAILED +- +5m +rank 1 exited 1: \\| CUDA out of "
                            "memory"));
  EXPECT_THAT(lines[3], ::testing::MatchesRegex("old-1 +old +SUCCEEDED +1000/1000 +3h"));

  CliResult json = RunCli(With({"list", "-o", "json"}));
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  nlohmann::json parsed = nlohmann::json::parse(json.out);
  ASSERT_EQ(parsed["jobs"].size(), 3u);
  EXPECT_EQ(parsed["jobs"][0]["id"], "new-333");
  EXPECT_EQ(parsed["jobs"][2]["id"], "old-1");
}

TEST_F(JobCommandsTest, ListFollowsPagesUntilTheLimitOrTheLastPage) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (int i = 0; i < 5; ++i) {
    fake_.PutJob(MakeJob(absl::StrCat("job-", i), v1::JOB_STATE_SUCCEEDED, now - 1000 * (5 - i)));
  }
  fake_.SetListPageSize(2);
  CliResult all = RunCli(With({"list"}));
  ASSERT_EQ(all.exit_code, 0) << Describe(all);
  std::vector<std::string> lines = absl::StrSplit(all.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << all.out;
  EXPECT_THAT(lines[1], ::testing::StartsWith("job-4 "));
  EXPECT_THAT(lines[5], ::testing::StartsWith("job-0 "));
  std::vector<std::string> tokens;
  for (const auto& request : fake_.list_requests()) {
    tokens.push_back(request.page_token());
    EXPECT_EQ(request.limit(), 0);
  }
  EXPECT_THAT(tokens, ElementsAre("", "2", "4"));

  // --limit 3: the second page asks only for the one job still wanted.
  CliResult three = RunCli(With({"list", "--limit", "3", "-o", "json"}));
  ASSERT_EQ(three.exit_code, 0) << Describe(three);
  nlohmann::json parsed = nlohmann::json::parse(three.out);
  ASSERT_EQ(parsed["jobs"].size(), 3u);
  std::vector<int32_t> limits;
  for (const auto& request : fake_.list_requests()) limits.push_back(request.limit());
  EXPECT_THAT(limits, ElementsAre(0, 0, 0, 3, 1));
}

TEST_F(JobCommandsTest, ListAndStatusEscapeControlCharacters) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  // A name that would clear the screen and turn the rest red, a CSI as a C1
  // code point, and a reason that retitles the window.
  Job job = MakeJob("evil-1", v1::JOB_STATE_FAILED, now - 1000);
  job.set_name(
      "evil\x1b[2J\x1b[31m\xc2\x9b"
      "1m");
  job.set_reason(
      "rank 0: \x1b]0;owned\x07"
      "done\r");
  job.add_ranks()->set_daemon_name("s\x1b[1A1");
  fake_.PutJob(job);

  CliResult list = RunCli(With({"list"}));
  ASSERT_EQ(list.exit_code, 0) << Describe(list);
  EXPECT_THAT(list.out, Not(HasSubstr("\x1b"))) << list.out;
  EXPECT_THAT(list.out, Not(HasSubstr("\xc2\x9b"))) << list.out;
  EXPECT_THAT(list.out, HasSubstr("evil\\x1b[2J\\x1b[31m\\u009b1m")) << list.out;
  EXPECT_THAT(list.out, HasSubstr("rank 0: \\x1b]0;owned\\x07done")) << list.out;

  CliResult status = RunCli(With({"status", "evil-1"}));
  ASSERT_EQ(status.exit_code, 0) << Describe(status);
  EXPECT_THAT(status.out, Not(HasSubstr("\x1b"))) << status.out;
  EXPECT_THAT(status.out, HasSubstr("name:           evil\\x1b[2J")) << status.out;
  EXPECT_THAT(status.out, HasSubstr("s\\x1b[1A1")) << status.out;

  // `stop` prints "ID STATE: reason"; JSON output is escaped by the JSON
  // printer (\u001b) and parses back to the raw name.
  CliResult stop = RunCli(With({"stop", "evil-1"}));
  ASSERT_EQ(stop.exit_code, 0) << Describe(stop);
  EXPECT_THAT(stop.out, Not(HasSubstr("\x1b"))) << stop.out;
  CliResult json = RunCli(With({"list", "-o", "json"}));
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  EXPECT_THAT(json.out, Not(HasSubstr("\x1b"))) << json.out;
  EXPECT_EQ(nlohmann::json::parse(json.out)["jobs"][0]["name"], job.name());

  // An error quoting what the user sent does not carry it raw to stderr.
  CliResult unknown = RunCli(With({"status", "x\x1b[2Jy"}));
  EXPECT_EQ(unknown.exit_code, 4);
  EXPECT_THAT(unknown.err, Not(HasSubstr("\x1b"))) << unknown.err;
  EXPECT_THAT(unknown.err, HasSubstr("x\\x1b[2Jy")) << unknown.err;
}

TEST_F(JobCommandsTest, WaitExitsZeroWhenTheJobSucceeds) {
  fake_.PutJob(MakeJob("j-1", v1::JOB_STATE_RUNNING, 1));
  fake_.Append("j-1", StateEvent(v1::JOB_STATE_RUNNING));
  auto wait = RunCliAsync(With({"wait", "j-1"}));
  ASSERT_TRUE(fake_.AwaitWatchCalls(1));
  EXPECT_EQ(wait.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  fake_.Append("j-1", StateEvent(v1::JOB_STATE_SUCCEEDED));
  CliResult r = wait.get();
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "j-1 SUCCEEDED\n");
}

TEST_F(JobCommandsTest, WaitExitsOneWhenTheJobFailsOrIsStopped) {
  fake_.PutJob(MakeJob("f-1", v1::JOB_STATE_RUNNING, 1));
  auto wait = RunCliAsync(With({"wait", "f-1"}));
  ASSERT_TRUE(fake_.AwaitWatchCalls(1));
  fake_.Append("f-1", StateEvent(v1::JOB_STATE_FAILED, "rank 0 exited 1"));
  CliResult r = wait.get();
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_EQ(r.out, "f-1 FAILED: rank 0 exited 1\n");
  EXPECT_THAT(r.err, HasSubstr("job f-1 FAILED: rank 0 exited 1"));

  // Stop prints the new state; a waiter sees STOPPED and exits 1.
  fake_.PutJob(MakeJob("s-1", v1::JOB_STATE_QUEUED, 1));
  auto stopped = RunCliAsync(With({"wait", "s-1", "-o", "json"}));
  ASSERT_TRUE(fake_.AwaitWatchCalls(2));
  CliResult stop = RunCli(With({"stop", "s-1", "--reason", "by test"}));
  EXPECT_EQ(stop.exit_code, 0) << Describe(stop);
  EXPECT_EQ(stop.out, "s-1 STOPPED: by test\n");
  CliResult s = stopped.get();
  EXPECT_EQ(s.exit_code, 1) << Describe(s);
  EXPECT_EQ(nlohmann::json::parse(s.out)["state"], "JOB_STATE_STOPPED");

  // Waiting on a job that already ended answers at once.
  CliResult again = RunCli(With({"wait", "f-1"}));
  EXPECT_EQ(again.exit_code, 1) << Describe(again);
}

TEST_F(JobCommandsTest, WaitTimeoutExits124) {
  fake_.PutJob(MakeJob("slow-1", v1::JOB_STATE_RUNNING, 1));
  CliResult r = RunCli(With({"wait", "slow-1", "--timeout", "1"}));
  EXPECT_EQ(r.exit_code, 124) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("timed out after 1s waiting for job slow-1 (last state RUNNING)"));
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 10);
}

TEST_F(JobCommandsTest, WaitSurvivesAnUnavailableCoordinator) {
  fake_.PutJob(MakeJob("r-1", v1::JOB_STATE_RUNNING, 1));
  fake_.FailNext("Watch", grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting"));
  auto wait = RunCliAsync(With({"wait", "r-1"}));
  ASSERT_TRUE(fake_.AwaitWatchCalls(2));  // failed once, then reconnected
  fake_.Append("r-1", StateEvent(v1::JOB_STATE_SUCCEEDED));
  CliResult r = wait.get();
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "r-1 SUCCEEDED\n");
  EXPECT_THAT(r.err, HasSubstr("reconnecting"));
}

TEST_F(JobCommandsTest, FollowSurvivesACoordinatorRestart) {
  fake_.PutJob(MakeJob("r-2", v1::JOB_STATE_RUNNING, 1));
  fake_.Append("r-2", LogEvent(0, "before"));
  auto follow = RunCliAsync(With({"logs", "r-2", "-f"}));
  ASSERT_TRUE(fake_.AwaitWatchCalls(1));
  // The CLI's first run writes stdout0 and stderr0.
  auto printed = [&](const std::string& file, const std::string& text) {
    return testing::WaitUntil(
        [&] { return testing::ReadFile(dir_.Join(file)).find(text) != std::string::npos; },
        absl::Seconds(20));
  };
  ASSERT_TRUE(printed("stdout0", "before"));

  // The coordinator goes away mid-stream and comes back on the same port
  // with the same job (its store survived).
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  server_.reset();
  ASSERT_TRUE(printed("stderr0", "reconnecting"));  // the CLI saw it go
  FakeJobService restarted;
  restarted.PutJob(MakeJob("r-2", v1::JOB_STATE_RUNNING, 1));
  restarted.Append("r-2", LogEvent(0, "before"));
  restarted.Append("r-2", LogEvent(1, "after"));
  restarted.Append("r-2", StateEvent(v1::JOB_STATE_SUCCEEDED));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address_, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&restarted);
  server_ = builder.BuildAndStart();
  ASSERT_NE(server_, nullptr);
  ASSERT_EQ(port, port_);

  CliResult r = follow.get();
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "[rank 0] before\n[rank 1] after\n");
  EXPECT_THAT(restarted.watch_after_seqs(), ::testing::Contains(1));
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
}

TEST_F(JobCommandsTest, LogsPrintsRankPrefixedLines) {
  fake_.PutJob(MakeJob("l-1", v1::JOB_STATE_RUNNING, 1));
  fake_.Append("l-1", StateEvent(v1::JOB_STATE_RUNNING));
  fake_.Append("l-1", LogEvent(0, "hello\n"));
  fake_.Append("l-1", MetricsEvent(1, 10, "{}"));
  fake_.Append("l-1", LogEvent(1, "world"));
  CliResult r = RunCli(With({"logs", "l-1"}));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "[rank 0] hello\n[rank 1] world\n");

  CliResult json = RunCli(With({"logs", "l-1", "-o", "json"}));
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  std::vector<std::string> lines = absl::StrSplit(json.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[1])["log"]["text"], "world");
}

TEST_F(JobCommandsTest, LogsFollowKeepsPrintingUntilTheJobEnds) {
  fake_.PutJob(MakeJob("l-2", v1::JOB_STATE_RUNNING, 1));
  fake_.Append("l-2", LogEvent(0, "one"));
  auto logs = RunCliAsync(With({"logs", "l-2", "-f"}));
  ASSERT_TRUE(fake_.AwaitWatchCalls(1));
  fake_.Append("l-2", LogEvent(1, "two"));
  EXPECT_EQ(logs.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout);
  fake_.Append("l-2", LogEvent(0, "three"));
  fake_.Append("l-2", StateEvent(v1::JOB_STATE_FAILED, "boom"));
  CliResult r = logs.get();
  EXPECT_EQ(r.exit_code, 0) << Describe(r);  // logs succeeds whatever the job did
  EXPECT_EQ(r.out, "[rank 0] one\n[rank 1] two\n[rank 0] three\n");
}

TEST_F(JobCommandsTest, FollowResumesAfterTheLastEventWhenTheStreamBreaks) {
  fake_.PutJob(MakeJob("l-3", v1::JOB_STATE_RUNNING, 1));
  fake_.Append("l-3", LogEvent(0, "a"));
  fake_.Append("l-3", LogEvent(0, "b"));
  fake_.FailWatchAfter(2);
  auto logs = RunCliAsync(With({"logs", "l-3", "-f"}));
  ASSERT_TRUE(fake_.AwaitWatchCalls(2));
  fake_.Append("l-3", LogEvent(1, "c"));
  fake_.Append("l-3", StateEvent(v1::JOB_STATE_SUCCEEDED));
  CliResult r = logs.get();
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "[rank 0] a\n[rank 0] b\n[rank 1] c\n");  // nothing twice
  EXPECT_THAT(fake_.watch_after_seqs(), ElementsAre(0, 2));
}

TEST_F(JobCommandsTest, SubmitFollowStreamsLogsStatesAndMetrics) {
  fake_.SetOnSubmit({
      StateEvent(v1::JOB_STATE_RUNNING, "", 0),
      LogEvent(0, "loading target"),
      MetricsEvent(5, 10, R"({"step":5,"loss":1.5,"acc_k":[0.5],"tokens_per_s":2000})"),
      LogEvent(1, "rank one here"),
      StateEvent(v1::JOB_STATE_SUCCEEDED, "every rank exited 0"),
  });
  CliResult r = RunCli(With({"submit", dir_.Join("job.yaml"), "--follow"}));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out,
            "tiny-0000abcd\n"
            "[rank 0] loading target\n"
            "[rank 1] rank one here\n"
            "tiny-0000abcd SUCCEEDED: every rank exited 0\n");
  // stderr is no terminal here: states and metrics as lines, no bar.
  EXPECT_THAT(r.err, HasSubstr("state: tiny-0000abcd RUNNING\n"));
  EXPECT_THAT(r.err, HasSubstr("metrics: step 5/10 loss 1.5000 acc 0.500 tok/s 2.0k\n"));
  EXPECT_THAT(r.err, HasSubstr("state: tiny-0000abcd SUCCEEDED: every rank exited 0\n"));
  EXPECT_THAT(r.err, Not(HasSubstr("\033[K")));
}

TEST_F(JobCommandsTest, SubmitWaitReportsTheFinalState) {
  fake_.SetOnSubmit({StateEvent(v1::JOB_STATE_RUNNING), LogEvent(0, "quiet"),
                     StateEvent(v1::JOB_STATE_FAILED, "rank 0 exited 3")});
  CliResult r = RunCli(With({"submit", dir_.Join("job.yaml"), "--wait"}));
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_EQ(r.out, "tiny-0000abcd\ntiny-0000abcd FAILED: rank 0 exited 3\n");

  fake_.SetOnSubmit({StateEvent(v1::JOB_STATE_SUCCEEDED)});
  CliResult ok =
      RunCli(With({"submit", dir_.Join("job.yaml"), "--id", "two", "--wait", "-o", "json"}));
  EXPECT_EQ(ok.exit_code, 0) << Describe(ok);
  EXPECT_EQ(nlohmann::json::parse(ok.out)["state"], "JOB_STATE_SUCCEEDED");
}

TEST(JobFormattingTest, ListAndTableEscapeControlCharacters) {
  v1::ListJobsResponse jobs;
  Job* job = jobs.add_jobs();
  *job = MakeJob("a-1", v1::JOB_STATE_QUEUED, 1000);
  job->set_name("n\x1b[31m\x7f");
  job->set_reason(std::string(100, '\x1b'));
  const std::string list = FormatJobList(jobs, 2000);
  EXPECT_THAT(list, Not(HasSubstr("\x1b")));
  EXPECT_THAT(list, Not(HasSubstr("\x7f")));
  EXPECT_THAT(list, HasSubstr("n\\x1b[31m\\x7f "));
  // The long reason is cut after escaping, within the column's 80 bytes.
  EXPECT_THAT(list, HasSubstr("\\x1b\\x1b..."));
  const std::string table = FormatJobTable(*job);
  EXPECT_THAT(table, Not(HasSubstr("\x1b")));
  EXPECT_THAT(table, HasSubstr("name:           n\\x1b[31m\\x7f\n"));
}

TEST(JobFormattingTest, AgesAndTimes) {
  EXPECT_EQ(FormatAge(59'999), "59s");
  EXPECT_EQ(FormatAge(60'000), "1m");
  EXPECT_EQ(FormatAge(7'200'000), "2h");
  EXPECT_EQ(FormatAge(3 * 86'400'000LL), "3d");
  EXPECT_EQ(FormatAge(-5), "0s");
  EXPECT_EQ(FormatUnixMs(0), "-");
}

// `validate` checks a spec locally, with no coordinator, as submit would.
TEST_F(JobCommandsTest, ValidateChecksASpecWithoutACoordinator) {
  testing::WriteFile(dir_.Join("good.yaml"),
                     "name: good\ndata:\n  tokenized: /d.jsonl\nmodel:\n  target: /m\n"
                     "  draft:\n    draft_vocab_size: 64\noptimizer:\n  lr: 1.0e-3\n"
                     "training:\n  max_steps: 4\n  batch_size: 1\nparallel:\n  dp_size: 2\n");
  CliResult good = RunCli({"validate", dir_.Join("good.yaml")});
  ASSERT_EQ(good.exit_code, 0) << good.err;
  EXPECT_EQ(good.out, dir_.Join("good.yaml") + ": valid (good, 2 ranks)\n");
  CliResult json = RunCli({"validate", dir_.Join("good.yaml"), "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_NE(json.out.find("\"ttt_steps\":\"7\""), std::string::npos) << json.out;  // default
  testing::WriteFile(dir_.Join("bad.yaml"), "name: bad\ntraining:\n  max_stpes: 4\n");
  CliResult bad = RunCli({"validate", dir_.Join("bad.yaml")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("max_stpes"), std::string::npos) << bad.err;
  EXPECT_EQ(RunCli({"validate", dir_.Join("missing.yaml")}).exit_code, 2);
}

// YAML escapes put control characters in a valid spec's name; `validate`
// prints them escaped.
TEST_F(JobCommandsTest, ValidateEscapesTheName) {
  testing::WriteFile(dir_.Join("evil.yaml"),
                     "name: \"evil\\e[2J\\e]0;owned\\a\\x9b\"\ndata:\n  tokenized: /d.jsonl\n"
                     "model:\n  target: /m\n  draft:\n    draft_vocab_size: 64\n"
                     "optimizer:\n  lr: 1.0e-3\ntraining:\n  max_steps: 4\n  batch_size: 1\n");
  CliResult r = RunCli({"validate", dir_.Join("evil.yaml")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            dir_.Join("evil.yaml") + ": valid (evil\\x1b[2J\\x1b]0;owned\\x07\\u009b, 1 rank)\n");
}

}  // namespace
}  // namespace specstream::services
