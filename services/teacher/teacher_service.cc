#include "services/teacher/teacher_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/grpc/auth.h"
#include "common/grpc/byte_buffer.h"
#include "common/grpc/status.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/device_checksum.h"
#include "common/torch/tensor_util.h"
#include "common/transport/contract.h"
#include "common/transport/shm_ring.h"
#if SPECSTREAM_WITH_NCCL
#include "common/transport/nccl_channel.h"
#include "common/transport/nccl_util.h"
#endif
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "teacher/sample_tensors.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {
namespace {

using v1::StreamRequest;
using v1::StreamResponse;
using SampleRequest = v1::StreamRequest::SampleRequest;

// Bound on every StreamResponse that is not a payload chunk: Opened, a
// SampleHeader (a contract of at most five tensors is a few hundred bytes)
// and SampleError (messages are cut to kMaxErrorMessageBytes).
constexpr uint64_t kMaxControlMessageBytes = 64 << 10;
constexpr size_t kMaxErrorMessageBytes = 4096;
constexpr uint64_t kMinChunkBytes = 4 << 10;
constexpr uint64_t kMaxChunkBytes = 256 << 20;
// A ring wait re-checks whether its stream has ended this often.
constexpr absl::Duration kRingWaitSlice = absl::Milliseconds(50);

absl::Status ValidateSampleRequest(const SampleRequest& r, int64_t max_tokens, int64_t vocab_size) {
  if (r.request_id() == 0) return absl::InvalidArgumentError("sample.request_id: must be > 0");
  const int64_t t = r.token_ids_size();
  if (t == 0) return absl::InvalidArgumentError("sample.token_ids: empty");
  if (t > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample.token_ids: %d tokens, over max_tokens %d", t, max_tokens));
  }
  for (int64_t i = 0; i < t; ++i) {
    const int32_t id = r.token_ids(static_cast<int>(i));
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sample.token_ids[%d]: id %d is outside the vocab [0, %d)", i, id, vocab_size));
    }
  }
  const std::string& mask = r.loss_mask();
  if (!mask.empty() && static_cast<int64_t>(mask.size()) != t) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sample.loss_mask: %d bytes for %d tokens (one byte per token, or none)", mask.size(), t));
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    const auto b = static_cast<uint8_t>(mask[i]);
    if (b > 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sample.loss_mask[%d]: %d is not 0 or 1", i, b));
    }
  }
  if (r.slice_end() == 0) {
    if (r.slice_begin() != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sample.slice_begin: %d with slice_end 0 (the whole sample needs slice_begin 0)",
          r.slice_begin()));
    }
    if (r.halo_before() != 0 || r.halo_after() != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sample.%s: %d with slice_end 0 (the whole sample has no halos)",
                          r.halo_before() != 0 ? "halo_before" : "halo_after",
                          r.halo_before() != 0 ? r.halo_before() : r.halo_after()));
    }
    return absl::OkStatus();
  }
  if (r.slice_begin() < 0 || r.slice_begin() >= r.slice_end() || r.slice_end() > t) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample.slice_begin/slice_end: [%d, %d) is not a non-empty range "
                        "within the %d tokens",
                        r.slice_begin(), r.slice_end(), t));
  }
  if (r.halo_before() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample.halo_before: %d < 0", r.halo_before()));
  }
  if (r.halo_after() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("sample.halo_after: %d < 0", r.halo_after()));
  }
  return absl::OkStatus();
}

// Rows [begin, end) of the whole sample that a (validated) request returns.
std::pair<int64_t, int64_t> RequestRows(const SampleRequest& r) {
  const int64_t t = r.token_ids_size();
  if (r.slice_end() == 0) return {0, t};
  // Saturating: halos may be as large as the student likes.
  const int64_t begin = r.halo_before() >= r.slice_begin() ? 0 : r.slice_begin() - r.halo_before();
  const int64_t end = r.halo_after() >= t - r.slice_end() ? t : r.slice_end() + r.halo_after();
  return {begin, end};
}

}  // namespace

// --- Payloads ------------------------------------------------------------------

// A computed sample's payload bytes: the tensors themselves, back to back in
// contract order (no packing copy), or one packed string when a test hook
// rewrote it. Immutable once built; shared by the stream that sends it and by
// gRPC's zero-copy chunk slices.
class PayloadBytes final {
 public:
  explicit PayloadBytes(std::vector<NamedTensor> tensors) : tensors_(std::move(tensors)) {
    for (const NamedTensor& t : tensors_) {
      Add(absl::string_view(static_cast<const char*>(t.tensor.data_ptr()), t.tensor.nbytes()));
    }
  }
  explicit PayloadBytes(std::string packed) : packed_(std::move(packed)) { Add(packed_); }

  uint64_t size() const { return size_; }

  // Bytes [offset, offset + n) in place when they lie in one segment; an
  // empty view when they straddle segments (then use CopyTo).
  absl::string_view View(uint64_t offset, uint64_t n) const {
    const size_t s = SegmentOf(offset);
    const uint64_t within = offset - starts_[s];
    if (within + n > segments_[s].size()) return {};
    return segments_[s].substr(within, n);
  }

  void CopyTo(uint64_t offset, uint64_t n, char* dest) const {
    for (size_t s = SegmentOf(offset); n > 0; ++s) {
      const uint64_t within = offset - starts_[s];
      const uint64_t take = std::min<uint64_t>(n, segments_[s].size() - within);
      std::memcpy(dest, segments_[s].data() + within, take);
      dest += take;
      offset += take;
      n -= take;
    }
  }

