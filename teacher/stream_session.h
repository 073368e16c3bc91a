// One StreamHiddenStates stream, as the protocol in
// proto/specstream/v1/teacher.proto defines it, without gRPC: an explicit
// state machine over the messages the student sends, the samples the
// compute batcher delivers, and a PayloadSender negotiated at Open.
//
//   kAwaitingOpen --Open accepted--> kConnecting --sender connected, Opened
//   queued--> kOpen; any state --End(status)--> kEnding (no new writes; the
//   call finishes once no write is in flight) --> kFinished.
//
// The session never writes itself: its StreamCall (the gRPC reactor in
// services/teacher/, or a test's recorder) starts one write at a time and
// reports completions back. Memory: a stream materialises at most
// min(credits not in flight, max_samples_per_stream) samples at once;
// requests waiting for a credit hold only their token ids, at most
// max_queued_requests of them and max_queued_request_bytes, each charged to
// the teacher's QueueBudget (shared by every stream) while it waits: one
// either bound cannot take is answered SampleError RESOURCE_EXHAUSTED, and
// the stream goes on. A request submitted at once (it has a credit, and
// nothing waits ahead of it) is not charged. Charges are released when a
// request is submitted, and every waiting one when the stream drains, ends
// or finishes. Refusals wait to be written too: at most
// max_queued_requests of them, or the stream ends.
//
// Threads: the call's callbacks (OnRequest, OnReadsDone, OnWriteDone,
// OnCancel, OnDone), the compute thread (Deliver), the teacher core (Drain)
// and the session's own payload thread (the sender's Connect and Send, which
// may block on ring space or NCCL) all take the session's one mutex; every
// event ends in Pump(), which submits requests that have a credit, starts
// the next write when none is in flight, or finishes the call. The session
// calls its StreamCall only under that mutex and never after Finish.
#ifndef SPECSTREAM_TEACHER_STREAM_SESSION_H_
#define SPECSTREAM_TEACHER_STREAM_SESSION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/capture_layers.h"
#include "common/transport/payload_sender.h"
#include "specstream/v1/teacher.pb.h"
#include "teacher/compute_batcher.h"
#include "teacher/queue_budget.h"

