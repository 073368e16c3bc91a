// The teacher's serving core (DESIGN §5), without gRPC: the options checked
// against the runtime's model, what Describe answers, the compute batcher,
// and the open stream sessions with their shutdown. The gRPC service
// (services/teacher/teacher_service.h) is a thin adapter over it: one
// StreamSession per StreamHiddenStates call, Describe from description().
//
// Lifetime: the runtime must outlive the core, and the core every session
// it made (a gRPC server over it shuts down before the core is destroyed).
// Thread-safety: every method may be called from any thread.
#ifndef SPECSTREAM_TEACHER_TEACHER_CORE_H_
#define SPECSTREAM_TEACHER_TEACHER_CORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/peer_limiter.h"
#include "common/transport/payload_channel.h"
#include "specstream/v1/teacher.pb.h"
#include "teacher/compute_batcher.h"
#include "teacher/queue_budget.h"
#include "teacher/stream_session.h"

namespace specstream::teacher {

class AnswerDecoder;
class TargetRuntime;

struct TeacherServiceOptions {
  // Element type of aux_hidden/last_hidden in payloads (and Describe.dtype):
  // "float32", "bfloat16" or "float16"; what `dump --store-dtype` writes.
  std::string payload_dtype = "bfloat16";
  // Send target_ids (the full-vocab argmax per position) in every payload.
  bool keep_target_ids = false;
  // The longest sample accepted (tokens); 0: the model's
  // max_position_embeddings. Never above it.
  int64_t max_tokens = 0;
  // The largest payload chunk sent (bytes, 4 KiB to 256 MiB); a stream's
  // Open.max_chunk_bytes and ring capacity may lower it per stream.
  uint64_t chunk_bytes = uint64_t{1} << 20;
  // Padded tokens (batch size x longest sequence) per Forward call; a longer
  // sample runs alone. >= 1; 1 runs every sample alone.
  int64_t max_batch_tokens = 8192;
  // Samples one stream may have materialised at once (>= 1), on top of the
  // credit bound.
  int max_samples_per_stream = 8;
  // SampleRequests one stream may have waiting for a credit (>= 1); one more
  // ends the stream with RESOURCE_EXHAUSTED.
  int max_queued_requests = 4096;
  // Bytes that SampleRequests waiting for a credit may hold over all streams
  // together (> 0; teacher/queue_budget.h says how a request is counted:
  // 4 bytes a token, 1 a loss-mask byte, 256 more). A request that would go
  // over is answered SampleError RESOURCE_EXHAUSTED; its stream goes on.
  // 256 MiB holds about 31,000 waiting 2k-token requests.
  int64_t max_queued_request_bytes = int64_t{256} << 20;
  // The same bound for one stream's waiting requests (> 0, counted the same
  // way; max_queued_request_bytes when that is less): one stream with no
  // credit cannot take the whole teacher-wide budget. 16 MiB holds about 2,000
  // waiting 2k-token requests, far more than any credit window.
  int64_t max_queued_request_bytes_per_stream = int64_t{16} << 20;
  // Streams open at once (>= 1), and from one address (>= 1); one more is
  // refused RESOURCE_EXHAUSTED once its token is admitted (calls still
  // being authorized have their own per-peer limit, peer_limits). Each open
  // stream holds at most max_samples_per_stream computed samples, its
  // waiting requests and one payload thread, so these bound what clients
  // that open streams and never read can make the teacher hold.
  int max_streams = 512;
  int max_streams_per_peer = 64;
  // How long a shm stream waits for the student to release ring space before
  // the stream ends with DEADLINE_EXCEEDED. The wait ends early when the
  // stream ends (cancelled, failed, server shutdown).
  absl::Duration shm_space_timeout = absl::Seconds(60);
  // The CUDA device that stages TRANSPORT_NCCL payloads; -1 (the default):
  // NCCL is not offered. Needs a build with SPECSTREAM_WITH_NCCL and a
  // visible device (InvalidArgument otherwise).
  int nccl_device = -1;
  // How long an NCCL stream waits for the student to join its communicator,
  // and for one payload to be received; past it the stream ends
  // (DEADLINE_EXCEEDED) and the student fails over.
  absl::Duration nccl_timeout = absl::Seconds(60);
  // Tests only: joins TRANSPORT_NCCL streams' channels instead of NCCL
  // (tests/testing/loopback_channel.h), so the stream protocol runs without
  // a GPU; when set, NCCL is offered whatever nccl_device says. Unset in
  // production.
  PayloadChannelJoin nccl_channel_for_testing;
  // Fault injection for tests only: called on the compute thread with each
  // sample's id and its packed payload after the contract (and CRC32C) was
  // computed; whatever it changes is sent, so a test can make the student's
  // VerifyPayload fail with DATA_LOSS. Must keep the payload's length. Unset
  // in production (and then payloads are sent from the tensors without
  // packing them first).
  std::function<void(int64_t sample_id, std::string& payload)> corrupt_payload_for_testing;
  // Who may open a sample stream or call Describe: called with the bearer
  // token the client sent ("" when none); it calls `done` exactly once, from
  // any thread, possibly before it returns, with OK or the refusal (e.g.
  // UNAUTHENTICATED) the call then ends with. It must not block: it runs on
  // the server's callback threads, which Describe and the health service
  // share. Unset: everyone. A standalone teacher compares a token file; a
  // teacher daemon under a coordinator admits the tokens of its running
  // jobs, waiting (without a thread) for a heartbeat when a token is new.
  using Authorizer =
      std::function<void(const std::string& bearer_token, std::function<void(absl::Status)> done)>;
  Authorizer authorize;
  // Per-peer limits on calls still being authorized and on refusals
  // (common/peer_limiter.h); apply only when `authorize` is set.
  PeerLimiterOptions peer_limits;
  // The clock of those limits and of WaitUntilIdle (null: Env::Default()).
  Env* clock = nullptr;
  // Answers (rpc Answer, an hf runtime on one rank): the ids that end one.
  // Empty: the model's eos ids. `serve` passes StopIds (teacher/
  // decode_target.h) with the model's tokenizer, as `dump --regenerate` and
  // `specstream-eval generate` use.
  std::vector<int32_t> answer_stop_ids;
  // Answer ids kept for repeated requests (every rank of a job asks for
  // every answer; the first computes it), oldest dropped first; >= 0.
  int64_t answer_cache_tokens = int64_t{4} << 20;
  // Answers decoded together, a token each per batched forward (>= 1);
  // more wait their turn. 1 decodes one at a time, bit for bit what
  // `specstream-eval generate` writes; a larger batch is faster on a teacher
  // serving several students but its GEMMs may round differently.
  int64_t answer_batch = 8;
};

class TeacherCore final {
 public:
  // Validates the options against the runtime's model (InvalidArgument
  // naming the option) and starts the compute thread. `runtime` is used only
  // from that thread from now on.
  static absl::StatusOr<std::unique_ptr<TeacherCore>> Create(TargetRuntime& runtime,
                                                             TeacherServiceOptions options);
  // Stop().
  ~TeacherCore();
  TeacherCore(const TeacherCore&) = delete;
  TeacherCore& operator=(const TeacherCore&) = delete;