 private:
  void Add(absl::string_view segment) {
    if (segment.empty()) return;
    segments_.push_back(segment);
    starts_.push_back(size_);
    size_ += segment.size();
  }
  size_t SegmentOf(uint64_t offset) const {
    return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                               starts_.begin()) -
           1;
  }

  std::vector<NamedTensor> tensors_;
  std::string packed_;
  std::vector<absl::string_view> segments_;
  std::vector<uint64_t> starts_;
  uint64_t size_ = 0;
};

struct TeacherService::ReadySample {
  uint64_t request_id = 0;
  int64_t sample_id = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  v1::TensorContract contract;
  // Inline and shm streams: the tensors' bytes on the host.
  std::shared_ptr<const PayloadBytes> bytes;
  // NCCL streams: the whole payload, packed, as uint8 [payload_bytes] on the
  // NCCL device when the target computes on a GPU (sent from there), else on
  // the host; the contract carries its device checksum.
  torch::Tensor packed;
};

struct TeacherService::Job {
  std::shared_ptr<Stream> stream;
  SampleRequest request;
  bool nccl = false;  // the stream's payloads go over NCCL (ReadySample::packed)
};

// --- One stream ------------------------------------------------------------------

// The reactor of one StreamHiddenStates call. Every member below mu_ is
// touched under it; gRPC callbacks, the compute thread (Deliver), the ring
// thread and the service (Drain) all take it, and each event ends in
// PumpLocked(), which moves waiting requests to the compute queue, starts
// the next write when none is in flight, or finishes the call.
class TeacherService::Stream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public std::enable_shared_from_this<TeacherService::Stream> {
 public:
  Stream(TeacherService* service, std::string peer) : service_(service), peer_(std::move(peer)) {}

  // Starts reading, or refuses the call with `refusal` (draining, not
  // authorized).
  void Begin(const absl::Status& refusal) {
    absl::MutexLock lock(&mu_);
    if (!refusal.ok()) {
      EndLocked(refusal);
      PumpLocked();
      return;
    }
    StartRead(&in_);
  }

