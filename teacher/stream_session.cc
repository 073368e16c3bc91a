#include "teacher/stream_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"
#include "teacher/sample_request.h"
#include "teacher/stream_request.h"

namespace specstream::teacher {
namespace {

using v1::StreamRequest;
using v1::StreamResponse;
using SampleRequest = v1::StreamRequest::SampleRequest;

constexpr size_t kMaxErrorMessageBytes = 4096;
// Payload messages (headers, chunks, locators) the payload thread may have
// queued and not yet written: enough to keep the stream busy while the next
// one is produced, few enough that a payload is never materialised twice.
constexpr size_t kMaxQueuedPayloadMessages = 4;

}  // namespace

StreamSession::StreamSession(const StreamSessionConfig& config, StreamCall* call, std::string peer)
    : config_(config), call_(call), peer_(std::move(peer)) {}

StreamSession::~StreamSession() {
  {
    absl::MutexLock lock(&mu_);
    payload_thread_stop_ = true;
    ended_.store(true, std::memory_order_release);
    DropQueuedLocked();  // a session destroyed without OnDone (a refused call)
  }
  if (payload_thread_.joinable()) payload_thread_.join();
}

StreamSession::Phase StreamSession::phase() const {
  absl::MutexLock lock(&mu_);
  return phase_;
}

v1::Transport StreamSession::transport() const {
  absl::MutexLock lock(&mu_);
  return sender_ != nullptr ? sender_->transport() : v1::TRANSPORT_UNSPECIFIED;
}

// --- Events from the call --------------------------------------------------------

bool StreamSession::Begin(const absl::Status& refusal) {
  absl::MutexLock lock(&mu_);
  if (!refusal.ok()) EndLocked(refusal);
  // A call cancelled while it waited for its verdict has ended (and may have
  // finished): reading then would outlive it.
  const bool started = !end_status_.has_value();
  if (started) call_->StartReading();
  PumpLocked();
  return started;
}

bool StreamSession::OnRequest(const StreamRequest& request) {
  absl::MutexLock lock(&mu_);
  if (end_status_.has_value()) return false;  // a read that was in flight when the stream ended
  HandleLocked(request);
  PumpLocked();
  return !end_status_.has_value();
}

void StreamSession::OnMalformedRequest() {
  absl::MutexLock lock(&mu_);
  EndLocked(absl::InvalidArgumentError("a StreamRequest that does not parse"));
  PumpLocked();
}

void StreamSession::OnReadsDone() {
  absl::MutexLock lock(&mu_);
  reads_done_ = true;
  PumpLocked();
}

void StreamSession::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (!ok) EndLocked(absl::UnavailableError("writing to the student failed"));
  PumpLocked();
}

void StreamSession::OnCancel() {
  absl::MutexLock lock(&mu_);
  EndLocked(absl::CancelledError("the stream was cancelled"));
  PumpLocked();
}

absl::Status StreamSession::OnDone(int64_t* samples_sent) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    payload_thread_stop_ = true;
    ended_.store(true, std::memory_order_release);
    *samples_sent = samples_sent_;
    status = final_status_;
    DropQueuedLocked();
  }
  if (payload_thread_.joinable()) payload_thread_.join();
  return status;
}

void StreamSession::Drain() {
  absl::MutexLock lock(&mu_);
  if (draining_) return;
  draining_ = true;
  for (const SampleRequest& r : queued_) {
    request_ids_.erase(r.request_id());
    QueueErrorLocked(r.request_id(), absl::UnavailableError("the teacher is shutting down"));
  }
  DropQueuedLocked();
  PumpLocked();
}

void StreamSession::Deliver(uint64_t request_id,
                            absl::StatusOr<std::shared_ptr<const ReadySample>> sample) {
  absl::MutexLock lock(&mu_);
  if (end_status_.has_value() || phase_ == Phase::kFinished) return;
  if (!sample.ok()) {
    --in_flight_;
    --materialized_;
    request_ids_.erase(request_id);
    QueueErrorLocked(request_id, sample.status());
  } else {
    ready_.push_back(*std::move(sample));
  }
  PumpLocked();
}

absl::Status StreamSession::Emit(StreamMessage message) {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return payload_thread_stop_ || payload_out_.size() < kMaxQueuedPayloadMessages;
  };
  mu_.Await(absl::Condition(&room));
  if (payload_thread_stop_) return absl::CancelledError("the stream ended");
  payload_out_.push_back(Outgoing{std::move(message), nullptr});
  PumpLocked();
  return absl::OkStatus();
}