namespace specstream::teacher {

// The call a session writes through (one per stream).
class StreamCall {
 public:
  virtual ~StreamCall() = default;
  // Starts writing `message`; the call reports OnWriteDone when it
  // completes. At most one write is in flight. A message that cannot be
  // framed (serialization) is an error here, and nothing is written.
  virtual absl::Status StartWrite(const StreamMessage& message) = 0;
  // Ends the call with `status`; called once, with no write in flight. The
  // call reports OnDone after it.
  virtual void Finish(const absl::Status& status) = 0;
  // Starts reading the student's requests (the call reports each through
  // OnRequest, and reads the next when that returns true); called once, by
  // Begin, when the stream is admitted and has not ended.
  virtual void StartReading() = 0;
};

// What every session of a teacher shares: its limits and collaborators.
struct StreamSessionConfig {
  v1::DType payload_dtype = v1::DTYPE_BF16;  // what Opened streams send (Describe.dtype)
  int64_t max_tokens = 0;
  int64_t vocab_size = 0;
  int64_t num_layers = 0;  // bounds Open.capture_layer_ids
  int max_samples_per_stream = 8;
  int max_queued_requests = 4096;
  // What this stream's waiting requests may be charged in all (> 0).
  int64_t max_queued_request_bytes = int64_t{16} << 20;
  PayloadSenderConfig sender;
  ComputeBatcher* batcher = nullptr;  // outlives every session
  // The teacher-wide budget for waiting requests; outlives every session.
  // Null: no bound but max_queued_requests per stream (tests).
  QueueBudget* queue_budget = nullptr;
  // Counters (any thread; may be null).
  std::function<void()> on_sample_sent;
  std::function<void()> on_sample_error;
};

class StreamSession final : public SampleSink,
                            public PayloadStream,
                            public std::enable_shared_from_this<StreamSession> {
 public:
  enum class Phase { kAwaitingOpen, kConnecting, kOpen, kEnding, kFinished };

  // `config` must outlive the session; `call` must stay valid until OnDone.
  StreamSession(const StreamSessionConfig& config, StreamCall* call, std::string peer);
  // Joins the payload thread (OnDone normally has).
  ~StreamSession() override;
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  // --- From the call ---
  // Starts the stream, or refuses it with `refusal` (draining, not
  // authorized): it then finishes with that status at once. Admission may
  // be decided on any thread, after the call was cancelled. Returns whether
  // the stream started: then it has called StartReading on the call.
  bool Begin(const absl::Status& refusal);
  // One request read from the student; returns whether to read another.
  bool OnRequest(const v1::StreamRequest& request);
  // A request that did not parse: the stream ends (InvalidArgument).
  void OnMalformedRequest();
  // The student half-closed (no more requests).
  void OnReadsDone();
  void OnWriteDone(bool ok);
  void OnCancel();
  // The call is over: stops and joins the payload thread. Returns the
  // status the call finished with and the samples it sent (for logs).
  absl::Status OnDone(int64_t* samples_sent);

  // --- From the teacher core ---
  // Shutdown: waiting and new requests get SampleError UNAVAILABLE, the
  // materialised samples are sent, then the stream ends UNAVAILABLE.
  void Drain();

  // --- SampleSink (the compute thread) ---
  bool ended() const override { return ended_.load(std::memory_order_acquire); }
  void Deliver(uint64_t request_id,
               absl::StatusOr<std::shared_ptr<const ReadySample>> sample) override;

  // --- PayloadStream (the sender, on the payload thread) ---
  absl::Status Emit(StreamMessage message) override;
  bool stopped() const override { return ended(); }

  const std::string& peer() const { return peer_; }
  Phase phase() const;
  v1::Transport transport() const;

 private:
  void HandleLocked(const v1::StreamRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OpenLocked(const v1::StreamRequest::Open& open) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SampleLocked(const v1::StreamRequest::SampleRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueErrorLocked(uint64_t request_id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers a SampleRequest that is refused as it arrives; ends the stream
  // RESOURCE_EXHAUSTED instead when max_queued_requests control messages
  // already wait to be written (a student that does not read).
  void RefuseLocked(uint64_t request_id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::StreamResponse HeaderLocked(const ReadySample& sample) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PayloadDoneLocked(const ReadySample& sample) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next message to write, in protocol order (see the .cc), or none.
  std::optional<StreamMessage> NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SubmitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a credit and a materialisation slot are free.
  bool CanSubmitLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SubmitOneLocked(v1::StreamRequest::SampleRequest request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets every waiting request and releases its charge (the stream
  // ended, finished or drained; Drain answers them first).
  void DropQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stream fails: nothing more is sent, and the call finishes with
  // `status` as soon as no write is in flight. The first status wins.
  void EndLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Accepting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The payload thread: the sender's Connect, then each ready sample's
  // header and Send, in order.
  void PayloadLoop();

  const StreamSessionConfig& config_;
  StreamCall* const call_;
  const std::string peer_;
  std::atomic<bool> ended_{false};  // set under mu_; read lock-free
  std::thread payload_thread_;

  mutable absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kAwaitingOpen;
  std::optional<absl::Status> end_status_ ABSL_GUARDED_BY(mu_);  // kEnding and after
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool payload_thread_stop_ ABSL_GUARDED_BY(mu_) = false;
  // Negotiated at Open; used by the payload thread without the lock (it is
  // set before the thread starts and never changes).
  std::unique_ptr<PayloadSender> sender_;
  // Open.capture_layer_ids, given to every job (empty: the teacher's set).
  CaptureLayerIds capture_layer_ids_ ABSL_GUARDED_BY(mu_);
  // Flow control: in_flight_ counts samples holding a credit (submitted,
  // ready, being sent, or sent and not yet acked); materialized_ those whose
  // payload exists (submitted, ready, being sent).
  uint64_t granted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int materialized_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::StreamRequest::SampleRequest> queued_ ABSL_GUARDED_BY(mu_);  // awaiting credit
  // What queued_ is charged to config_.queue_budget (QueuedRequestBytes of each).
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<uint64_t> request_ids_ ABSL_GUARDED_BY(mu_);  // not yet fully answered
  absl::flat_hash_map<int64_t, int> unacked_ ABSL_GUARDED_BY(mu_);  // sample id -> headers sent
  int64_t samples_sent_ ABSL_GUARDED_BY(mu_) = 0;
  // Output: control messages (Opened, SampleErrors), and what the payload
  // thread queues (headers, chunks, shm locators), in order.
  // A payload counts as materialised until its last message is taken for
  // writing (its bytes may be referenced until then).
  struct Outgoing {
    StreamMessage message;
    std::shared_ptr<const ReadySample> completes;  // set on a payload's last message
  };
  std::deque<StreamMessage> control_ ABSL_GUARDED_BY(mu_);
  std::deque<Outgoing> payload_out_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<const ReadySample>> ready_ ABSL_GUARDED_BY(mu_);
  // A payload's header is queued and its last on-stream message is not.
  bool payload_open_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_STREAM_SESSION_H_