  // Lock-free: true once the stream will send nothing more (the compute
  // thread skips its jobs).
  bool ended() const { return ended_.load(std::memory_order_acquire); }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      reads_done_ = true;
      PumpLocked();
      return;
    }
    if (end_status_.has_value() || finish_called_) {
      in_.Clear();  // a read that was in flight when the stream ended
      return;
    }
    StreamRequest request;
    grpc::ProtoBufferReader reader(&in_);
    if (!reader.status().ok() || !request.ParseFromZeroCopyStream(&reader)) {
      EndLocked(absl::InvalidArgumentError("a StreamRequest that does not parse"));
    } else {
      HandleLocked(request);
    }
    in_.Clear();
    if (!end_status_.has_value()) StartRead(&in_);
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    out_.Clear();
    if (!ok) EndLocked(absl::UnavailableError("writing to the student failed"));
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    EndLocked(absl::CancelledError("the stream was cancelled"));
    PumpLocked();
  }

  void OnDone() override {
    int64_t samples_sent = 0;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      payload_stop_ = true;
      samples_sent = samples_sent_;
      status = final_status_;
    }
    if (payload_thread_.joinable()) payload_thread_.join();
    SS_LOG_INFO("teacher stream from {} ended: {} sample(s) sent{}", peer_, samples_sent,
                status.ok() ? "" : absl::StrCat(", ", status.ToString()));
    // May destroy this object (when no job holds it): the last statement.
    service_->RemoveStream(this);
  }

  // Compute thread: the sample (or why it failed) for request_id.
  void Deliver(uint64_t request_id, absl::StatusOr<std::shared_ptr<const ReadySample>> sample) {
    absl::MutexLock lock(&mu_);
    if (end_status_.has_value() || finish_called_) return;
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

  // Service shutdown: see TeacherService::StartDraining.
  void Drain() {
    absl::MutexLock lock(&mu_);
    if (draining_) return;
    draining_ = true;
    for (const SampleRequest& r : queued_) {
      request_ids_.erase(r.request_id());
      QueueErrorLocked(r.request_id(), absl::UnavailableError("the teacher is shutting down"));
    }
    queued_.clear();
    PumpLocked();
  }

 private:
  // --- Requests -------------------------------------------------------------------

  void HandleLocked(const StreamRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!opened_ && request.kind_case() != StreamRequest::kOpen) {
      EndLocked(absl::InvalidArgumentError("the first StreamRequest must be Open"));
      return;
    }
    switch (request.kind_case()) {
      case StreamRequest::kOpen:
        if (opened_) {
          EndLocked(absl::InvalidArgumentError("open: sent twice"));
        } else if (absl::Status s = OpenLocked(request.open()); !s.ok()) {
          EndLocked(s);
        }
        return;
      case StreamRequest::kSample:
        SampleLocked(request.sample());
        return;
      case StreamRequest::kCredit:
        if (request.credit().n() == 0) {
          EndLocked(absl::InvalidArgumentError("credit.n: must be > 0"));
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

  absl::Status OpenLocked(const StreamRequest::Open& open) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (open.transport()) {
      case v1::TRANSPORT_INLINE:
      case v1::TRANSPORT_SHM:
        break;
      case v1::TRANSPORT_NCCL:
        RETURN_IF_ERROR(CheckNcclOpen(open));
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "open.transport: ", v1::Transport_Name(open.transport()), " (",
            static_cast<int>(open.transport()),
            ") is not a transport this teacher serves (TRANSPORT_INLINE, TRANSPORT_SHM, "
            "TRANSPORT_NCCL)"));
    }
    const v1::DType dtype = service_->description_.dtype();
    if (open.contract_dtype() != v1::DTYPE_UNSPECIFIED && open.contract_dtype() != dtype) {
      return absl::FailedPreconditionError(absl::StrCat(
          "open.contract_dtype: the student expects ", v1::DType_Name(open.contract_dtype()),
          ", this teacher sends ", v1::DType_Name(dtype)));
    }
    uint64_t chunk = service_->options_.chunk_bytes;
    if (open.max_chunk_bytes() > 0) chunk = std::min<uint64_t>(chunk, open.max_chunk_bytes());
    if (open.transport() == v1::TRANSPORT_SHM) {
      if (open.shm_name().empty()) return absl::InvalidArgumentError("open.shm_name: empty");
      absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Attach(open.shm_name());
      if (!ring.ok()) {
        return Annotate(ring.status(), absl::StrCat("open.shm_name \"", open.shm_name(), "\""));
      }
      if (open.shm_capacity() != (*ring)->capacity()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("open.shm_capacity: %d, but the ring's header says %d",
                            open.shm_capacity(), (*ring)->capacity()));
      }
      // Records of at most half the ring (unless the student asked for more)
      // let the student copy one record out while the next is written.
      const uint64_t capacity = (*ring)->capacity();
      chunk = std::min(chunk, open.max_chunk_bytes() > 0 ? capacity : capacity / 2);
      ring_ = *std::move(ring);
    }
    opened_ = true;
    transport_ = open.transport();
    chunk_bytes_ = chunk;
    if (transport_ == v1::TRANSPORT_NCCL) {
      // Opened follows once the communicator is joined (NcclLoop); nothing
      // is written before it.
      awaiting_join_ = true;
      payload_thread_ = std::thread([this, id = open.nccl_unique_id()] { NcclLoop(id); });
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(QueueOpenedLocked());
    if (ring_) payload_thread_ = std::thread([this] { RingLoop(); });
    return absl::OkStatus();
  }

  absl::Status QueueOpenedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StreamResponse opened;
    opened.mutable_opened()->set_transport(transport_);
    opened.mutable_opened()->set_chunk_bytes(chunk_bytes_);
    ASSIGN_OR_RETURN(grpc::ByteBuffer buffer, SerializeToByteBuffer(opened));
    // First, ahead of SampleErrors queued while an NCCL join was pending.
    control_.push_front(std::move(buffer));
    SS_LOG_INFO("teacher stream from {} opened: {}, {} byte chunks", peer_,
                v1::Transport_Name(transport_), chunk_bytes_);
    return absl::OkStatus();
  }

  // Whether this teacher can open `open` over NCCL.
  absl::Status CheckNcclOpen(const StreamRequest::Open& open) const {
    if (!service_->offers_nccl()) {
      return SPECSTREAM_WITH_NCCL
                 ? absl::FailedPreconditionError(
                       "open.transport: TRANSPORT_NCCL: this teacher has no CUDA device for NCCL "
                       "(serve --nccl-device); use TRANSPORT_INLINE or TRANSPORT_SHM")
                 : absl::UnimplementedError(
                       "open.transport: TRANSPORT_NCCL: this teacher was built without NCCL "
                       "(SPECSTREAM_WITH_NCCL=0); use TRANSPORT_INLINE or TRANSPORT_SHM");
    }
    if (open.nccl_unique_id().size() != kPayloadChannelIdBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("open.nccl_unique_id: %d bytes, an ncclUniqueId has %d",
                          open.nccl_unique_id().size(), kPayloadChannelIdBytes));
    }
    return absl::OkStatus();
  }

  void SampleLocked(const SampleRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (draining_) {
      QueueErrorLocked(request.request_id(),
                       absl::UnavailableError("the teacher is shutting down"));
      return;
    }
    absl::Status valid =
        ValidateSampleRequest(request, service_->max_tokens_, service_->vocab_size_);
    if (valid.ok() && request_ids_.contains(request.request_id())) {
      valid = absl::InvalidArgumentError(absl::StrFormat(
          "sample.request_id: %d is already in use on this stream", request.request_id()));
    }
    if (!valid.ok()) {
      SS_LOG_DEBUG("teacher stream from {}: request {} refused: {}", peer_, request.request_id(),
                   std::string(valid.message()));
      QueueErrorLocked(request.request_id(), valid);
      return;
    }
    if (static_cast<int64_t>(queued_.size()) >= service_->options_.max_queued_requests) {
      EndLocked(absl::ResourceExhaustedError(
          absl::StrFormat("more than %d SampleRequests wait for a credit; send Credit or Ack first",
                          service_->options_.max_queued_requests)));
      return;
    }
    request_ids_.insert(request.request_id());
    queued_.push_back(request);
  }

  // --- Output ---------------------------------------------------------------------

  void QueueErrorLocked(uint64_t request_id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StreamResponse response;
    StreamResponse::SampleError* error = response.mutable_error();
    error->set_request_id(request_id);
    error->set_code(static_cast<int32_t>(status.code()));
    error->set_message(std::string(status.message().substr(0, kMaxErrorMessageBytes)));
    absl::StatusOr<grpc::ByteBuffer> buffer = SerializeToByteBuffer(response);
    if (!buffer.ok()) {
      EndLocked(buffer.status());
      return;
    }
    control_.push_back(*std::move(buffer));
    service_->CountSampleError();
  }

  absl::StatusOr<grpc::ByteBuffer> HeaderLocked(const ReadySample& sample)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StreamResponse response;
    StreamResponse::SampleHeader* header = response.mutable_header();
    header->set_request_id(sample.request_id);
    header->set_sample_id(sample.sample_id);
    *header->mutable_contract() = sample.contract;
    header->set_row_begin(sample.row_begin);
    header->set_row_end(sample.row_end);
    ++unacked_[sample.sample_id];
    ++samples_sent_;
    service_->CountSampleSent();
    return SerializeToByteBuffer(response);
  }

  // The sample whose payload is fully handed over: its memory may go.
  void PayloadDoneLocked(const ReadySample& sample) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    --materialized_;
    request_ids_.erase(sample.request_id);
  }

  // The next message to write, in protocol order: the open payload's
  // remaining messages first (chunks of different requests are never
  // interleaved, and nothing else goes between a header and its last
  // chunk), then control messages, then the next ready sample's header.
  absl::StatusOr<bool> NextWriteLocked(grpc::ByteBuffer* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (awaiting_join_) return false;          // Opened comes first
    if (transport_ != v1::TRANSPORT_INLINE) {  // the payload thread queues what to write
      if (!payload_out_.empty()) {
        *out = std::move(payload_out_.front());
        payload_out_.pop_front();
        return true;
      }
      if (ring_payload_open_) return false;  // the ring thread produces the next chunk
    } else if (sending_ != nullptr) {
      const ReadySample& s = *sending_;
      const uint64_t n = std::min(chunk_bytes_, s.bytes->size() - sent_bytes_);
      absl::string_view view = s.bytes->View(sent_bytes_, n);
      if (!view.empty()) {
        *out = FramePayloadChunk(s.request_id, sent_bytes_, view, s.bytes);
      } else {  // the chunk straddles two tensors: one small copy
        auto joined = std::make_shared<std::string>(n, '\0');
        s.bytes->CopyTo(sent_bytes_, n, joined->data());
        *out = FramePayloadChunk(s.request_id, sent_bytes_, *joined, joined);
      }
      sent_bytes_ += n;
      if (sent_bytes_ == s.bytes->size()) {
        PayloadDoneLocked(s);
        sending_.reset();
      }
      return true;
    }
    if (!control_.empty()) {
      *out = std::move(control_.front());
      control_.pop_front();
      return true;
    }
    if (transport_ == v1::TRANSPORT_INLINE && !ready_.empty()) {
      sending_ = std::move(ready_.front());
      ready_.pop_front();
      sent_bytes_ = 0;
      ASSIGN_OR_RETURN(*out, HeaderLocked(*sending_));
      return true;
    }
    return false;
  }

  void SubmitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!queued_.empty() && in_flight_ < granted_ &&
           materialized_ < service_->options_.max_samples_per_stream) {
      ++in_flight_;
      ++materialized_;
      service_->Enqueue(
          Job{shared_from_this(), std::move(queued_.front()), transport_ == v1::TRANSPORT_NCCL});
      queued_.pop_front();
    }
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_called_) return;
    if (!end_status_.has_value() && opened_ && !draining_) SubmitLocked();
    if (writing_) return;
    if (end_status_.has_value()) {
      FinishLocked(*end_status_);
      return;
    }
    if (opened_) {
      absl::StatusOr<bool> next = NextWriteLocked(&out_);
      if (!next.ok()) {
        FinishLocked(next.status());
        return;
      }
      if (*next) {
        writing_ = true;
        StartWrite(&out_);
        return;
      }
    }
    // Nothing to write now. The call ends once nothing it materialised is
    // left to send and either the service drains or the student has
    // half-closed (no Credit or Ack can come any more, so requests still
    // waiting for a credit are never served).
    const bool idle =
        materialized_ == 0 && !ring_payload_open_ && control_.empty() && !awaiting_join_;
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

  // The stream fails: nothing more is sent, and the call finishes with
  // `status` as soon as no write is in flight. The first status wins.
  void EndLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (end_status_.has_value() || finish_called_) return;
    end_status_ = std::move(status);
    ended_.store(true, std::memory_order_release);
    payload_stop_ = true;
  }

  void FinishLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_called_) return;
    finish_called_ = true;
    ended_.store(true, std::memory_order_release);
    payload_stop_ = true;
    final_status_ = status;
    Finish(ToGrpcStatus(status));
  }

  // --- The ring thread (TRANSPORT_SHM) ------------------------------------------------

  // Takes ready samples in order; for each, queues its header, then copies
  // its payload chunk by chunk into ring records, queueing each record's
  // locator after Commit. The wait for ring space is the only blocking wait
  // of a stream; it gives up when the stream ends or after
  // shm_space_timeout.
  void RingLoop() {
    while (true) {
      std::shared_ptr<const ReadySample> sample = NextPayload(/*more_messages=*/true);
      if (sample == nullptr) return;
      const uint64_t size = sample->bytes->size();
      for (uint64_t offset = 0; offset < size;) {
        const uint64_t n = std::min(chunk_bytes_, size - offset);
        absl::StatusOr<ShmRing::Reservation> record = ReserveRecord(n);
        if (!record.ok()) {
          absl::MutexLock lock(&mu_);
          if (record.status().code() != absl::StatusCode::kCancelled) EndLocked(record.status());
          PumpLocked();
          return;
        }
        sample->bytes->CopyTo(offset, n, record->data.data());
        absl::Status committed = ring_->Commit();
        StreamResponse response;
        StreamResponse::PayloadChunk* chunk = response.mutable_chunk();
        chunk->set_request_id(sample->request_id);
        chunk->set_offset(offset);
        chunk->mutable_shm()->set_position(record->position);
        chunk->mutable_shm()->set_length(n);
        absl::StatusOr<grpc::ByteBuffer> buffer = SerializeToByteBuffer(response);
        offset += n;
        absl::MutexLock lock(&mu_);
        if (!committed.ok() || !buffer.ok()) {
          EndLocked(!committed.ok() ? committed : buffer.status());
          PumpLocked();
          return;
        }
        payload_out_.push_back(*std::move(buffer));
        if (offset == size) {
          ring_payload_open_ = false;
          PayloadDoneLocked(*sample);
        }
        PumpLocked();
      }
    }
  }

  // Payload threads: waits for the next ready sample and queues its header;
  // null when the stream has ended. `more_messages`: the payload continues on
  // the gRPC stream (shm locators), so nothing else may be written until its
  // last chunk is queued.
  std::shared_ptr<const ReadySample> NextPayload(bool more_messages) {
    absl::MutexLock lock(&mu_);
    auto wake = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return payload_stop_ || !ready_.empty(); };
    mu_.Await(absl::Condition(&wake));
    if (payload_stop_) return nullptr;
    std::shared_ptr<const ReadySample> sample = std::move(ready_.front());
    ready_.pop_front();
    absl::StatusOr<grpc::ByteBuffer> header = HeaderLocked(*sample);
    if (!header.ok()) {
      EndLocked(header.status());
      PumpLocked();
      return nullptr;
    }
    payload_out_.push_back(*std::move(header));
    ring_payload_open_ = more_messages;
    PumpLocked();
    return sample;
  }

  // --- The NCCL thread (TRANSPORT_NCCL) -----------------------------------------------

  // A failed join, blamed on the student's id (a peer that did not join,
  // a malformed id) or on this teacher's device (memory, CUDA, NCCL).
  absl::Status NcclJoinError(const absl::Status& why) const {
    switch (why.code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kCancelled:
        return Annotate(why, "open.nccl_unique_id");
      default:
        return Annotate(why, absl::StrCat("nccl_device ", service_->options_.nccl_device));
    }
  }

  // Joins the student's communicator as rank 0, answers Opened, then sends
  // each ready sample: its header on the stream, its payload with
  // NcclChannel::Send (the student posts the receive once it has read and
  // checked the header). A failed join or send ends the stream with its
  // status; the student re-requests what it did not get.
  void NcclLoop(const std::string& unique_id) {
    PayloadChannelOptions options;
    options.rank = 0;
    options.device = service_->options_.nccl_device;
    options.timeout = service_->options_.nccl_timeout;
    // Polled often while NCCL waits: lock-free. The stream ends (ended_)
    // before OnDone sets payload_stop_.
    options.stopped = [this] { return ended(); };
    absl::StatusOr<std::unique_ptr<PayloadChannel>> channel =
        service_->JoinNccl(unique_id, std::move(options));
    {
      absl::MutexLock lock(&mu_);
      awaiting_join_ = false;
      absl::Status opened = channel.ok() ? QueueOpenedLocked() : NcclJoinError(channel.status());
      if (!opened.ok() && opened.code() != absl::StatusCode::kCancelled) EndLocked(opened);
      PumpLocked();
      if (!opened.ok()) return;
    }
    while (true) {
      std::shared_ptr<const ReadySample> sample = NextPayload(/*more_messages=*/false);
      if (sample == nullptr) return;
      const torch::Tensor& packed = sample->packed;
      const uint64_t size = static_cast<uint64_t>(packed.numel());
      const char* data = static_cast<const char*>(packed.data_ptr());
      absl::Status sent =
          packed.is_cuda() ? (*channel)->SendDevice(data, size)
                           : (*channel)->Send(size, [&](uint64_t offset, uint64_t n, char* dest) {
                               std::memcpy(dest, data + offset, n);
                             });
      absl::MutexLock lock(&mu_);
      if (!sent.ok()) {
        if (sent.code() != absl::StatusCode::kCancelled) EndLocked(sent);
        PumpLocked();
        return;
      }
      PayloadDoneLocked(*sample);
      PumpLocked();
    }
  }

  // Space for one record, waiting in slices so that the end of the stream
  // interrupts the wait (Cancelled then).
  absl::StatusOr<ShmRing::Reservation> ReserveRecord(uint64_t n) {
    const absl::Time deadline = absl::Now() + service_->options_.shm_space_timeout;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (payload_stop_) return absl::CancelledError("the stream ended");
      }
      const absl::Duration left = deadline - absl::Now();
      absl::StatusOr<ShmRing::Reservation> record =
          ring_->Reserve(n, std::max(absl::ZeroDuration(), std::min(left, kRingWaitSlice)));
      if (record.ok() || record.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return record;
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "shm ring %s: no room for a %d-byte record within %s; the student does not release "
            "records",
            ring_->name(), n, absl::FormatDuration(service_->options_.shm_space_timeout)));
      }
    }
  }

  TeacherService* const service_;
  const std::string peer_;
  grpc::ByteBuffer in_;  // owned by the one read in flight
  std::atomic<bool> ended_{false};
  // Written by the ring thread only (producer side of the ring), after Open.
  std::unique_ptr<ShmRing> ring_;
  std::thread payload_thread_;  // shm: RingLoop; nccl: NcclLoop

  absl::Mutex mu_;
  // Lifecycle.
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool payload_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> end_status_ ABSL_GUARDED_BY(mu_);
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer out_ ABSL_GUARDED_BY(mu_);  // the one write in flight
  // Negotiated at Open.
  v1::Transport transport_ ABSL_GUARDED_BY(mu_) = v1::TRANSPORT_UNSPECIFIED;
  uint64_t chunk_bytes_ = 0;  // set at Open, before the payload thread starts; then constant
  // Flow control: in_flight_ counts samples holding a credit (submitted,
  // ready, being sent, or sent and not yet acked); materialized_ those whose
  // payload exists (submitted, ready, being sent).
  uint64_t granted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int materialized_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<SampleRequest> queued_ ABSL_GUARDED_BY(mu_);           // waiting for a credit
  absl::flat_hash_set<uint64_t> request_ids_ ABSL_GUARDED_BY(mu_);  // not yet fully answered
  absl::flat_hash_map<int64_t, int> unacked_ ABSL_GUARDED_BY(mu_);  // sample id -> headers sent
  int64_t samples_sent_ ABSL_GUARDED_BY(mu_) = 0;
  // Output.
  std::deque<grpc::ByteBuffer> control_ ABSL_GUARDED_BY(mu_);  // Opened, SampleErrors
  std::deque<std::shared_ptr<const ReadySample>> ready_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const ReadySample> sending_ ABSL_GUARDED_BY(mu_);  // inline: being chunked
  uint64_t sent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<grpc::ByteBuffer> payload_out_ ABSL_GUARDED_BY(mu_);  // shm/nccl: headers, locators
  bool ring_payload_open_ ABSL_GUARDED_BY(mu_) = false;  // shm: header queued, last chunk not
  bool awaiting_join_ ABSL_GUARDED_BY(mu_) = false;      // nccl: Open seen, communicator not joined
};

