#include "common/transport/payload_sender.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "common/status.h"
#include "common/transport/shm_ring.h"

namespace specstream {
namespace {

// A ring wait re-checks whether its stream has ended this often.
constexpr absl::Duration kRingWaitSlice = absl::Milliseconds(50);

// Calls fn(offset, n) for the consecutive chunks, at most chunk_bytes each,
// that cover [0, size), stopping at the first error.
template <typename Fn>
absl::Status ForEachChunk(uint64_t size, uint64_t chunk_bytes, Fn fn) {
  for (uint64_t offset = 0; offset < size;) {
    const uint64_t n = std::min(chunk_bytes, size - offset);
    RETURN_IF_ERROR(fn(offset, n));
    offset += n;
  }
  return absl::OkStatus();
}

// Inline: chunks on the stream, their data referenced in place; a chunk that
// straddles two tensors is the one small copy.
class InlineSender final : public PayloadSender {
 public:
  explicit InlineSender(uint64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

  v1::Transport transport() const override { return v1::TRANSPORT_INLINE; }
  uint64_t chunk_bytes() const override { return chunk_bytes_; }
  bool payload_on_stream() const override { return true; }

  absl::Status Send(uint64_t request_id, const PayloadBytes& payload,
                    PayloadStream& stream) override {
    return ForEachChunk(payload.size(), chunk_bytes_, [&](uint64_t offset, uint64_t n) {
      absl::string_view view = payload.View(offset, n);
      if (!view.empty()) {
        return stream.Emit(StreamMessage::Chunk(request_id, offset, view, payload.owner()));
      }
      auto joined = std::make_shared<std::string>(n, '\0');
      payload.CopyTo(offset, n, joined->data());
      return stream.Emit(StreamMessage::Chunk(request_id, offset, *joined, joined));
    });
  }

 private:
  const uint64_t chunk_bytes_;
};

// Shared memory: each chunk copied into one ring record; the stream carries
// the record's position. The wait for ring space is the only blocking wait;
// it gives up when the stream ends (Cancelled) or after space_timeout. A
// ring that another local process truncates fails the Send with DataLoss
// (every ring access is guarded against SIGBUS), which ends the stream.
class ShmSender final : public PayloadSender {
 public:
  ShmSender(std::unique_ptr<ShmRing> ring, uint64_t chunk_bytes, absl::Duration space_timeout)
      : ring_(std::move(ring)), chunk_bytes_(chunk_bytes), space_timeout_(space_timeout) {}

  v1::Transport transport() const override { return v1::TRANSPORT_SHM; }
  uint64_t chunk_bytes() const override { return chunk_bytes_; }
  bool payload_on_stream() const override { return true; }

  absl::Status Send(uint64_t request_id, const PayloadBytes& payload,
                    PayloadStream& stream) override {
    return ForEachChunk(
        payload.size(), chunk_bytes_, [&](uint64_t offset, uint64_t n) -> absl::Status {
          ASSIGN_OR_RETURN(ShmRing::Reservation record, Reserve(n, stream));
          // CopyTo only copies bytes, as Fill requires. A ring truncated under
          // us ends this stream with DataLoss, not the teacher with SIGBUS.
          RETURN_IF_ERROR(
              ring_->Fill([&](absl::Span<char> dest) { payload.CopyTo(offset, n, dest.data()); }));
          RETURN_IF_ERROR(ring_->Commit());
          v1::StreamResponse response;
          v1::StreamResponse::PayloadChunk* chunk = response.mutable_chunk();
          chunk->set_request_id(request_id);
          chunk->set_offset(offset);
          chunk->mutable_shm()->set_position(record.position);
          chunk->mutable_shm()->set_length(n);
          return stream.Emit(StreamMessage::Proto(std::move(response)));
        });
  }

 private:
  // Space for one record, waiting in slices so that the end of the stream
  // interrupts the wait.
  absl::StatusOr<ShmRing::Reservation> Reserve(uint64_t n, const PayloadStream& stream) {
    const absl::Time deadline = Env::Default().Now() + space_timeout_;
    while (true) {
      if (stream.stopped()) return absl::CancelledError("the stream ended");
      const absl::Duration left = deadline - Env::Default().Now();
      absl::StatusOr<ShmRing::Reservation> record =
          ring_->Reserve(n, std::max(absl::ZeroDuration(), std::min(left, kRingWaitSlice)));
      if (record.ok() || record.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return record;
      }
      if (Env::Default().Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "shm ring %s: no room for a %d-byte record within %s; the student does not release "
            "records",
            ring_->name(), n, absl::FormatDuration(space_timeout_)));
      }
    }
  }

  std::unique_ptr<ShmRing> ring_;
  const uint64_t chunk_bytes_;
  const absl::Duration space_timeout_;
};

// NCCL: joins the student's communicator as rank 0 in Connect; each payload
// is one NcclChannel send (from device memory when it lies there), which
// returns once the student has received it.
class NcclSender final : public PayloadSender {
 public:
  NcclSender(std::string unique_id, uint64_t chunk_bytes, const PayloadSenderConfig& config)
      : unique_id_(std::move(unique_id)),
        chunk_bytes_(chunk_bytes),
        device_(config.nccl_device),
        timeout_(config.nccl_timeout),
        join_(config.nccl_join) {}

