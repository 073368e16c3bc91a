// Training samples streamed live from teacher daemons (DESIGN.md §5,
// proto/specstream/v1/teacher.proto): the online counterpart of StoreSource.
//
// Each trainer rank opens one TeacherService stream per teacher and requests
// the samples it will train (only its context-parallel rows, plus the TTT
// halo). Prefetch() asks ahead so that teachers compute while the student
// trains; at most `in_flight` samples per teacher are outstanding (the
// stream's credits), so memory on both sides stays bounded however slow the
// student is. Payloads arrive as PayloadChunks (inline or through a
// shared-memory ring) or over NCCL, and are checked against their contract
// and CRC32C before use.
//
// Failover and exactly-once: a sample whose teacher fails (stream ends:
// UNAVAILABLE, deadline, cancellation) or whose payload fails its checksum
// (DATA_LOSS) is requested again from another live teacher. A sample counts
// as trained only when Commit() is called for it after the optimizer step
// that used it; Commit acknowledges it to its teacher (returning the credit)
// and appends a line to the rank's ledger (JSONL: {"step", "rank",
// "sample_ids"}), so the ledger lists every trained sample exactly once.
//
// Reconnection (data.teacher_grace_s): a teacher whose stream is lost (a
// rolling restart, a crash) is reconnected to at the same address —
// Describe, which must show the same model, then a new stream — with
// capped exponential backoff and jitter, for `teacher_grace` from the
// moment it was lost (each teacher has its own grace). A refused token
// (UNAUTHENTICATED) is retried like a teacher that is down: a teacher under a
// coordinator that restarted learns the job's token only from its next
// heartbeat. Another model or an unusable transport (FAILED_PRECONDITION)
// gives the teacher up at once. Meanwhile its lost
// samples go to the other live teachers; when none is live they wait
// (parked, in request order) and are requested again, once each, from the
// first teacher back. Only when no teacher is live and no lost one is still
// within its grace — `teacher_grace` after the last live teacher was lost —
// do waiting samples fail (UNAVAILABLE, naming data.teacher_grace_s).
// Teachers that did not answer at Open are not retried.
//
// How bytes travel is not this file's business: the streams come from a
// TeacherConnector (student/teacher_connection.h; the gRPC one is
// services/student/grpc_teacher_connection.h), which reports whole, verified
// payloads and failures back.
//
// Thread-safety: the SampleSource methods are called from the training
// thread; the streams report on their own threads, under the source's one
// mutex (the locking contract of teacher_connection.h). With a grace, one
// reconnector thread (owned, joined by the destructor) Describes and opens
// streams without the mutex and starts them with it held.
#ifndef SPECSTREAM_STUDENT_ONLINE_SOURCE_H_
#define SPECSTREAM_STUDENT_ONLINE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/capture_layers.h"
#include "common/env.h"
#include "common/jobspec/job_spec.h"
#include "common/transport/payload_channel.h"
#include "student/data_source.h"
#include "student/teacher_connection.h"