// --- The service -------------------------------------------------------------------

TeacherService::TeacherService(TargetRuntime& runtime, TeacherServiceOptions options)
    : runtime_(runtime), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<TeacherService>> TeacherService::Create(
    TargetRuntime& runtime, TeacherServiceOptions options) {
  const ModelDescription& model = runtime.Describe();
  ASSIGN_OR_RETURN(DType payload_dtype, ParseHiddenDType("payload_dtype", options.payload_dtype));
  int64_t max_tokens = options.max_tokens;
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: ", max_tokens, " < 0"));
  }
  if (max_tokens == 0) {
    if (model.max_position_embeddings <= 0) {
      return absl::InvalidArgumentError(
          "max_tokens: the model has no max_position_embeddings; set max_tokens");
    }
    max_tokens = model.max_position_embeddings;
  } else if (model.max_position_embeddings > 0 && max_tokens > model.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: ", max_tokens,
                                                   " is over the model's max_position_embeddings ",
                                                   model.max_position_embeddings));
  }
  if (options.chunk_bytes < kMinChunkBytes || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk_bytes: %d not in [%d, %d]", options.chunk_bytes, kMinChunkBytes, kMaxChunkBytes));
  }
  if (options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError("max_batch_tokens: must be >= 1");
  }
  if (options.max_samples_per_stream < 1) {
    return absl::InvalidArgumentError("max_samples_per_stream: must be >= 1");
  }
  if (options.max_queued_requests < 1) {
    return absl::InvalidArgumentError("max_queued_requests: must be >= 1");
  }
  if (options.shm_space_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("shm_space_timeout: must be > 0");
  }
  if (options.nccl_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl_timeout: must be > 0");
  }
  if (options.nccl_device >= 0) {
#if SPECSTREAM_WITH_NCCL
    const int devices = CudaDeviceCount();
    if (options.nccl_device >= devices) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "nccl_device: CUDA device %d, but %d are visible", options.nccl_device, devices));
    }
