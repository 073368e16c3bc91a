// The coordinator's scheduling rules with a fake clock and scripted daemons
// (no processes): FIFO gang scheduling, teacher matching, rendezvous, lost
// daemons and restarts, failures, and recovery after a coordinator restart.
#include "services/coordinator/scheduler.h"

#include <string>
#include <vector>

#include "common/grpc/auth.h"
#include "common/jobspec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_env.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open() {
    scheduler_.reset();
    store_.reset();
    auto store = JobStore::Open(dir_.Join("jobs.db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    SchedulerOptions options;
    options.store = store_.get();
    options.heartbeat_interval = absl::Seconds(1);
    options.lost_after = absl::Seconds(10);
    options.env = &env_;
    auto scheduler = Scheduler::Create(options);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = std::move(*scheduler);
  }

  static std::string Spec(int dp, const std::string& extra = "") {
    return "name: t\ndata:\n  tokenized: /data.jsonl\nmodel:\n  target: /models/target\n"
           "  draft:\n    draft_vocab_size: 64\noptimizer:\n  lr: 1.0e-3\n"
           "training:\n  max_steps: 4\n  batch_size: 1\nparallel:\n  dp_size: " +
           std::to_string(dp) + "\n" + extra;
  }

  void RegisterStudent(const std::string& name, std::vector<v1::RankStatus> ranks = {}) {
    v1::RegisterRequest request;
    request.mutable_info()->set_name(name);
    request.mutable_info()->set_kind(v1::DAEMON_KIND_STUDENT);
    request.mutable_info()->set_host("10.0.0." + name.substr(1));
    for (auto& r : ranks) *request.add_ranks() = r;
    ASSERT_TRUE(scheduler_->Register(request).ok());
  }

  void RegisterTeacher(const std::string& name, const std::string& model) {
    v1::RegisterRequest request;
    request.mutable_info()->set_name(name);
    request.mutable_info()->set_kind(v1::DAEMON_KIND_TEACHER);
    request.mutable_info()->set_address(name + ":7000");
    request.mutable_info()->set_model(model);
    ASSERT_TRUE(scheduler_->Register(request).ok());
  }

  v1::HeartbeatResponse Beat(const std::string& name, std::vector<v1::RankStatus> ranks = {}) {
    v1::HeartbeatRequest request;
    request.set_daemon_id(name);
    for (auto& r : ranks) *request.add_ranks() = r;
    auto response = scheduler_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::HeartbeatResponse();
  }

  static v1::RankStatus Running(const v1::RankAssignment& a, int master_port = 0) {
    v1::RankStatus s;
    s.set_job_id(a.job_id());
    s.set_attempt(a.attempt());
    s.set_rank(a.rank());
    s.set_master_port(master_port);
    return s;
  }
  static v1::RankStatus Exited(const v1::RankAssignment& a, int code) {
    v1::RankStatus s = Running(a);
    s.set_exited(true);
    s.set_exit_code(code);
    if (code != 0) s.set_reason("boom");
    return s;
  }

  v1::Job Job(const std::string& id) {
    auto job = scheduler_->Get(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // The reasons of the job's state changes so far, one per line.
  std::string Reasons(const std::string& id) {
    bool finished = false;
    auto events = scheduler_->WaitEvents(id, 0, absl::ZeroDuration(), &finished);
    EXPECT_TRUE(events.ok()) << events.status();
    std::string out;
    if (events.ok()) {
      for (const auto& e : *events) out += e.state().reason() + "\n";
    }
    return out;
  }

  // Starts both ranks of a dp=2 job on s1 (rank 0) and s2; returns their
  // assignments.
  std::vector<v1::RankAssignment> StartPair(const std::string& id) {
    std::vector<v1::RankAssignment> out(2);
    v1::HeartbeatResponse r0 = Beat(Job(id).ranks(0).daemon_id());
    EXPECT_EQ(r0.start_size(), 1);
    if (r0.start_size() != 1) return out;
    out[0] = r0.start(0);
    // Rank 1 waits for rank 0's rendezvous port.
    EXPECT_EQ(Beat(Job(id).ranks(1).daemon_id()).start_size(), 0);
    Beat(Job(id).ranks(0).daemon_id(), {Running(out[0], 29555)});
    v1::HeartbeatResponse r1 = Beat(Job(id).ranks(1).daemon_id());
    EXPECT_EQ(r1.start_size(), 1);
    if (r1.start_size() != 1) return out;
    out[1] = r1.start(0);
    Beat(Job(id).ranks(1).daemon_id(), {Running(out[1])});
    return out;
  }

  // A teacher t1, students s1 and s2, and job "job" (dp 2) running on them.
  std::vector<v1::RankAssignment> RunningPair() {
    RegisterTeacher("t1", "/models/target");
    RegisterStudent("s1");
    RegisterStudent("s2");
    if (!scheduler_->Submit(Spec(2), "job").ok()) return {};
    return StartPair("job");
  }

  testing::TempDir dir_;
  testing::FakeEnv env_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, GangSchedulesInFifoOrderAndMatchesTeachersByModel) {
  auto first = scheduler_->Submit(Spec(2), "first");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = scheduler_->Submit(Spec(1), "second");
  ASSERT_TRUE(second.ok());
  RegisterStudent("s1");
  EXPECT_EQ(Job("first").state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job("first").reason(), "waiting for 2 free student daemons (1 free, 1 live)");
  // FIFO: the 1-rank job does not jump the queue.
  EXPECT_EQ(Job("second").state(), v1::JOB_STATE_QUEUED);
  RegisterStudent("s2");
  EXPECT_EQ(Job("first").reason(),
            "waiting for a teacher serving /models/target (no live teachers)");
  RegisterTeacher("t-other", "/models/other");
  EXPECT_EQ(Job("first").state(), v1::JOB_STATE_QUEUED);
  RegisterTeacher("t1", "/models/target");
  v1::Job job = Job("first");
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.teachers_size(), 1);
  EXPECT_EQ(job.teachers(0), "t1:7000");

  auto assignments = StartPair("first");
  EXPECT_EQ(assignments[0].master_port(), 0);
  EXPECT_EQ(assignments[1].master_port(), 29555);
  EXPECT_EQ(assignments[1].master_addr(), "10.0.0.1");
  EXPECT_EQ(assignments[1].world_size(), 2);
  EXPECT_EQ(assignments[1].spec().data().teachers(0), "t1:7000");
  EXPECT_FALSE(assignments[1].resume());
  EXPECT_FALSE(assignments[1].job_token().empty());
  // The job's teacher learns the hash of its token, never the token; a
  // teacher the job was not given learns nothing.
  v1::HeartbeatResponse teacher = Beat("t1");
  ASSERT_EQ(teacher.job_token_hashes_size(), 1);
  EXPECT_EQ(teacher.job_token_hashes(0), TokenHash(assignments[0].job_token()));
  RegisterTeacher("t9", "/models/other");
  EXPECT_EQ(Beat("t9").job_token_hashes_size(), 0);
  // The store keeps only the hash.
  EXPECT_EQ(*store_->TokenHash("first"), TokenHash(assignments[0].job_token()));

  Beat("s1", {Exited(assignments[0], 0)});
  EXPECT_EQ(Job("first").state(), v1::JOB_STATE_RUNNING);
  Beat("s2", {Exited(assignments[1], 0)});
  EXPECT_EQ(Job("first").state(), v1::JOB_STATE_SUCCEEDED);
  // The freed daemon takes the next job.
  EXPECT_EQ(Job("second").state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Beat("t1").job_token_hashes_size(), 1);
}

TEST_F(SchedulerTest, LostDaemonRestartsFromCheckpointUntilMaxRestarts) {
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1");
  RegisterStudent("s2");
  RegisterStudent("s3");
  ASSERT_TRUE(scheduler_->Submit(Spec(2, "max_restarts: 1\n"), "job").ok());
  auto a = StartPair("job");
  const std::string victim = Job("job").ranks(1).daemon_id();
  const std::string survivor = Job("job").ranks(0).daemon_id();
  // The victim goes silent; the others keep beating.
  for (int i = 0; i < 11; ++i) {
    env_.Advance(absl::Seconds(1));
    Beat(survivor, {Running(a[0], 29555)});
    Beat("s3");
    Beat("t1");
  }
  v1::Job job = Job("job");
  EXPECT_EQ(job.attempt(), 1);
  // The survivor is told to stop its rank of the old attempt.
  v1::HeartbeatResponse reply = Beat(survivor, {Running(a[0], 29555)});
  ASSERT_EQ(reply.stop_size(), 1);
  EXPECT_EQ(reply.stop(0).attempt(), 0);
  // It is free once the old rank exited; the job restarts on it and s3.
  Beat(survivor, {Exited(a[0], 143)});
  job = Job("job");
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  for (const auto& placement : job.ranks()) EXPECT_NE(placement.daemon_id(), victim);
  auto b = StartPair("job");
  EXPECT_TRUE(b[0].resume());
  EXPECT_EQ(b[0].attempt(), 1);
  // Losing a daemon again exceeds max_restarts: 1.
  const std::string second_victim = job.ranks(1).daemon_id();
  const std::string second_survivor = job.ranks(0).daemon_id();
  for (int i = 0; i < 11; ++i) {
    env_.Advance(absl::Seconds(1));
    Beat(second_survivor, {Running(b[0], 29555)});
  }
  job = Job("job");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find("max_restarts (1) used up"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find(second_victim), std::string::npos) << job.reason();
  // Lost daemons must register again.
  v1::HeartbeatRequest request;
  request.set_daemon_id(victim);
  EXPECT_EQ(scheduler_->Heartbeat(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, FailingRankFailsTheJobAfterTheGraceAndStopsTheOthers) {
  auto a = RunningPair();
  ASSERT_EQ(a.size(), 2u);
  Beat("s2", {Exited(a[1], 1)});
  // The other rank is stopped at once; the verdict waits for lost_after.
  v1::HeartbeatResponse reply = Beat("s1", {Running(a[0], 29555)});
  EXPECT_EQ(reply.stop_size(), 1);
  EXPECT_EQ(Job("job").state(), v1::JOB_STATE_RUNNING);
  env_.Advance(absl::Seconds(11));
  Beat("s1", {Exited(a[0], 143)});
  v1::Job job = Job("job");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.reason(), "rank 1 exited with code 1: boom");
  EXPECT_EQ(job.attempt(), 0);
}

// The OOM killer's SIGKILL is not the run's failure: the job restarts from
// its checkpoint under max_restarts, as for a lost daemon.
TEST_F(SchedulerTest, ARankKilledBySigkillRestartsTheJob) {
  auto a = RunningPair();
  ASSERT_EQ(a.size(), 2u);
  Beat("s2", {Exited(a[1], 128 + 9)});
  v1::Job job = Job("job");
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  const std::string reasons = Reasons("job");
  EXPECT_NE(reasons.find("restart 1 of 3 from the latest checkpoint after: rank 1 on s2 was "
                         "killed (SIGKILL"),
            std::string::npos)
      << reasons;
}

// A rank its daemon had to kill while the attempt was already failing
// does not turn the failure into a restart.
TEST_F(SchedulerTest, ASigkillWhileFailingKeepsTheFailure) {
  auto a = RunningPair();
  ASSERT_EQ(a.size(), 2u);
  Beat("s2", {Exited(a[1], 1)});
  Beat("s1", {Exited(a[0], 128 + 9)});
  env_.Advance(absl::Seconds(11));
  Beat("s1");
  v1::Job job = Job("job");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.reason(), "rank 1 exited with code 1: boom");
}

// After a coordinator restart the job token is gone (only its hash is
// stored): a rank that has yet to start cannot join its attempt, which
// restarts with a new token.
TEST_F(SchedulerTest, ARankNotStartedBeforeACoordinatorRestartGetsANewAttempt) {
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1");
  RegisterStudent("s2");
  ASSERT_TRUE(scheduler_->Submit(Spec(2), "job").ok());
  v1::HeartbeatResponse r0 = Beat(Job("job").ranks(0).daemon_id());
  ASSERT_EQ(r0.start_size(), 1);
  const std::string old_token = r0.start(0).job_token();
  Open();
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1", {Running(r0.start(0), 29555)});
  RegisterStudent("s2");
  for (int i = 0; i < 3; ++i) {
    env_.Advance(absl::Seconds(4));
    Beat("t1");
    EXPECT_EQ(Beat("s2").start_size(), 0);
    Beat("s1", {Running(r0.start(0), 29555)});
  }
  EXPECT_EQ(Job("job").attempt(), 1);
  // s1's old rank is told to stop; once it exits the new attempt starts.
  Beat("s1", {Exited(r0.start(0), 143)});
  v1::Job job = Job("job");
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  v1::HeartbeatResponse fresh = Beat(job.ranks(0).daemon_id());
  ASSERT_EQ(fresh.start_size(), 1);
  EXPECT_FALSE(fresh.start(0).job_token().empty());
  EXPECT_NE(fresh.start(0).job_token(), old_token);
  EXPECT_EQ(*store_->TokenHash("job"), TokenHash(fresh.start(0).job_token()));
  EXPECT_EQ(Beat("t1").job_token_hashes(0), TokenHash(fresh.start(0).job_token()));
}

TEST_F(SchedulerTest, StopAndEvents) {
  ASSERT_TRUE(scheduler_->Submit(Spec(1), "job").ok());
  auto stopped = scheduler_->Stop("job", "");
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state(), v1::JOB_STATE_STOPPED);
  bool finished = false;
  auto events = scheduler_->WaitEvents("job", 0, absl::ZeroDuration(), &finished);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(finished);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].state().state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ((*events)[1].state().state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ((*events)[1].seq(), 2);
  EXPECT_EQ(scheduler_->Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->Stop("nope", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->Submit(Spec(1), "job").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(scheduler_->Submit(Spec(1), "../x").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad = scheduler_->Submit(Spec(1, "training_typo: 1\n"), "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("training_typo"), std::string::npos);
}

TEST_F(SchedulerTest, RunningJobSurvivesACoordinatorRestart) {
  auto a = RunningPair();
  ASSERT_EQ(a.size(), 2u);
  Open();  // the coordinator restarts on the same database
  EXPECT_EQ(Job("job").state(), v1::JOB_STATE_RUNNING);
  // Daemons are unknown until they register again, reporting their ranks.
  v1::HeartbeatRequest request;
  request.set_daemon_id("s1");
  EXPECT_EQ(scheduler_->Heartbeat(request).status().code(), absl::StatusCode::kNotFound);
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1", {Running(a[0], 29555)});
  RegisterStudent("s2", {Running(a[1])});
  for (int i = 0; i < 6; ++i) {
    env_.Advance(absl::Seconds(5));
    EXPECT_EQ(Beat("s1", {Running(a[0], 29555)}).start_size(), 0);  // nothing restarted
    Beat("s2", {Running(a[1])});
    Beat("t1");
  }
  EXPECT_EQ(Job("job").state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job("job").attempt(), 0);
  Beat("s1", {Exited(a[0], 0)});
  Beat("s2", {Exited(a[1], 0)});
  EXPECT_EQ(Job("job").state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Job("job").attempt(), 0);
}

TEST_F(SchedulerTest, UnclaimedPlacementAfterRestartCountsAsLost) {
  auto a = RunningPair();
  ASSERT_EQ(a.size(), 2u);
  Open();
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1", {Running(a[0], 29555)});
  env_.Advance(absl::Seconds(11));  // s2 never comes back
  Beat("s1", {Running(a[0], 29555)});
  v1::Job job = Job("job");
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  // Why it restarted is in its state events.
  bool finished = true;
  auto events = scheduler_->WaitEvents("job", 0, absl::ZeroDuration(), &finished);
  ASSERT_TRUE(events.ok());
  EXPECT_FALSE(finished);
  std::string reasons;
  for (const auto& e : *events) reasons += e.state().reason() + "\n";
  EXPECT_NE(reasons.find("restart 1 of 3 from the latest checkpoint after: student daemon s2 "
                         "did not re-register with rank 1"),
            std::string::npos)
      << reasons;
}

TEST_F(SchedulerTest, DaemonBackWithoutItsRankAfterARestartCountsAsLost) {
  auto a = RunningPair();
  ASSERT_EQ(a.size(), 2u);
  Open();
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1", {Running(a[0], 29555)});
  RegisterStudent("s2");  // back, but without rank 1 (it restarted too)
  EXPECT_EQ(Job("job").state(), v1::JOB_STATE_RUNNING);  // within the claim window
  for (int i = 0; i < 3; ++i) {
    env_.Advance(absl::Seconds(4));
    Beat("t1");
    Beat("s2");
    Beat("s1", {Running(a[0], 29555)});
  }
  v1::Job job = Job("job");
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_NE(job.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(SchedulerTest, ExitsRecordedBeforeARestartAreDecidedAfterIt) {
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1");
  ASSERT_TRUE(scheduler_->Submit(Spec(1), "ok").ok());
  v1::HeartbeatResponse first = Beat("s1");
  ASSERT_EQ(first.start_size(), 1);
  v1::RankAssignment a = first.start(0);
  Beat("s1", {Running(a, 29555)});
  // The exit is stored, then the coordinator dies before deciding.
  v1::Job stored = Job("ok");
  stored.mutable_ranks(0)->set_exited(true);
  ASSERT_TRUE(store_->Update(stored).ok());
  Open();
  EXPECT_EQ(Job("ok").state(), v1::JOB_STATE_SUCCEEDED);

  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1");
  ASSERT_TRUE(scheduler_->Submit(Spec(1), "bad").ok());
  v1::HeartbeatResponse reply = Beat("s1");
  ASSERT_EQ(reply.start_size(), 1) << Job("bad").reason();
  a = reply.start(0);
  Beat("s1", {Running(a, 29555)});
  stored = Job("bad");
  stored.mutable_ranks(0)->set_exited(true);
  stored.mutable_ranks(0)->set_exit_code(2);
  ASSERT_TRUE(store_->Update(stored).ok());
  Open();
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1", {Exited(a, 2)});
  EXPECT_EQ(Job("bad").state(), v1::JOB_STATE_RUNNING);  // deciding
  env_.Advance(absl::Seconds(11));
  Beat("s1");
  EXPECT_EQ(Job("bad").state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(Job("bad").reason(), "rank 0 exited with code 2");
}

TEST_F(SchedulerTest, DrainingDaemonRestartsItsJobAndGetsNoNewRanks) {
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1");
  RegisterStudent("s2");
  RegisterStudent("s3");
  ASSERT_TRUE(scheduler_->Submit(Spec(2), "job").ok());
  auto a = StartPair("job");
  const std::string leaving = Job("job").ranks(1).daemon_id();
  const std::string staying = Job("job").ranks(0).daemon_id();
  v1::HeartbeatRequest request;
  request.set_daemon_id(leaving);
  *request.add_ranks() = Running(a[1]);
  request.set_draining(true);
  ASSERT_TRUE(scheduler_->Heartbeat(request).ok());
  // Its rank's SIGTERM exit does not fail the job: it restarts.
  *request.mutable_ranks(0) = Exited(a[1], 143);
  ASSERT_TRUE(scheduler_->Heartbeat(request).ok());
  Beat(staying, {Exited(a[0], 143)});
  v1::Job job = Job("job");
  EXPECT_EQ(job.attempt(), 1);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  for (const auto& placement : job.ranks()) EXPECT_NE(placement.daemon_id(), leaving);
}

// The ids of a List page.
std::vector<std::string> Ids(const v1::ListJobsResponse& page) {
  std::vector<std::string> ids;
  for (const v1::Job& job : page.jobs()) ids.push_back(job.id());
  return ids;
}

TEST_F(SchedulerTest, SubmitRefusedStoresNothing) {
  // Past the spec size limit, invalid, and a bad id: each refused before
  // anything is written.
  std::string oversize = Spec(1) + "# " + std::string(jobspec::kMaxSpecBytes, 'x') + "\n";
  EXPECT_EQ(scheduler_->Submit(oversize, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_->Submit(Spec(1, "extra_field: 1\n"), "bad-spec").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_->Submit(Spec(1), "bad/id").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_->Get("bad-spec").status().code(), absl::StatusCode::kNotFound);
  auto listed = scheduler_->List(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->jobs_size(), 0);
  auto stored = store_->List(0);
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->empty());

  // A taken id leaves the first job as it was, with its one event.
  ASSERT_TRUE(scheduler_->Submit(Spec(1), "taken").ok());
  const int64_t events = store_->LastSeq("taken").value_or(-1);
  EXPECT_EQ(scheduler_->Submit(Spec(2), "taken").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Job("taken").world_size(), 1);
  EXPECT_EQ(store_->Get("taken")->world_size(), 1);
  EXPECT_EQ(store_->LastSeq("taken").value_or(-1), events);
}

TEST_F(SchedulerTest, SubmittedJobIsStoredQueuedWithItsFirstEvent) {
  ASSERT_TRUE(scheduler_->Submit(Spec(2), "j").ok());
  // The store's copy, as a restarted coordinator would read it.
  auto stored = store_->Get("j");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->state(), v1::JOB_STATE_QUEUED);
  auto events = store_->Events("j", 0);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_FALSE(events->empty());
  EXPECT_EQ(events->at(0).seq(), 1);
  EXPECT_EQ(events->at(0).state().state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(events->at(0).state().reason(), "submitted; needs 2 student daemons");
  auto active = store_->ListActive();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->size(), 1u);
}

TEST_F(SchedulerTest, ListPagesNewestFirstWithoutSpecs) {
  RegisterTeacher("t1", "/models/target");
  RegisterStudent("s1");
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(scheduler_->Submit(Spec(1), id).ok());
  // "a" runs: the in-memory state (RUNNING on s1) is what List shows.
  v1::ListJobsRequest request;
  request.set_limit(2);
  auto first = scheduler_->List(request);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Ids(*first), (std::vector<std::string>{"c", "b"}));
  ASSERT_FALSE(first->next_page_token().empty());
  for (const v1::Job& job : first->jobs()) {
    EXPECT_TRUE(job.spec_yaml().empty());
    EXPECT_FALSE(job.has_spec());
    EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  }
  request.set_page_token(first->next_page_token());
  auto second = scheduler_->List(request);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Ids(*second), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(second->next_page_token().empty());
  EXPECT_EQ(second->jobs(0).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(second->jobs(0).ranks(0).daemon_id(), "s1");
  EXPECT_TRUE(second->jobs(0).spec_yaml().empty());
  // Get still returns the spec.
  EXPECT_EQ(Job("a").spec_yaml(), Spec(1));
  EXPECT_TRUE(Job("a").has_spec());

  // limit 0: every job, on one page here.
  auto all = scheduler_->List(v1::ListJobsRequest());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Ids(*all), (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_TRUE(all->next_page_token().empty());
}

TEST_F(SchedulerTest, ListRefusesAMalformedPageTokenOrANegativeLimit) {
  ASSERT_TRUE(scheduler_->Submit(Spec(1), "a").ok());
  for (const std::string token : {"garbage!", "bm90IGEgdG9rZW4", "ajEuLTM", "ajEueA", "ajEuMA"}) {
    v1::ListJobsRequest request;
    request.set_page_token(token);
    auto page = scheduler_->List(request);
    EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_THAT(std::string(page.status().message()), ::testing::HasSubstr("page_token")) << token;
  }
  v1::ListJobsRequest negative;
  negative.set_limit(-1);
  auto page = scheduler_->List(negative);
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(page.status().message()), ::testing::HasSubstr("limit"));
}

TEST_F(SchedulerTest, ListStaysSmallWhateverTheStoredJobsHold) {
  // Records no Submit would take (8 MiB specs, 600 KiB reasons), written
  // straight to the store.
  for (int i = 0; i < 6; ++i) {
    v1::Job job;
    job.set_id("huge" + std::to_string(i));
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.set_spec_yaml(std::string(8 << 20, 'x'));
    job.set_reason(std::string(600 << 10, 'r'));
    ASSERT_TRUE(store_->Insert(job, "t").ok());
  }
  v1::ListJobsRequest request;
  int pages = 0;
  int jobs = 0;
  do {
    auto page = scheduler_->List(request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->ByteSizeLong(), size_t{1} << 20);
    EXPECT_GE(page->jobs_size(), 1);
    jobs += page->jobs_size();
    request.set_page_token(page->next_page_token());
    ASSERT_LE(++pages, 10) << "pages never end";
  } while (!request.page_token().empty());
  EXPECT_EQ(jobs, 6);
  EXPECT_EQ(pages, 6);  // 600 KiB each: one per 1 MiB page
}

}  // namespace
}  // namespace specstream::services