// --- Requests -----------------------------------------------------------------------

void StreamSession::HandleLocked(const StreamRequest& request) {
  if (phase_ == Phase::kAwaitingOpen && request.kind_case() != StreamRequest::kOpen) {
    EndLocked(absl::InvalidArgumentError("the first StreamRequest must be Open"));
    return;
  }
  switch (request.kind_case()) {
    case StreamRequest::kOpen:
      if (phase_ != Phase::kAwaitingOpen) {
        EndLocked(absl::InvalidArgumentError("open: sent twice"));
      } else if (absl::Status s = OpenLocked(request.open()); !s.ok()) {
        EndLocked(s);
      }
      return;
    case StreamRequest::kSample:
      SampleLocked(request.sample());
      return;
    case StreamRequest::kCredit:
      if (absl::Status s = ValidateCredit(request.credit()); !s.ok()) {
        EndLocked(s);
      } else {
        granted_ += request.credit().n();
      }
      return;
    case StreamRequest::kAck:
      for (int64_t id : request.ack().sample_ids()) {
        auto it = unacked_.find(id);
        if (it == unacked_.end()) continue;  // unknown or already acked: ignored
        if (--it->second == 0) unacked_.erase(it);
        --in_flight_;
      }
      return;
    case StreamRequest::KIND_NOT_SET:
      break;
  }
  EndLocked(absl::InvalidArgumentError("a StreamRequest with no kind"));
}

absl::Status StreamSession::OpenLocked(const StreamRequest::Open& open) {
  ASSIGN_OR_RETURN(sender_,
                   AcceptOpen(open, config_.sender, config_.payload_dtype, config_.num_layers));
  capture_layer_ids_.assign(open.capture_layer_ids().begin(), open.capture_layer_ids().end());
  // Opened follows once the sender is connected (PayloadLoop); nothing is
  // written before it. Requests are computed meanwhile.
  phase_ = Phase::kConnecting;
  payload_thread_ = std::thread([this] { PayloadLoop(); });
  return absl::OkStatus();
}

void StreamSession::SampleLocked(const SampleRequest& request) {
  if (draining_) {
    RefuseLocked(request.request_id(), absl::UnavailableError("the teacher is shutting down"));
    return;
  }
  absl::Status valid = ValidateSampleRequest(request, config_.max_tokens, config_.vocab_size);
  if (valid.ok() && request_ids_.contains(request.request_id())) {
    valid = absl::InvalidArgumentError(absl::StrFormat(
        "sample.request_id: %d is already in use on this stream", request.request_id()));
  }
  if (!valid.ok()) {
    SS_LOG_DEBUG("teacher stream from {}: request {} refused: {}", peer_, request.request_id(),
                 std::string(valid.message()));
    RefuseLocked(request.request_id(), valid);
    return;
  }
  // A request with a credit and nothing ahead of it goes to the compute
  // thread now: it never waits, so the budget does not apply (an honest
  // student keeps working while others flood).
  if (Accepting() && queued_.empty() && CanSubmitLocked()) {
    request_ids_.insert(request.request_id());
    SubmitOneLocked(request);
    return;
  }
  if (static_cast<int64_t>(queued_.size()) >= config_.max_queued_requests) {
    EndLocked(absl::ResourceExhaustedError(
        absl::StrFormat("more than %d SampleRequests wait for a credit; send Credit or Ack first",
                        config_.max_queued_requests)));
    return;
  }
  // The stream's bound and the teacher-wide budget refuse this request
  // alone: the stream, and the requests it already has waiting, go on. The
  // id stays free for a retry.
  const int64_t bytes = QueuedRequestBytes(request);
  if (queued_bytes_ + bytes > config_.max_queued_request_bytes) {
    SS_LOG_DEBUG("teacher stream from {}: request {} refused: the stream's queue bound is full",
                 peer_, request.request_id());
    RefuseLocked(request.request_id(),
                 absl::ResourceExhaustedError(absl::StrFormat(
                     "this stream's SampleRequests waiting for a credit would hold more than %d "
                     "bytes (serve --max-queued-mib-per-stream); send Credit or Ack first, or "
                     "retry later",
                     config_.max_queued_request_bytes)));
    return;
  }
  if (config_.queue_budget != nullptr && !config_.queue_budget->TryCharge(bytes)) {
    SS_LOG_DEBUG("teacher stream from {}: request {} refused: the queue budget is full", peer_,
                 request.request_id());
    RefuseLocked(request.request_id(),
                 absl::ResourceExhaustedError(absl::StrFormat(
                     "the teacher's budget for SampleRequests waiting for a credit (%d bytes "
                     "over all streams, serve --max-queued-mib) is full; send Credit or Ack "
                     "first, or retry later",
                     config_.queue_budget->limit())));
    return;
  }
  queued_bytes_ += bytes;
  request_ids_.insert(request.request_id());
  queued_.push_back(request);
}