  // What Describe answers.
  const v1::DescribeResponse& description() const { return description_; }
  // The largest StreamResponse the teacher sends (Describe.max_message_bytes)
  // and the largest StreamRequest it accepts.
  uint64_t max_message_bytes() const { return description_.max_message_bytes(); }
  uint64_t max_request_bytes() const;
  // Whether Describe lists TRANSPORT_NCCL (an nccl_device, or a test channel).
  bool offers_nccl() const;
  const TeacherServiceOptions& options() const { return options_; }

  // A new stream writing through `call` (valid until the session's OnDone),
  // registered until SessionDone. Begin it with Admit's verdict.
  std::shared_ptr<StreamSession> NewSession(StreamCall* call, std::string peer);
  // Admit for a stream made by NewSession, and then its place: an admitted
  // stream counts against max_streams and its address's
  // max_streams_per_peer until SessionDone; over either, the verdict is
  // RESOURCE_EXHAUSTED instead.
  void AdmitStream(StreamSession* session, const std::string& bearer_token,
                   std::function<void(absl::Status)> done);
  // Whether a new call (a stream, or Describe) from `peer` (a gRPC peer
  // string) with this bearer token may proceed; `done` gets the verdict once,
  // maybe before Admit returns: UNAVAILABLE while draining, else
  // options.authorize's verdict, except RESOURCE_EXHAUSTED in place of a
  // refusal or a wait when the peer is over its limits (a token the
  // teacher knows is admitted whatever the peer's count). Never blocks.
  void Admit(const std::string& bearer_token, const std::string& peer,
             std::function<void(absl::Status)> done);
  // The session's call is done (after its OnDone); it leaves the registry.
  void SessionDone(StreamSession* session);

  // The target's answer to a prompt (rpc Answer; Admit it first): decoded
  // on the compute thread, between batches, or taken from the answers kept
  // (a request equal to one being decoded waits for it). `done` gets the
  // answer ids once, from any thread, maybe before Answer returns:
  // InvalidArgument naming the field for a bad request, Unimplemented when
  // the runtime does not decode (Describe.answers false), Unavailable when
  // the teacher is draining or stops first.
  using AnswerDone = std::function<void(absl::StatusOr<std::vector<int32_t>>)>;
  void Answer(const v1::AnswerRequest& request, AnswerDone done);

  // --- Shutdown ---
  // New streams are refused UNAVAILABLE; each open stream drains
  // (StreamSession::Drain). Idempotent.
  void StartDraining();
  // Blocks until no stream is open and no answer is pending, or for
  // `timeout` on the options' clock; true when idle.
  bool WaitUntilIdle(absl::Duration timeout);
  // Stops the compute thread after its current batch; samples still queued
  // are dropped. Call after every stream is done. Idempotent.
  void Stop();