#else
    return absl::InvalidArgumentError(
        "nccl_device: this teacher was built without NCCL (SPECSTREAM_WITH_NCCL=0)");
#endif
  }

  std::unique_ptr<TeacherService> service(new TeacherService(runtime, std::move(options)));
  service->payload_dtype_ = payload_dtype;
  service->max_tokens_ = max_tokens;
  service->vocab_size_ = model.vocab_size;
  v1::DescribeResponse& d = service->description_;
  d.set_model_type(model.model_type);
  d.set_hidden_size(model.hidden_size);
  d.set_vocab_size(model.vocab_size);
  d.set_num_layers(model.num_layers);
  for (int id : model.capture_layer_ids) d.add_capture_layer_ids(id);
  d.set_dtype(ToProtoDType(payload_dtype));
  d.set_max_tokens(max_tokens);
  d.add_transports(v1::TRANSPORT_INLINE);
  d.set_hostname(LocalHostname());
  d.set_boot_id(LocalBootId());
  // Without a boot id a student could not tell that it shares the host.
  if (!d.boot_id().empty() && !d.hostname().empty()) d.add_transports(v1::TRANSPORT_SHM);
  if (service->offers_nccl()) d.add_transports(v1::TRANSPORT_NCCL);
  d.set_max_message_bytes(static_cast<int64_t>(std::max<uint64_t>(
      service->options_.chunk_bytes + kMaxChunkHeaderBytes, kMaxControlMessageBytes)));
  service->compute_thread_ = std::thread([s = service.get()] { s->ComputeLoop(); });
  SS_LOG_INFO("teacher service: {} (hidden {}, vocab {}), payload {}, max_tokens {}",
              model.model_type, model.hidden_size, model.vocab_size,
              std::string(DTypeName(payload_dtype)), max_tokens);
  return service;
}