// A refusal is a SampleError waiting to be written, and a request can be
// far smaller than its refusal: a student that keeps sending requests it
// knows are refused and never reads would grow control_ without bound. Past
// max_queued_requests unwritten messages its stream ends instead.
void StreamSession::RefuseLocked(uint64_t request_id, const absl::Status& status) {
  if (static_cast<int64_t>(control_.size()) >= config_.max_queued_requests) {
    EndLocked(absl::ResourceExhaustedError(
        absl::StrFormat("more than %d responses wait to be written; read the stream",
                        config_.max_queued_requests)));
    return;
  }
  QueueErrorLocked(request_id, status);
}

// --- Output -------------------------------------------------------------------------

void StreamSession::QueueErrorLocked(uint64_t request_id, const absl::Status& status) {
  StreamResponse response;
  StreamResponse::SampleError* error = response.mutable_error();
  error->set_request_id(request_id);
  error->set_code(static_cast<int32_t>(status.code()));
  error->set_message(std::string(status.message().substr(0, kMaxErrorMessageBytes)));
  control_.push_back(StreamMessage::Proto(std::move(response)));
  if (config_.on_sample_error) config_.on_sample_error();
}

StreamResponse StreamSession::HeaderLocked(const ReadySample& sample) {
  StreamResponse response;
  StreamResponse::SampleHeader* header = response.mutable_header();
  header->set_request_id(sample.request_id);
  header->set_sample_id(sample.sample_id);
  *header->mutable_contract() = sample.contract;
  header->set_row_begin(sample.row_begin);
  header->set_row_end(sample.row_end);
  ++unacked_[sample.sample_id];
  ++samples_sent_;
  if (config_.on_sample_sent) config_.on_sample_sent();
  return response;
}

void StreamSession::PayloadDoneLocked(const ReadySample& sample) {
  --materialized_;
  request_ids_.erase(sample.request_id);
}

// Protocol order: nothing before Opened; then what the payload thread
// queued (a header and its chunks or locators are contiguous: nothing else
// goes between a header and its last on-stream message); then control
// messages.
std::optional<StreamMessage> StreamSession::NextWriteLocked() {
  if (phase_ == Phase::kAwaitingOpen || phase_ == Phase::kConnecting) return std::nullopt;
  if (!payload_out_.empty()) {
    Outgoing next = std::move(payload_out_.front());
    payload_out_.pop_front();
    if (next.completes != nullptr) PayloadDoneLocked(*next.completes);
    return std::move(next.message);
  }
  if (payload_open_) return std::nullopt;  // the payload thread produces the next one
  if (!control_.empty()) {
    StreamMessage next = std::move(control_.front());
    control_.pop_front();
    return next;
  }
  return std::nullopt;
}

bool StreamSession::Accepting() const {
  return !end_status_.has_value() && phase_ != Phase::kAwaitingOpen && !draining_;
}

bool StreamSession::CanSubmitLocked() const {
  return in_flight_ < granted_ && materialized_ < config_.max_samples_per_stream;
}

void StreamSession::SubmitOneLocked(SampleRequest request) {
  ++in_flight_;
  ++materialized_;
  config_.batcher->Enqueue(ComputeJob{shared_from_this(), std::move(request),
                                      sender_->packed_on_device(), capture_layer_ids_});
}

void StreamSession::SubmitLocked() {
  while (!queued_.empty() && CanSubmitLocked()) {
    SampleRequest next = std::move(queued_.front());
    queued_.pop_front();
    const int64_t bytes = QueuedRequestBytes(next);
    queued_bytes_ -= bytes;
    if (config_.queue_budget != nullptr) config_.queue_budget->Release(bytes);
    SubmitOneLocked(std::move(next));
  }
}

