// The NCCL payload transport (TRANSPORT_NCCL, proto/specstream/v1/teacher.proto):
// a two-rank NCCL communicator between one teacher stream (rank 0, the
// sender) and one student stream (rank 1, the receiver), joined with the
// ncclUniqueId the student sent in Open. LibTorch-free; compiled only with
// SPECSTREAM_WITH_NCCL (target specstream_nccl).
//
// Wire contract (both sides must agree, so it is fixed here): a payload of
// `size` bytes travels as ceil(size / kPieceBytes) ncclSend/ncclRecv pairs of
// kPieceBytes each, the last one shorter, in order; an empty payload sends
// nothing. The gRPC stream carries the SampleHeader (contract, length,
// CRC32C) first, so the receiver knows `size` and has checked the contract
// before it posts a receive.
//
// Data path: payload bytes in device memory (a teacher computing on the GPU,
// a student training on it) go straight from and into it: SendDevice and
// RecvDevice post the pieces on the buffer itself. Bytes in host memory
// (Send, Recv) use two pinned host buffers and two device buffers of
// kPieceBytes on the CUDA device, pipelined: the sender fills piece i+1 on
// the CPU while piece i is copied to the device and sent; the receiver
// copies piece i out while piece i+1 arrives. Either kind of sender pairs
// with either kind of receiver. NCCL picks the link (NVLink, PCIe P2P,
// InfiniBand or sockets) between the two devices.
//
// Failure: every wait polls the CUDA event, NCCL's asynchronous error,
// `stopped` and the deadline. A peer that never joins, dies mid-transfer or
// stalls past the timeout, and a stream that ends while a transfer waits,
// abort the communicator (ncclCommAbort) so nothing hangs; the channel is
// then broken and every later call returns the first error.
//
// Close: destroying a healthy channel finalizes the communicator, so bytes
// NCCL still holds of completed sends reach the peer (at most 10 s, then it
// aborts). The piece buffers go to a per-device pool for the next channel
// rather than being freed (cudaFree would synchronise the whole device).
//
// Thread-safety: one thread at a time (the stream's payload thread).
#ifndef SPECSTREAM_COMMON_TRANSPORT_NCCL_CHANNEL_H_
#define SPECSTREAM_COMMON_TRANSPORT_NCCL_CHANNEL_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transport/payload_channel.h"

namespace specstream {

// rank, device, timeout and stopped (polled about every 50 us).
using NcclChannelOptions = PayloadChannelOptions;

class NcclChannel final : public PayloadChannel {
 public:
  // The size of one ncclSend/ncclRecv (the wire contract above).
  static constexpr uint64_t kPieceBytes = uint64_t{8} << 20;

  // Joins the communicator named by `unique_id` (NCCL_UNIQUE_ID_BYTES raw
  // bytes) as options.rank and waits until the peer has joined too.
  // InvalidArgument for a malformed id or rank, FailedPrecondition for a
  // device that does not exist, DeadlineExceeded when the peer does not join
  // within the timeout, Cancelled when `stopped` says so.
  static absl::StatusOr<std::unique_ptr<NcclChannel>> Join(absl::string_view unique_id,
                                                           NcclChannelOptions options);
  // Closes the communicator (see Close above).
  ~NcclChannel() override;
  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;

  // Rank 0 only: sends one payload of `size` bytes. `fill(offset, n, dest)`
  // writes payload bytes [offset, offset + n) into `dest` (host memory, n <=
  // kPieceBytes); it is called in offset order. Returns once NCCL has taken
  // every piece (the peer has posted every receive; the last bytes may still
  // be on the wire until the channel is closed).
  absl::Status Send(
      uint64_t size,
      const std::function<void(uint64_t offset, uint64_t n, char* dest)>& fill) override;

  // Rank 1 only: receives one payload of exactly `size` bytes (what the
  // header announced) into `dest`.
  absl::Status Recv(char* dest, uint64_t size) override;

  // The same from and into memory of options.device (PayloadChannel).
  absl::Status SendDevice(const void* data, uint64_t size) override;
  absl::Status RecvDevice(void* dest, uint64_t size) override;

  // OK until a transfer failed; then the first error.
  absl::Status health() const;

  // Changes the timeout of later Send/Recv calls (> 0), e.g. from the join
  // timeout to a per-payload one.
  void set_timeout(absl::Duration timeout) override;

 private:
  struct State;
  explicit NcclChannel(std::unique_ptr<State> state);
  absl::Status SendPieces(uint64_t size,
                          const std::function<void(uint64_t offset, uint64_t n, char* dest)>& fill);
  absl::Status RecvPieces(char* dest, uint64_t size);
  // Posts every piece of a device buffer (send or receive) on the NCCL
  // stream, then waits for the last.
  absl::Status DevicePieces(bool send, char* data, uint64_t size);
  std::unique_ptr<State> state_;
};

// NcclChannel::Join as a PayloadChannelJoin (what the teacher service and
// the student's online source use when no test channel is set).
absl::StatusOr<std::unique_ptr<PayloadChannel>> JoinNcclChannel(absl::string_view unique_id,
                                                                PayloadChannelOptions options);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TRANSPORT_NCCL_CHANNEL_H_