TeacherService::~TeacherService() { Stop(); }

bool TeacherService::offers_nccl() const {
  return options_.nccl_device >= 0 || options_.nccl_channel_for_testing != nullptr;
}

absl::StatusOr<std::unique_ptr<PayloadChannel>> TeacherService::JoinNccl(
    absl::string_view unique_id, PayloadChannelOptions options) const {
  if (options_.nccl_channel_for_testing) {
    return options_.nccl_channel_for_testing(unique_id, std::move(options));
  }
#if SPECSTREAM_WITH_NCCL
  return JoinNcclChannel(unique_id, std::move(options));
#else
  return absl::UnimplementedError("this teacher was built without NCCL");
#endif
}

uint64_t TeacherService::max_request_bytes() const {
  // A token id is a varint of at most 10 bytes (negative ids), plus one mask
  // byte; 64 KiB covers the rest of a request.
  return std::max<uint64_t>(static_cast<uint64_t>(max_tokens_) * 11 + (64 << 10), 1 << 20);
}

grpc::ServerUnaryReactor* TeacherService::Describe(grpc::CallbackServerContext* context,
                                                   const v1::DescribeRequest* /*request*/,
                                                   v1::DescribeResponse* response) {
  *response = description_;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TeacherService::StreamHiddenStates(
    grpc::CallbackServerContext* context) {
  auto stream = std::make_shared<Stream>(this, context->peer());
  bool draining = false;
  {
    absl::MutexLock lock(&streams_mu_);
    streams_[stream.get()] = stream;
    draining = draining_;
  }
  {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.streams;
  }
  absl::Status refusal;
  if (draining) {
    refusal = absl::UnavailableError("the teacher is shutting down");
  } else if (options_.authorize) {
    refusal = options_.authorize(BearerToken(*context).value_or(""));
  }
  stream->Begin(refusal);
  return stream.get();
}

void TeacherService::StartDraining() {
  absl::MutexLock lock(&streams_mu_);
  if (draining_) return;
  draining_ = true;
  SS_LOG_INFO("teacher service: draining {} stream(s)", streams_.size());
  for (auto& [raw, stream] : streams_) stream->Drain();
}

bool TeacherService::WaitUntilIdle(absl::Time deadline) {
  absl::MutexLock lock(&streams_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_) { return streams_.empty(); };
  return streams_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void TeacherService::Stop() {
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
  }
  if (compute_thread_.joinable()) compute_thread_.join();
  std::deque<Job> dropped;
  absl::MutexLock lock(&queue_mu_);
  dropped.swap(queue_);
}

TeacherService::Stats TeacherService::stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

void TeacherService::Enqueue(Job job) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(job));
}