void StreamSession::DropQueuedLocked() {
  // queued_bytes_ first: a session the compute thread lets go of last has
  // nothing queued, and must not touch config_ then.
  if (queued_bytes_ != 0 && config_.queue_budget != nullptr) {
    config_.queue_budget->Release(queued_bytes_);
  }
  queued_bytes_ = 0;
  queued_.clear();
}

void StreamSession::PumpLocked() {
  if (phase_ == Phase::kFinished) return;
  if (Accepting()) SubmitLocked();
  if (writing_) return;
  if (end_status_.has_value()) {
    FinishLocked(*end_status_);
    return;
  }
  if (std::optional<StreamMessage> next = NextWriteLocked(); next.has_value()) {
    if (absl::Status started = call_->StartWrite(*next); !started.ok()) {
      // Reported where it happens: the stream ends with the reason.
      EndLocked(started);
      FinishLocked(*end_status_);
      return;
    }
    writing_ = true;
    return;
  }
  // Nothing to write now. The call ends once nothing it materialised is left
  // to send and either the teacher drains or the student has half-closed (no
  // Credit or Ack can come any more, so requests still waiting for a credit
  // are never served).
  const bool idle = materialized_ == 0 && !payload_open_ && control_.empty() &&
                    payload_out_.empty() && phase_ != Phase::kConnecting;
  if (!idle) return;
  if (draining_) {
    FinishLocked(absl::UnavailableError("the teacher is shutting down"));
  } else if (reads_done_) {
    if (!queued_.empty()) {
      SS_LOG_DEBUG("teacher stream from {}: half-closed with {} request(s) waiting for credit",
                   peer_, queued_.size());
    }
    FinishLocked(absl::OkStatus());
  }
}

void StreamSession::EndLocked(absl::Status status) {
  if (end_status_.has_value() || phase_ == Phase::kFinished) return;
  end_status_ = std::move(status);
  phase_ = Phase::kEnding;
  ended_.store(true, std::memory_order_release);
  payload_thread_stop_ = true;
  DropQueuedLocked();  // nothing is submitted once a stream has ended
}

void StreamSession::FinishLocked(const absl::Status& status) {
  if (phase_ == Phase::kFinished) return;
  phase_ = Phase::kFinished;
  ended_.store(true, std::memory_order_release);
  payload_thread_stop_ = true;
  final_status_ = status;
  DropQueuedLocked();  // e.g. a half-closed stream's requests that never got a credit
  call_->Finish(status);
}

// --- The payload thread ---------------------------------------------------------------

void StreamSession::PayloadLoop() {
  absl::Status connected = sender_->Connect(*this);
  {
    absl::MutexLock lock(&mu_);
    if (connected.ok() && phase_ == Phase::kConnecting) {
      StreamResponse opened;
      opened.mutable_opened()->set_transport(sender_->transport());
      opened.mutable_opened()->set_chunk_bytes(sender_->chunk_bytes());
      // First, ahead of SampleErrors queued while connecting.
      control_.push_front(StreamMessage::Proto(std::move(opened)));
      phase_ = Phase::kOpen;
      SS_LOG_INFO("teacher stream from {} opened: {}, {} byte chunks", peer_,
                  v1::Transport_Name(sender_->transport()), sender_->chunk_bytes());
    } else if (!connected.ok() && connected.code() != absl::StatusCode::kCancelled) {
      EndLocked(connected);
    }
    PumpLocked();
    if (!connected.ok() || phase_ != Phase::kOpen) return;
  }
  while (true) {
    std::shared_ptr<const ReadySample> sample;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return payload_thread_stop_ || !ready_.empty();
      };
      mu_.Await(absl::Condition(&wake));
      if (payload_thread_stop_) return;
      sample = std::move(ready_.front());
      ready_.pop_front();
      payload_out_.push_back(Outgoing{StreamMessage::Proto(HeaderLocked(*sample)), nullptr});
      payload_open_ = sender_->payload_on_stream();
      PumpLocked();
    }
    absl::Status sent = sender_->Send(sample->request_id, sample->bytes, *this);
    absl::MutexLock lock(&mu_);
    payload_open_ = false;
    if (!sent.ok()) {
      if (sent.code() != absl::StatusCode::kCancelled) EndLocked(sent);
      PumpLocked();
      return;
    }
    // Done once its last queued message is taken for writing (at once when
    // none is left: an NCCL payload, or everything already written).
    if (payload_out_.empty()) {
      PayloadDoneLocked(*sample);
    } else {
      payload_out_.back().completes = std::move(sample);
    }
    PumpLocked();
  }
}

}  // namespace specstream::teacher
