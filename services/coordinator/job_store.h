// The coordinator's durable state: jobs and their events in one SQLite
// database in WAL mode (the embedded default; one file, survives restarts).
//
// Tables: jobs (id, submission order, state, the serialized v1::Job, the
// job's secret token) and events (job id, seq, time, the serialized
// v1::JobEvent). A job's events are numbered 1, 2, ... without gaps.
//
// Thread-safe: one connection behind a mutex; every write is one transaction
// (BEGIN IMMEDIATE), so several JobStores (or processes) on the same file also
// number events without gaps. Errors from SQLite carry the path and SQLite's
// message.
#ifndef SPECSTREAM_SERVICES_COORDINATOR_JOB_STORE_H_
#define SPECSTREAM_SERVICES_COORDINATOR_JOB_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "specstream/v1/coordinator.pb.h"

namespace specstream::services {

class JobStore final {
 public:
  // Opens or creates the database at `path` (WAL, synchronous=NORMAL,
  // busy timeout), creating the schema when absent. Errors name the path.
  // Events are timed on `clock` (null: Env::Default()).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        Env* clock = nullptr);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // AlreadyExists "job <id> already exists" when the id is taken.
  // `token_hash` is the job token's TokenHash (common/grpc/auth.h): the store
  // never holds a token someone could present. `events` (their job_id empty
  // or job.id()) are appended in the same transaction, numbered from 1 in
  // place, so a job is never stored without its first events; on error
  // nothing is written and `events` is left as it was.
  absl::Status Insert(const v1::Job& job, const std::string& token_hash,
                      std::vector<v1::JobEvent>* events = nullptr);
  // Replaces a job's token hash (a new attempt's token); NotFound when absent.
  absl::Status SetTokenHash(const std::string& id, const std::string& token_hash);
  // Replaces the stored job (NotFound when absent) and appends `events` in
  // the same transaction; each event's seq (and unix_ms when 0) is assigned
  // in place. An event's empty job_id is filled with job.id(); another job's
  // id is InvalidArgument. On error nothing is written and `events` is left
  // as it was.
  absl::Status Update(const v1::Job& job, std::vector<v1::JobEvent>* events = nullptr);
  // Appends events (any jobs) in one transaction, assigning seq / unix_ms in
  // place (seq: the job's last seq + 1; a caller-set seq is overwritten).
  // InvalidArgument for an event without job_id, NotFound for an unknown job;
  // on error nothing is written and `events` is left as it was.
  absl::Status Append(std::vector<v1::JobEvent>& events);

  // NotFound "job <id> not found".
  absl::StatusOr<v1::Job> Get(const std::string& id);
  absl::StatusOr<std::string> TokenHash(const std::string& id);
  // Newest first (by submission order); limit 0: all. Whole jobs, specs
  // included: for tests and tools; the service lists with ListPage.
  absl::StatusOr<std::vector<v1::Job>> List(int limit);

  // One page of job summaries: jobs without spec_yaml and spec.
  struct Page {
    std::vector<v1::Job> jobs;  // newest first
    // Pass as `before_ord` for the next page; 0: this was the last page.
    int64_t next_before_ord = 0;
  };
  // The newest jobs submitted before submission number `before_ord` (0: the
  // newest of all), at most `limit` of them (0: no count limit), and no more
  // than fit in `max_bytes` of serialized summaries (0: no size limit; the
  // first job is returned whatever its size). Rows are read one at a time,
  // so a page's memory is bounded by the page, not the table.
  // InvalidArgument for a negative argument.
  absl::StatusOr<Page> ListPage(int64_t before_ord, int limit, size_t max_bytes);
  // QUEUED and RUNNING jobs in submission order (FIFO).
  absl::StatusOr<std::vector<v1::Job>> ListActive();

  // Events of `job_id` with seq > after_seq, in order; limit 0: all.
  // NotFound for an unknown job.
  absl::StatusOr<std::vector<v1::JobEvent>> Events(const std::string& job_id, int64_t after_seq,
                                                   int limit = 0);
  // The highest seq of the job (0 when it has none); NotFound for an
  // unknown job.
  absl::StatusOr<int64_t> LastSeq(const std::string& job_id);

 private:
  struct Impl;
  explicit JobStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_COORDINATOR_JOB_STORE_H_
