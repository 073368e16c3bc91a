// The coordinator's core: jobs (durable, in a JobStore), the registry of
// daemons (in memory, rebuilt from registrations), and the scheduling rules.
// services/coordinator/coordinator_service.h adapts it to gRPC; nothing here includes
// generated service code.
//
// Rules:
//   * Jobs are gang-scheduled in FIFO order: the oldest QUEUED job starts
//     when dp_size x cp_size student daemons are free (alive, no rank, no
//     child still running) and, for online jobs without explicit
//     data.teachers, at least one live teacher serves model.target (its
//     --model path or --model-name). Later jobs wait behind it.
//   * A daemon is lost when its heartbeats stop for `lost_after`. A RUNNING
//     job with a rank on a lost daemon restarts: its other ranks are stopped,
//     the attempt number grows, and it queues again (the next attempt resumes
//     from the latest checkpoint) until max_restarts is used up, then FAILED.
//   * A rank that exits non-zero stops the job's other ranks; the decision
//     waits `lost_after` (a dead peer usually surfaces first as a failing
//     rank): restart if a daemon of the gang was lost meanwhile, else FAILED
//     with the rank's exit code and last stderr lines.
//   * Every rank exiting 0 is SUCCEEDED; Stop is STOPPED.
//   * After a coordinator restart, RUNNING jobs keep their placements; the
//     daemons re-register reporting their ranks and are adopted. A placement
//     no daemon claims within `lost_after` counts as lost.
//
// Thread-safe: one mutex over the in-memory state; store writes happen under
// it (they are short SQLite transactions).
#ifndef SPECSTREAM_SERVICES_COORDINATOR_SCHEDULER_H_
#define SPECSTREAM_SERVICES_COORDINATOR_SCHEDULER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/metrics_http.h"
#include "services/coordinator/job_store.h"
#include "specstream/v1/coordinator.pb.h"

namespace specstream::services {

struct SchedulerOptions {
  JobStore* store = nullptr;  // required; outlives the scheduler
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration lost_after = absl::Seconds(10);
  // The clock (Env::Now); null is Env::Default(). Tests pass a FakeEnv.
  Env* env = nullptr;
  // A List page stops before its jobs pass this many serialized bytes
  // (always holding one): well under a client's default 4 MiB receive limit.
  size_t list_page_bytes = size_t{1} << 20;
};

class Scheduler final {
 public:
  // Loads the active jobs from the store.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // JobService. Errors carry the status the RPC answers with.
  absl::StatusOr<v1::Job> Submit(const std::string& spec_yaml, const std::string& id);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // One page of jobs, newest first, without spec_yaml and spec (see
  // JobService.List): at most request.limit jobs (0: any number) and about
  // `list_page_bytes` serialized. InvalidArgument naming `limit` or
  // `page_token` for a negative limit or a token List did not issue.
  absl::StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> Stop(const std::string& id, const std::string& reason);
  // Events of job `id` after `after_seq`; when there are none yet and the job
  // is not finished, waits up to `wait` for some. `finished` tells whether
  // the job has reached a terminal state (its last event is then stored).
  absl::StatusOr<std::vector<v1::JobEvent>> WaitEvents(const std::string& id, int64_t after_seq,
                                                       absl::Duration wait, bool* finished);

  // RegistryService.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  std::vector<v1::DaemonStatus> Daemons();

  // Marks lost daemons, ends broken attempts and starts queued jobs. The
  // coordinator calls it every heartbeat interval; calls are cheap.
  void Tick();

  // Gauges for /metrics: jobs by state, daemons by kind and state.
  void Collect(MetricsRegistry& registry);

 private:
  struct State;
  explicit Scheduler(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_COORDINATOR_SCHEDULER_H_
