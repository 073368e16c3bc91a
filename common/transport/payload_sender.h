// The teacher's side of the payload transports (DESIGN §5), without gRPC or
// LibTorch: how one stream's payload bytes leave the teacher once their
// header is queued. A stream negotiates its sender at Open
// (OpenPayloadSender) and then hands it one payload at a time:
//   * inline: the bytes go on the stream itself, cut into PayloadChunks whose
//     data is referenced in place (never copied into a protobuf string);
//   * shm: the bytes are copied into the student's shared-memory ring, one
//     record per chunk, and the stream carries only each record's position;
//   * nccl: the bytes go over a two-rank NCCL communicator the student
//     created (from device memory when the target computes on a GPU); the
//     stream carries only the header.
// The stream session (teacher/stream_session.h) runs Connect and Send on the
// stream's payload thread and writes what they emit in order; tests drive
// senders with a recording PayloadStream.
#ifndef SPECSTREAM_COMMON_TRANSPORT_PAYLOAD_SENDER_H_
#define SPECSTREAM_COMMON_TRANSPORT_PAYLOAD_SENDER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transport/payload_channel.h"
#include "specstream/v1/teacher.pb.h"

namespace specstream {

// The smallest and largest chunk a teacher may be configured with.
inline constexpr uint64_t kMinChunkBytes = 4 << 10;
inline constexpr uint64_t kMaxChunkBytes = 256 << 20;

// A payload's bytes as the teacher holds them, immutable once built: host
// segments back to back in contract order (the tensors themselves, no
// packing copy), or one packed buffer in CUDA device memory. `owner` keeps
// the memory valid; copies of a PayloadBytes share it.
class PayloadBytes final {
 public:
  PayloadBytes() = default;
  // Host bytes: `segments` in order (empty ones are skipped).
  PayloadBytes(const std::vector<absl::string_view>& segments, std::shared_ptr<const void> owner);
  // `size` bytes at `data` in memory of the sender's CUDA device.
  static PayloadBytes OnDevice(const void* data, uint64_t size, std::shared_ptr<const void> owner);

  uint64_t size() const { return size_; }
  bool on_device() const { return device_data_ != nullptr; }
  const void* device_data() const { return device_data_; }
  const std::shared_ptr<const void>& owner() const { return owner_; }

  // Host bytes only. Bytes [offset, offset + n) in place when they lie in one
  // segment; an empty view when they straddle segments (then use CopyTo).
  absl::string_view View(uint64_t offset, uint64_t n) const;
  void CopyTo(uint64_t offset, uint64_t n, char* dest) const;

 private:
  size_t SegmentOf(uint64_t offset) const;

  std::vector<absl::string_view> segments_;
  std::vector<uint64_t> starts_;
  uint64_t size_ = 0;
  const void* device_data_ = nullptr;
  std::shared_ptr<const void> owner_;
};

// One message for the stream: a StreamResponse (Opened, a header, an shm
// locator, a SampleError), or an inline payload chunk whose data stays where
// it is until written (the stream's adapter frames it: common/grpc/
// byte_buffer.h FramePayloadChunk).
struct StreamMessage {
  static StreamMessage Proto(v1::StreamResponse message);
  static StreamMessage Chunk(uint64_t request_id, uint64_t offset, absl::string_view data,
                             std::shared_ptr<const void> data_owner);

  bool is_chunk = false;
  v1::StreamResponse message;  // !is_chunk
  uint64_t request_id = 0;     // is_chunk: StreamResponse{chunk{request_id, offset, data}}
  uint64_t offset = 0;
  absl::string_view data;
  std::shared_ptr<const void> data_owner;  // keeps `data` valid
};

// The stream a sender writes to (teacher/stream_session.h implements it).
class PayloadStream {
 public:
  virtual ~PayloadStream() = default;
  // Queues `message` after everything emitted before it; blocks while the
  // stream holds several unwritten payload messages (so a payload is never
  // materialised twice over in the queue). Cancelled once the stream has
  // ended; nothing more is sent then.
  virtual absl::Status Emit(StreamMessage message) = 0;
  // True once the stream has ended; long waits poll it and give up
  // (Cancelled). Lock-free.
  virtual bool stopped() const = 0;
};

class PayloadSender {
 public:
  virtual ~PayloadSender() = default;
  virtual v1::Transport transport() const = 0;
  // The largest chunk of this stream (Opened.chunk_bytes).
  virtual uint64_t chunk_bytes() const = 0;
  // Whether a payload's messages go on the stream between its header and
  // its end (inline chunks, shm locators): nothing else is written between
  // them then.
  virtual bool payload_on_stream() const = 0;
  // Whether payloads are one packed buffer checked by a device checksum,
  // built where the target computes (NCCL); else host segments with a
  // CRC32C.
  virtual bool packed_on_device() const { return false; }
  // Blocks until the transport can carry payloads (NCCL: until the student
  // has joined its communicator). Called once, on the stream's payload
  // thread, before the stream answers Opened.
  virtual absl::Status Connect(PayloadStream& stream) { return absl::OkStatus(); }
  // Sends one payload whose header the stream has already queued; blocks
  // while the transport waits (ring space, the student's receive); returns
  // once every byte is handed over. Called on the payload thread, one
  // payload at a time, in header order. A failure ends the stream.
  virtual absl::Status Send(uint64_t request_id, const PayloadBytes& payload,
                            PayloadStream& stream) = 0;
};

// What a teacher offers each stream.
struct PayloadSenderConfig {
  // The largest chunk (kMinChunkBytes to kMaxChunkBytes); Open.max_chunk_bytes
  // and a ring's capacity may lower it per stream.
  uint64_t chunk_bytes = uint64_t{1} << 20;
  // How long an shm stream waits for the student to release ring space.
  absl::Duration shm_space_timeout = absl::Seconds(60);
  // NCCL: the teacher's device (for errors and channels) and how long the
  // join and each send may take. `nccl_join` joins a channel as rank 0;
  // unset: this teacher offers no NCCL.
  int nccl_device = -1;
  absl::Duration nccl_timeout = absl::Seconds(60);
  PayloadChannelJoin nccl_join;
  // Whether this build has NCCL at all (for the error that says why not).
  bool built_with_nccl = false;
};

// The sender a student's Open asks for, or why it cannot have it
// (InvalidArgument, FailedPrecondition or Unimplemented naming the open.*
// field): an unknown transport, an shm ring that cannot be attached or whose
// capacity disagrees, NCCL on a teacher without it, a malformed NCCL id.
// NCCL joins later, in Connect.
absl::StatusOr<std::unique_ptr<PayloadSender>> OpenPayloadSender(
    const v1::StreamRequest::Open& open, const PayloadSenderConfig& config);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TRANSPORT_PAYLOAD_SENDER_H_