  v1::Transport transport() const override { return v1::TRANSPORT_NCCL; }
  uint64_t chunk_bytes() const override { return chunk_bytes_; }
  bool payload_on_stream() const override { return false; }
  bool packed_on_device() const override { return true; }

  absl::Status Connect(PayloadStream& stream) override {
    PayloadChannelOptions options;
    options.rank = 0;
    options.device = device_;
    options.timeout = timeout_;
    // Polled often while NCCL waits: lock-free.
    options.stopped = [&stream] { return stream.stopped(); };
    absl::StatusOr<std::unique_ptr<PayloadChannel>> channel = join_(unique_id_, std::move(options));
    if (!channel.ok()) return JoinError(channel.status());
    channel_ = *std::move(channel);
    return absl::OkStatus();
  }

  absl::Status Send(uint64_t request_id, const PayloadBytes& payload,
                    PayloadStream& stream) override {
    if (channel_ == nullptr) return absl::FailedPreconditionError("nccl: Send before Connect");
    if (payload.on_device()) return channel_->SendDevice(payload.device_data(), payload.size());
    return channel_->Send(payload.size(), [&payload](uint64_t offset, uint64_t n, char* dest) {
      payload.CopyTo(offset, n, dest);
    });
  }

 private:
  // A failed join, blamed on the student's id (a peer that did not join, a
  // malformed id) or on this teacher's device (memory, CUDA, NCCL).
  absl::Status JoinError(const absl::Status& why) const {
    switch (why.code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kCancelled:
        return Annotate(why, "open.nccl_unique_id");
      default:
        return Annotate(why, absl::StrCat("nccl_device ", device_));
    }
  }

  const std::string unique_id_;
  const uint64_t chunk_bytes_;
  const int device_;
  const absl::Duration timeout_;
  const PayloadChannelJoin join_;
  std::unique_ptr<PayloadChannel> channel_;  // after Connect
};

// Whether this teacher can open `open` over NCCL.
absl::Status CheckNcclOpen(const v1::StreamRequest::Open& open, const PayloadSenderConfig& config) {
  if (config.nccl_join == nullptr) {
    return config.built_with_nccl
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

}  // namespace

// --- PayloadBytes ------------------------------------------------------------------

PayloadBytes::PayloadBytes(const std::vector<absl::string_view>& segments,
                           std::shared_ptr<const void> owner)
    : owner_(std::move(owner)) {
  for (absl::string_view segment : segments) {
    if (segment.empty()) continue;
    segments_.push_back(segment);
    starts_.push_back(size_);
    size_ += segment.size();
  }
}

PayloadBytes PayloadBytes::OnDevice(const void* data, uint64_t size,
                                    std::shared_ptr<const void> owner) {
  PayloadBytes bytes;
  bytes.device_data_ = data;
  bytes.size_ = size;
  bytes.owner_ = std::move(owner);
  return bytes;
}

size_t PayloadBytes::SegmentOf(uint64_t offset) const {
  return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                             starts_.begin()) -
         1;
}

absl::string_view PayloadBytes::View(uint64_t offset, uint64_t n) const {
  const size_t s = SegmentOf(offset);
  const uint64_t within = offset - starts_[s];
  if (within + n > segments_[s].size()) return {};
  return segments_[s].substr(within, n);
}

void PayloadBytes::CopyTo(uint64_t offset, uint64_t n, char* dest) const {
  for (size_t s = SegmentOf(offset); n > 0; ++s) {
    const uint64_t within = offset - starts_[s];
    const uint64_t take = std::min<uint64_t>(n, segments_[s].size() - within);
    std::memcpy(dest, segments_[s].data() + within, take);
    dest += take;
    offset += take;
    n -= take;
  }
}

// --- StreamMessage -----------------------------------------------------------------

StreamMessage StreamMessage::Proto(v1::StreamResponse message) {
  StreamMessage m;
  m.message = std::move(message);
  return m;
}

StreamMessage StreamMessage::Chunk(uint64_t request_id, uint64_t offset, absl::string_view data,
                                   std::shared_ptr<const void> data_owner) {
  StreamMessage m;
  m.is_chunk = true;
  m.request_id = request_id;
  m.offset = offset;
  m.data = data;
  m.data_owner = std::move(data_owner);
  return m;
}

// --- Negotiation -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<PayloadSender>> OpenPayloadSender(
    const v1::StreamRequest::Open& open, const PayloadSenderConfig& config) {
  uint64_t chunk = config.chunk_bytes;
  if (open.max_chunk_bytes() > 0) chunk = std::min<uint64_t>(chunk, open.max_chunk_bytes());
  switch (open.transport()) {
    case v1::TRANSPORT_INLINE:
      return std::make_unique<InlineSender>(chunk);
    case v1::TRANSPORT_SHM: {
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
      return std::make_unique<ShmSender>(*std::move(ring), chunk, config.shm_space_timeout);
    }
    case v1::TRANSPORT_NCCL:
      RETURN_IF_ERROR(CheckNcclOpen(open, config));
      return std::make_unique<NcclSender>(open.nccl_unique_id(), chunk, config);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("open.transport: ", v1::Transport_Name(open.transport()), " (",
                       static_cast<int>(open.transport()),
                       ") is not a transport this teacher serves (TRANSPORT_INLINE, TRANSPORT_SHM, "
                       "TRANSPORT_NCCL)"));
  }
}

}  // namespace specstream