void TeacherService::RemoveStream(Stream* stream) {
  std::shared_ptr<Stream> last;  // released after the lock
  absl::MutexLock lock(&streams_mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  last = std::move(it->second);
  streams_.erase(it);
}

void TeacherService::CountSampleSent() {
  absl::MutexLock lock(&stats_mu_);
  ++stats_.samples_sent;
}

void TeacherService::CountSampleError() {
  absl::MutexLock lock(&stats_mu_);
  ++stats_.sample_errors;
}

void TeacherService::ComputeLoop() {
  while (true) {
    std::deque<Job> batch;
    std::vector<Job> dropped;  // jobs of ended streams, released outside the lock
    {
      absl::MutexLock lock(&queue_mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return stopping_ || !queue_.empty();
      };
      queue_mu_.Await(absl::Condition(&wake));
      if (stopping_) return;
      // FIFO across streams; a batch grows while its padded size (count x
      // longest) stays within max_batch_tokens.
      int64_t longest = 0;
      while (!queue_.empty()) {
        Job& job = queue_.front();
        if (job.stream->ended()) {
          dropped.push_back(std::move(job));
          queue_.pop_front();
          continue;
        }
        const int64_t len = std::max<int64_t>(longest, job.request.token_ids_size());
        if (!batch.empty() &&
            len * static_cast<int64_t>(batch.size() + 1) > options_.max_batch_tokens) {
          break;
        }
        longest = len;
        batch.push_back(std::move(job));
        queue_.pop_front();
      }
    }
    if (!batch.empty()) RunBatch(batch);
  }
}

void TeacherService::RunBatch(std::deque<Job>& batch) {
  ForwardRequest request;
  request.want_target_ids = options_.keep_target_ids;
  for (const Job& job : batch) {
    request.sequences.emplace_back(job.request.token_ids().begin(), job.request.token_ids().end());
  }
  absl::StatusOr<std::vector<SequenceCapture>> captures = runtime_.Forward(request);
  {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.forward_calls;
  }
  if (!captures.ok()) {
    if (batch.size() > 1) {
      // One sample may be what failed: retry each alone so the others live.
      for (Job& job : batch) {
        std::deque<Job> one;
        one.push_back(std::move(job));
        RunBatch(one);
      }
      return;
    }
    SS_LOG_WARN("teacher forward failed for request {}: {}", batch[0].request.request_id(),
                captures.status().ToString());
    batch[0].stream->Deliver(batch[0].request.request_id(),
                             Annotate(captures.status(), "teacher forward"));
    return;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].stream->Deliver(batch[i].request.request_id(),
                             BuildSample(batch[i].request, (*captures)[i], batch[i].nccl));
  }
}

absl::StatusOr<std::shared_ptr<const TeacherService::ReadySample>> TeacherService::BuildSample(
    const SampleRequest& request, const SequenceCapture& capture, bool nccl) {
  const auto [row_begin, row_end] = RequestRows(request);
  SampleTensorsOptions tensor_options;
  tensor_options.hidden_dtype = payload_dtype_;
  tensor_options.keep_target_ids = options_.keep_target_ids;
  tensor_options.on_capture_device = nccl;
  const std::string& mask = request.loss_mask();
  ASSIGN_OR_RETURN(
      std::vector<NamedTensor> tensors,
      SampleTensors(absl::MakeConstSpan(request.token_ids().data(), request.token_ids_size()),
                    absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(mask.data()), mask.size()),
                    capture, tensor_options, row_begin, row_end));
  if (nccl) return BuildNcclSample(request, row_begin, row_end, tensors);
  std::vector<PayloadTensor> views;
  for (const NamedTensor& t : tensors) {
    ASSIGN_OR_RETURN(DType dtype, FromTorchDtype(t.tensor.scalar_type()));
    views.push_back(
        {t.name, dtype, ShapeOf(t.tensor),
         absl::string_view(static_cast<const char*>(t.tensor.data_ptr()), t.tensor.nbytes())});
  }
  auto sample = std::make_shared<ReadySample>();
  sample->request_id = request.request_id();
  sample->sample_id = request.sample_id();
  sample->row_begin = row_begin;
  sample->row_end = row_end;
  ASSIGN_OR_RETURN(sample->contract, MakeContract(views));
  if (options_.corrupt_payload_for_testing) {
    std::string packed(sample->contract.payload_bytes(), '\0');
    RETURN_IF_ERROR(PackPayload(views, absl::MakeSpan(packed)));
    options_.corrupt_payload_for_testing(request.sample_id(), packed);
    if (packed.size() != sample->contract.payload_bytes()) {
      return absl::InternalError("corrupt_payload_for_testing changed the payload's length");
    }
    sample->bytes = std::make_shared<PayloadBytes>(std::move(packed));
  } else {
    sample->bytes = std::make_shared<PayloadBytes>(std::move(tensors));
  }
  return sample;
}

