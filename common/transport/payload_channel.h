// An out-of-band payload channel between one teacher stream (rank 0, the
// sender) and one student stream (rank 1, the receiver): what
// TRANSPORT_NCCL streams use for payload bytes while the gRPC stream carries
// Open/Opened, headers and acks. NcclChannel (common/transport/nccl_channel.h) is the
// implementation; tests substitute an in-process one
// (tests/testing/loopback_channel.h) to run the stream protocol on machines
// without a GPU. Header-only, LibTorch- and CUDA-free.
//
// Contract of every implementation:
//   * Join(id, options) returns once both ranks have joined the channel named
//     by `id`, or fails: DeadlineExceeded past options.timeout, Cancelled once
//     options.stopped() says so.
//   * Send (rank 0) and Recv (rank 1) move one payload each, in the same
//     order on both sides; Send returns once the channel has taken every
//     byte, Recv is told the exact size (from the header already read).
//   * Destroying a healthy channel delivers what it still holds.
//   * A failed Send/Recv breaks the channel; later calls return the error.
//   * SendDevice/RecvDevice move the same bytes as Send/Recv, in the same
//     pieces (the wire is the same), straight from or into memory of the
//     channel's CUDA device; a sender of either kind pairs with a receiver of
//     either kind. Channels that move host memory only refuse them.
#ifndef SPECSTREAM_COMMON_TRANSPORT_PAYLOAD_CHANNEL_H_
#define SPECSTREAM_COMMON_TRANSPORT_PAYLOAD_CHANNEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace specstream {

// Size of a channel id (an ncclUniqueId: NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kPayloadChannelIdBytes = 128;

struct PayloadChannelOptions {
  // 0: the teacher (sends payloads); 1: the student (receives them).
  int rank = 0;
  // The CUDA device that holds this side's buffers (NCCL).
  int device = 0;
  // How long Join waits for the peer, and how long one Send or Recv may take.
  absl::Duration timeout = absl::Seconds(60);
  // Polled while waiting; true ends the wait with Cancelled. Unset: never.
  std::function<bool()> stopped;
};

class PayloadChannel {
 public:
  virtual ~PayloadChannel() = default;
  // Rank 0: sends one payload of `size` bytes; `fill(offset, n, dest)`
  // writes bytes [offset, offset + n) into `dest`, in offset order.
  virtual absl::Status Send(
      uint64_t size, const std::function<void(uint64_t offset, uint64_t n, char* dest)>& fill) = 0;
  // Rank 1: receives one payload of exactly `size` bytes into `dest`.
  virtual absl::Status Recv(char* dest, uint64_t size) = 0;
  // Rank 0: sends `size` bytes that lie in memory of options.device (a CUDA
  // device), ready to read (nothing queued on another stream still writes
  // them). Rank 1: receives `size` bytes into such memory; when it returns
  // they are there. Unimplemented for host-only channels.
  virtual absl::Status SendDevice(const void* data, uint64_t size) {
    return absl::UnimplementedError("this payload channel moves host memory only");
  }
  virtual absl::Status RecvDevice(void* dest, uint64_t size) {
    return absl::UnimplementedError("this payload channel moves host memory only");
  }
  // The timeout of later Send/Recv calls (> 0).
  virtual void set_timeout(absl::Duration timeout) = 0;
};

using PayloadChannelJoin = std::function<absl::StatusOr<std::unique_ptr<PayloadChannel>>(
    absl::string_view id, PayloadChannelOptions options)>;

// How a student makes channels: a fresh id to send in Open, and its join.
struct PayloadChannelFactory {
  std::function<absl::StatusOr<std::string>()> new_id;
  PayloadChannelJoin join;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TRANSPORT_PAYLOAD_CHANNEL_H_