namespace specstream::student {

// data.regenerate: the teachers write each sample's answer. The data then
// holds prompts ({"input_ids": prompt ids rendered with the generation
// prompt}, an optional integer "id"); Open asks the teachers for every
// answer (TeacherService.Answer) before any stream starts, and each sample is
// the prompt (loss 0) and its answer (loss 1), cut to max_length. Prompt i
// goes to the i-th answering teacher of `teachers` in turn (every rank asks
// the same one, which decodes it once), `in_flight` requests at a time per
// teacher (decoded together); a teacher that fails (unavailable,
// deadline) is given up for answers and its prompts go to the others.
// Answers are deterministic (sampled with seed + id, greedy at temperature
// 0), so a prompt answered again elsewhere, on resume or on another rank,
// is the same sample.
struct RegenerateOptions {
  bool on = false;
  int64_t max_new_tokens = jobspec::kDefaultRegenerateTokens;  // >= 1
  double temperature = 0;                                      // >= 0; 0: greedy
  uint64_t seed = 0;
};

struct OnlineSourceOptions {
  // Pre-tokenized JSONL: {"input_ids": [...], "loss_mask": [...]}; prompts
  // under `regenerate`.
  std::string data;
  int64_t max_length = 0;  // data.max_length: samples are cut to it (0: no limit)
  RegenerateOptions regenerate;
  std::vector<std::string> teachers;  // "host:port" of each teacher daemon
  // How this rank reaches them (required; shared by the ranks of a process).
  std::shared_ptr<TeacherConnector> connector;
  int rank = 0;  // trainer rank (spreads ranks over teachers; ledger name)
  int64_t in_flight =
      jobspec::kDefaultInFlight;  // samples outstanding per teacher stream (credits)
  // The target layers whose outputs each sample's aux_hidden holds,
  // concatenated in this order (id k = output of layer k): ascending,
  // distinct, each in [0, num_layers), any number of them (a DFlash / DSpark
  // draft's target_layer_ids). Every stream asks its teacher for them
  // (Open.capture_layer_ids) and model().capture_layer_ids reports them.
  // Empty: what the teachers capture by default (Describe), which must then
  // agree. Refused at Open: an invalid set (InvalidArgument), or a teacher
  // that cannot serve a set of its own choosing (FailedPrecondition), both
  // naming capture_layer_ids.
  CaptureLayerIds capture_layer_ids;
  std::string ledger;  // ledger file (JSONL, appended); empty: none
  // How long a lost teacher is reconnected to (data.teacher_grace_s);
  // zero: a lost teacher is given up at once (with no other live teacher,
  // samples fail at once). Backoff between attempts: from
  // `reconnect_backoff` doubling to `reconnect_max_backoff`, each delay
  // jittered by +-20%.
  absl::Duration teacher_grace = absl::Seconds(60);
  absl::Duration reconnect_backoff = absl::Milliseconds(100);
  absl::Duration reconnect_max_backoff = absl::Seconds(5);
  // How each teacher stream is made: transport, device, token, timeouts
  // (teacher_connection.h). Its rank, stream_index and capture_layer_ids
  // are set by the source;
  // stream.sample_timeout bounds one sample across failovers (plus
  // teacher_grace, which it may spend waiting for a teacher to come back).
  TeacherStreamOptions stream;
  // The clock of the grace, the reconnection backoff and the sample deadline
  // (null: Env::Default()).
  Env* clock = nullptr;
};

class OnlineSource final : public SampleSource {
 public:
  // Reads the data file, connects to every teacher (Describe; they must all
  // serve the same model) and opens the streams. Teachers that do not answer
  // are left out while at least one does.
  static absl::StatusOr<std::unique_ptr<OnlineSource>> Open(const OnlineSourceOptions& options);
  ~OnlineSource() override;

  int64_t size() const override;
  absl::StatusOr<TrainingSample> Get(int64_t index) override;
  absl::StatusOr<TrainingSample> GetRows(int64_t index, const RowRange& rows) override;
  const ModelContract& model() const override;
  int64_t Length(int64_t index) const override;
  bool has_target_ids() const override;
  absl::Status TokenIds(int64_t index, std::vector<int32_t>* ids,
                        std::vector<uint8_t>* mask) override;
  void Prefetch(const std::vector<int64_t>& indices, const RowRange& rows) override;
  // Raises every stream's credits to at least `samples` (never lowers them).
  void ReserveOutstanding(int64_t samples) override;
  absl::Status Commit(int64_t step, const std::vector<int64_t>& indices) override;

  // Samples re-requested after a teacher failure or a checksum mismatch.
  int64_t refetches() const;
  // Streams opened again to a lost teacher within its grace.
  int64_t reconnects() const;
  // Regeneration: prompts asked again of another teacher after theirs failed.
  int64_t answers_retried() const;

  class Impl;

 private:
  explicit OnlineSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_ONLINE_SOURCE_H_