absl::StatusOr<std::shared_ptr<const TeacherService::ReadySample>> TeacherService::BuildNcclSample(
    const SampleRequest& request, int64_t row_begin, int64_t row_end,
    const std::vector<NamedTensor>& tensors) {
  auto sample = std::make_shared<ReadySample>();
  sample->request_id = request.request_id();
  sample->sample_id = request.sample_id();
  sample->row_begin = row_begin;
  sample->row_end = row_end;
  std::vector<PayloadTensorLayout> layouts;
  std::vector<torch::Tensor> parts;
  for (const NamedTensor& t : tensors) {
    ASSIGN_OR_RETURN(DType dtype, FromTorchDtype(t.tensor.scalar_type()));
    layouts.push_back({t.name, dtype, ShapeOf(t.tensor)});
    parts.push_back(t.tensor.contiguous().view(-1).view(torch::kUInt8));
  }
  int64_t checksum = 0;
  RETURN_IF_ERROR(CatchTorch("nccl payload", [&] {
    // One buffer where the tensors are (the GPU the target computes on, or
    // the host), sent as it is: on a GPU it never visits the host.
    torch::Tensor packed = torch::cat(parts);
    if (packed.is_cuda() && packed.device().index() != options_.nccl_device) {
      packed = packed.to(torch::Device(torch::kCUDA, options_.nccl_device));
    }
    if (options_.corrupt_payload_for_testing) {
      torch::Tensor host = packed.to(torch::kCPU).contiguous();
      std::string bytes(static_cast<const char*>(host.data_ptr()), host.numel());
      const uint64_t before = DeviceChecksumOf(bytes);
      options_.corrupt_payload_for_testing(request.sample_id(), bytes);
      TORCH_CHECK(bytes.size() == static_cast<size_t>(packed.numel()),
                  "corrupt_payload_for_testing changed the payload's length");
      // The checksum is of the bytes before the test changed them.
      checksum = static_cast<int64_t>(before);
      sample->packed = torch::from_blob(bytes.data(), {packed.numel()}, torch::kUInt8)
                           .to(packed.device(), /*non_blocking=*/false, /*copy=*/true);
      return;
    }
    // Reading the checksum waits for the forward's kernels, so the payload
    // is complete before the NCCL thread sends it from another stream.
    checksum = DeviceChecksum(packed).item<int64_t>();
    sample->packed = packed;
  }));
  if (!sample->packed.defined()) return absl::InternalError("nccl payload: nothing packed");
  ASSIGN_OR_RETURN(sample->contract, MakeDeviceContract(layouts, static_cast<uint64_t>(checksum)));
  return sample;
}

// --- The server --------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TeacherServer>> TeacherServer::Start(TargetRuntime& runtime,
                                                                    TeacherServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: ", options.port, " not in [0, 65535]"));
  }
  if (options.host.empty()) return absl::InvalidArgumentError("host: empty");
  std::unique_ptr<TeacherServer> server(new TeacherServer());
  ASSIGN_OR_RETURN(server->service_, TeacherService::Create(runtime, options.service));
  TeacherService& service = *server->service_;

  // Process-wide switches; both must be set before the builder exists.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  const bool ipv6 = options.host.find(':') != std::string::npos && options.host[0] != '[';
  const std::string host = ipv6 ? absl::StrCat("[", options.host, "]") : options.host;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", options.port), grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<uint64_t>(service.max_request_bytes(), INT_MAX)));
  builder.SetMaxSendMessageSize(
      static_cast<int>(std::min<uint64_t>(service.max_message_bytes(), INT_MAX)));
  // Keepalive: find dead students' connections; accept the students' own
  // keepalive pings down to every 10 s.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Bulk payloads (measured in tests/bench/transport_bench.cc): large HTTP/2
  // frames and TCP reads, and a write buffer of a few chunks so that a
  // stream keeps the socket busy while its next chunk is framed.
  const uint64_t write_buffer = std::min<uint64_t>(
      uint64_t{64} << 20, std::max<uint64_t>(uint64_t{8} << 20, 4 * options.service.chunk_bytes));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, static_cast<int>(write_buffer));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4 << 20);
  builder.AddChannelArgument(GRPC_ARG_TCP_READ_CHUNK_SIZE, 4 << 20);
  builder.AddChannelArgument(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20);
  builder.AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 << 20);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", options.port, " (in use or not local?)"));
  }
  server->port_ = port;
  server->address_ = absl::StrCat(host, ":", port);
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(kTeacherServiceName, true);
    health->SetServingStatus(true);
  }
  SS_LOG_INFO("teacher server: listening on {}", server->address_);
  return server;
}

TeacherServer::~TeacherServer() { Shutdown(absl::ZeroDuration()); }

void TeacherServer::Shutdown(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + timeout;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(false);
  service_->StartDraining();
  if (!service_->WaitUntilIdle(deadline)) {
    SS_LOG_WARN("teacher server: streams still open after {}; cancelling them",
                absl::FormatDuration(timeout));
  }
  // Refuses new calls at once and cancels calls still open at the deadline.
  server_->Shutdown(absl::ToChronoTime(std::max(deadline, absl::Now())));
  service_->Stop();
  const TeacherService::Stats stats = service_->stats();
  SS_LOG_INFO("teacher server: shut down ({} stream(s), {} sample(s) sent, {} sample error(s))",
              stats.streams, stats.samples_sent, stats.sample_errors);
}

}  // namespace specstream::teacher