  // Counters since Create and the state now (for logs and tests).
  struct Stats {
    int64_t streams = 0;        // streams accepted
    int64_t samples_sent = 0;   // headers sent
    int64_t sample_errors = 0;  // SampleErrors sent
    int64_t forward_calls = 0;  // runtime Forward calls
    int64_t queued_jobs = 0;    // samples waiting for the compute thread now
    // Bytes charged now, and at most since Create, for requests waiting for
    // a credit (all streams; at most max_queued_request_bytes).
    int64_t queued_request_bytes = 0;
    int64_t queued_request_bytes_peak = 0;
    int64_t open_streams = 0;  // streams admitted now (AdmitStream, not yet SessionDone)
    int64_t streams_refused_over_limit = 0;  // by max_streams or max_streams_per_peer
    int64_t answers_decoded = 0;             // answers decoded whole
    int64_t answers_reused = 0;              // answered from the ones kept (or in progress)
    int64_t answer_steps = 0;                // batched decoding steps
    int64_t answer_step_rows = 0;            // answers those steps advanced
    bool draining = false;                   // StartDraining has run
  };
  Stats stats() const;

 private:
  // Out of line: the members' destructors need AnswerDecoder whole.
  explicit TeacherCore(TeacherServiceOptions options);
  // Counts an admitted stream, or RESOURCE_EXHAUSTED over the limits.
  absl::Status CountStream(StreamSession* session);
  // Checks an Answer request (InvalidArgument naming the field) and returns
  // its answer budget: max_new_tokens cut to max_tokens.
  absl::StatusOr<int64_t> CheckAnswerRequest(const v1::AnswerRequest& request) const;
  // A task on the compute thread (runtime null: dropped at Stop): starts
  // waiting answers (a prefill each) while fewer than answer_batch are under
  // way, advances every one under way by a token in one batched step, hands
  // finished ones to their waiters, and queues itself again while answers
  // remain. Batches of samples run between two steps.
  void AdvanceAnswers(TargetRuntime* runtime);
  // Hands an answer (or why it failed) to the waiters of `key` and keeps it.
  void FinishAnswer(const std::string& key, const absl::StatusOr<std::vector<int32_t>>& result);

  Env& clock() const { return Env::Or(options_.clock); }

  const TeacherServiceOptions options_;
  v1::DescribeResponse description_;
  int64_t max_tokens_ = 0;
  // Before batcher_: the compute thread's jobs hold sessions that charge it.
  std::unique_ptr<QueueBudget> queue_budget_;
  std::unique_ptr<ComputeBatcher> batcher_;
  StreamSessionConfig session_config_;  // shared by every session

  // Open sessions: a session registers when its call starts and leaves after
  // OnDone. Jobs hold references too, so a session outlives its call until
  // the compute thread lets go of it. Lock order: mu_ before a session's
  // mutex before stats_mu_.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<StreamSession*, std::shared_ptr<StreamSession>> sessions_
      ABSL_GUARDED_BY(mu_);
  // The admitted sessions (those AdmitStream let in), in all and per
  // address (PeerLimiter::PeerHost of their peer).
  absl::flat_hash_set<StreamSession*> admitted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> admitted_per_host_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  PeerLimiter peer_limiter_{options_.peer_limits};

  // Answers: those being decoded (with whoever waits) and those kept, keyed
  // by the request's bytes. Failures are not kept.
  struct KeptAnswer {
    bool decoded = false;
    std::vector<int32_t> ids;
    std::vector<AnswerDone> waiters;  // until decoded
  };
  absl::Mutex answers_mu_;  // after mu_, before stats_mu_
  absl::flat_hash_map<std::string, KeptAnswer> answers_ ABSL_GUARDED_BY(answers_mu_);
  std::deque<std::string> answers_kept_order_
      ABSL_GUARDED_BY(answers_mu_);  // decoded, oldest first
  int64_t answers_kept_tokens_ ABSL_GUARDED_BY(answers_mu_) = 0;
  int64_t answers_pending_ ABSL_GUARDED_BY(answers_mu_) = 0;  // being decoded or queued
  struct WaitingAnswer {
    std::string key;
    v1::AnswerRequest request;
    int64_t max_new = 0;  // CheckAnswerRequest's budget
  };
  std::deque<WaitingAnswer> answers_waiting_ ABSL_GUARDED_BY(answers_mu_);
  bool stepping_ ABSL_GUARDED_BY(answers_mu_) = false;  // an AdvanceAnswers task is queued
  // The answers under way: the compute thread's own (AdvanceAnswers).
  struct DecodingAnswer {
    WaitingAnswer waiting;
    std::unique_ptr<AnswerDecoder> decoder;
  };
  std::vector<DecodingAnswer> decoding_;
  std::vector<int32_t> answer_stop_ids_;  // set at Create when the runtime decodes

  mutable absl::Mutex stats_mu_;
  Stats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_TEACHER_CORE_H_
