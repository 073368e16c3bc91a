#include "common/transport/nccl_channel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/transport/nccl_util.h"
#include "cuda_runtime_api.h"

namespace specstream {

static_assert(kPayloadChannelIdBytes == NCCL_UNIQUE_ID_BYTES);

namespace {

constexpr absl::Duration kPollInterval = absl::Microseconds(50);

// Waits on the GPU and the peer are timed on the monotonic clock: this
// library links no common core (and so no Env, common/env.h), and a wall
// clock set back must not stretch a timeout.
using Deadline = std::chrono::steady_clock::time_point;
Deadline DeadlineIn(absl::Duration d) {
  // InfiniteDuration (and any timeout of a century or more) never passes;
  // steady_clock's nanoseconds would overflow past ~292 years.
  if (d >= absl::Hours(24 * 365 * 100)) return Deadline::max();
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(d);
}
bool Passed(Deadline deadline) { return std::chrono::steady_clock::now() >= deadline; }

// One of the two pipeline slots: a pinned host buffer and a device buffer of
// kPieceBytes, with events marking when the host<->device copy and the NCCL
// transfer that last used them have finished.
struct Slot {
  char* host = nullptr;
  void* device = nullptr;
  cudaEvent_t copied = nullptr;
  cudaEvent_t transferred = nullptr;
};

// Pinned and device piece buffers outlive their channels: freeing them
// (cudaFree, cudaFreeHost) would synchronise the whole device and stall the
// other streams' transfers, so a closed channel's buffers wait here for the
// next channel on the same device. The pool holds at most what the most
// concurrent streams ever used.
struct BufferPool {
  std::mutex mu;
  std::map<int, std::vector<std::pair<char*, void*>>> free;  // device -> (host, device)
};

BufferPool& Pool() {
  static auto* pool = new BufferPool;  // never destroyed: buffers live until exit
  return *pool;
}

// How long closing a healthy channel may take to deliver what NCCL still
// holds of completed sends before it aborts instead.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);

}  // namespace

struct NcclChannel::State {
  NcclChannelOptions options;
  ncclComm_t comm = nullptr;
  cudaStream_t nccl_stream = nullptr;
  cudaStream_t copy_stream = nullptr;
  Slot slots[2];
  absl::Status broken;

  absl::Status UseDevice() {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(options.device));
    return absl::OkStatus();
  }

  // Marks the channel broken with `why` and aborts the communicator, which
  // ends NCCL's kernels and proxy threads for it. Returns `why`.
  absl::Status Fail(absl::Status why) {
    if (broken.ok()) broken = why;
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    return broken;
  }

  // The reason to stop waiting now, if any: NCCL's asynchronous error, the
  // stream's end, the deadline.
  absl::Status Interrupted(Deadline deadline, absl::string_view what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
    if (queried != ncclSuccess) state = queried;
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclStatus(state, absl::StrCat("NCCL, while ", what).c_str(), __FILE__, __LINE__);
    }
    if (options.stopped && options.stopped()) {
      return absl::CancelledError(absl::StrCat("the stream ended while ", what));
    }
    if (Passed(deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("NCCL peer (rank ", 1 - options.rank,
                                                      ") did not finish ", what, " within ",
                                                      absl::FormatDuration(options.timeout)));
    }
    return absl::OkStatus();
  }

  // Waits until the communicator has no operation in progress (nonblocking
  // communicators return ncclInProgress from init and enqueue calls).
  absl::Status Settle(Deadline deadline, absl::string_view what) {
    while (true) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
      if (queried != ncclSuccess) state = queried;
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        return Fail(
            NcclStatus(state, absl::StrCat("NCCL, while ", what).c_str(), __FILE__, __LINE__));
      }
      if (absl::Status s = Interrupted(deadline, what); !s.ok()) return Fail(s);
      absl::SleepFor(kPollInterval);
    }
  }

  // An NCCL enqueue call's result: fine, in progress (settle it), or failed.
  absl::Status Enqueued(ncclResult_t result, Deadline deadline, absl::string_view what) {
    if (result == ncclSuccess) return absl::OkStatus();
    if (result == ncclInProgress) return Settle(deadline, what);
    return Fail(NcclStatus(result, absl::StrCat(what).c_str(), __FILE__, __LINE__));
  }

  absl::Status Wait(cudaEvent_t event, Deadline deadline, absl::string_view what) {
    while (true) {
      const cudaError_t done = cudaEventQuery(event);
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) {
        return Fail(CudaStatus(done, absl::StrCat("cudaEventQuery, while ", what).c_str(), __FILE__,
                               __LINE__));
      }
      if (absl::Status s = Interrupted(deadline, what); !s.ok()) return Fail(s);
      absl::SleepFor(kPollInterval);
    }
  }

  absl::Status Allocate() {
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&nccl_stream, cudaStreamNonBlocking));
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
    for (Slot& slot : slots) {
      {
        BufferPool& pool = Pool();
        std::lock_guard<std::mutex> lock(pool.mu);
        std::vector<std::pair<char*, void*>>& free = pool.free[options.device];
        if (!free.empty()) {
          std::tie(slot.host, slot.device) = free.back();
          free.pop_back();
        }
      }
      if (slot.host == nullptr) {
        RETURN_IF_CUDA_ERROR(cudaMallocHost(reinterpret_cast<void**>(&slot.host), kPieceBytes));
      }
      if (slot.device == nullptr) RETURN_IF_CUDA_ERROR(cudaMalloc(&slot.device, kPieceBytes));
      RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
      RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&slot.transferred, cudaEventDisableTiming));
    }
    return absl::OkStatus();
  }

  // Closes the communicator: a healthy one is finalized (NCCL delivers what
  // it still holds of completed sends) and destroyed, a broken one or one
  // that does not finalize in time is aborted. Then the buffers go back to
  // the pool once this channel's streams are idle.
  void Release() {
    if (cudaSetDevice(options.device) != cudaSuccess) return;
    if (comm != nullptr) {
      bool finalized = false;
      if (broken.ok()) {
        const ncclResult_t started = ncclCommFinalize(comm);
        const Deadline deadline = DeadlineIn(std::min(options.timeout, kFinalizeTimeout));
        while (started == ncclSuccess || started == ncclInProgress) {
          ncclResult_t state = ncclInProgress;
          if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
          if (state == ncclSuccess) {
            finalized = true;
            break;
          }
          if (state != ncclInProgress || Passed(deadline)) break;
          absl::SleepFor(kPollInterval);
        }
      }
      if (finalized) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
      comm = nullptr;
    }
    // NCCL has finished or aborted its kernels, so these waits are short.
    if (nccl_stream != nullptr) cudaStreamSynchronize(nccl_stream);
    if (copy_stream != nullptr) cudaStreamSynchronize(copy_stream);
    for (Slot& slot : slots) {
      if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
      if (slot.transferred != nullptr) cudaEventDestroy(slot.transferred);
      if (slot.host != nullptr || slot.device != nullptr) {
        BufferPool& pool = Pool();
        std::lock_guard<std::mutex> lock(pool.mu);
        if (slot.host != nullptr && slot.device != nullptr) {
          pool.free[options.device].emplace_back(slot.host, slot.device);
        } else {  // half-allocated: free what there is
          if (slot.host != nullptr) cudaFreeHost(slot.host);
          if (slot.device != nullptr) cudaFree(slot.device);
        }
      }
      slot = Slot{};
    }
    if (nccl_stream != nullptr) cudaStreamDestroy(nccl_stream);
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
    nccl_stream = copy_stream = nullptr;
    cudaGetLastError();
  }
};

NcclChannel::NcclChannel(std::unique_ptr<State> state) : state_(std::move(state)) {}

NcclChannel::~NcclChannel() { state_->Release(); }

absl::Status NcclChannel::health() const { return state_->broken; }

void NcclChannel::set_timeout(absl::Duration timeout) {
  if (timeout > absl::ZeroDuration()) state_->options.timeout = timeout;
}

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Join(absl::string_view unique_id,
                                                               NcclChannelOptions options) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrFormat("nccl_unique_id: %d bytes, an ncclUniqueId has %d", unique_id.size(),
                        NCCL_UNIQUE_ID_BYTES));
  }
  if (options.rank != 0 && options.rank != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL channel rank: ", options.rank, " (0: teacher, 1: student)"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NCCL channel timeout: must be > 0");
  }
  const int devices = CudaDeviceCount();
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrFormat("CUDA device %d for NCCL: %d device(s) visible", options.device, devices));
  }
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  auto channel = std::unique_ptr<NcclChannel>(new NcclChannel(std::move(state)));
  State& s = *channel->state_;
  RETURN_IF_ERROR(s.UseDevice());
  RETURN_IF_ERROR(s.Allocate());

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and enqueue return at once; Settle polls with a deadline
  const Deadline deadline = DeadlineIn(s.options.timeout);
  const ncclResult_t started = ncclCommInitRankConfig(&s.comm, 2, id, s.options.rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    s.comm = nullptr;
    return NcclStatus(started, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  RETURN_IF_ERROR(s.Settle(deadline, "joining the communicator"));
  return channel;
}

absl::Status NcclChannel::Send(
    uint64_t size, const std::function<void(uint64_t offset, uint64_t n, char* dest)>& fill) {
  State& s = *state_;
  if (!s.broken.ok()) return s.broken;
  if (s.options.rank != 0) return absl::FailedPreconditionError("NCCL Send on the student's rank");
  if (size == 0) return absl::OkStatus();
  absl::Status sent = SendPieces(size, fill);
  return sent.ok() ? sent : s.Fail(std::move(sent));
}

absl::Status NcclChannel::SendPieces(
    uint64_t size, const std::function<void(uint64_t offset, uint64_t n, char* dest)>& fill) {
  State& s = *state_;
  RETURN_IF_ERROR(s.UseDevice());
  const Deadline deadline = DeadlineIn(s.options.timeout);
  const uint64_t pieces = (size + kPieceBytes - 1) / kPieceBytes;
  for (uint64_t i = 0; i < pieces; ++i) {
    Slot& slot = s.slots[i % 2];
    const uint64_t offset = i * kPieceBytes;
    const uint64_t n = std::min(kPieceBytes, size - offset);
    // The host buffer is free once the copy of piece i-2 out of it is done.
    if (i >= 2) RETURN_IF_ERROR(s.Wait(slot.copied, deadline, "staging a payload piece"));
    fill(offset, n, slot.host);
    // The device buffer is free once piece i-2 has been sent from it.
    if (i >= 2) RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(s.copy_stream, slot.transferred, 0));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(slot.device, slot.host, n, cudaMemcpyHostToDevice, s.copy_stream));
    RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.copied, s.copy_stream));
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(s.nccl_stream, slot.copied, 0));
    RETURN_IF_ERROR(s.Enqueued(ncclSend(slot.device, n, ncclChar, 1, s.comm, s.nccl_stream),
                               deadline, "sending a payload piece"));
    RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.transferred, s.nccl_stream));
  }
  // The NCCL stream runs in order: the last piece sent means all were.
  return s.Wait(s.slots[(pieces - 1) % 2].transferred, deadline, "sending a payload");
}

absl::Status NcclChannel::Recv(char* dest, uint64_t size) {
  State& s = *state_;
  if (!s.broken.ok()) return s.broken;
  if (s.options.rank != 1) return absl::FailedPreconditionError("NCCL Recv on the teacher's rank");
  if (size == 0) return absl::OkStatus();
  absl::Status received = RecvPieces(dest, size);
  return received.ok() ? received : s.Fail(std::move(received));
}

absl::Status NcclChannel::RecvPieces(char* dest, uint64_t size) {
  State& s = *state_;
  RETURN_IF_ERROR(s.UseDevice());
  const Deadline deadline = DeadlineIn(s.options.timeout);
  const uint64_t pieces = (size + kPieceBytes - 1) / kPieceBytes;
  auto copy_out = [&](uint64_t i) -> absl::Status {
    Slot& slot = s.slots[i % 2];
    const uint64_t offset = i * kPieceBytes;
    RETURN_IF_ERROR(s.Wait(slot.copied, deadline, "receiving a payload piece"));
    std::memcpy(dest + offset, slot.host, std::min(kPieceBytes, size - offset));
    return absl::OkStatus();
  };
  for (uint64_t i = 0; i < pieces; ++i) {
    Slot& slot = s.slots[i % 2];
    const uint64_t n = std::min(kPieceBytes, size - i * kPieceBytes);
    // The device buffer is free once piece i-2 was copied out of it; the
    // host buffer once the CPU copied piece i-2 out (copy_out(i-2) ran in
    // the previous iteration).
    if (i >= 2) RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(s.nccl_stream, slot.copied, 0));
    RETURN_IF_ERROR(s.Enqueued(ncclRecv(slot.device, n, ncclChar, 0, s.comm, s.nccl_stream),
                               deadline, "receiving a payload piece"));
    RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.transferred, s.nccl_stream));
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(s.copy_stream, slot.transferred, 0));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(slot.host, slot.device, n, cudaMemcpyDeviceToHost, s.copy_stream));
    RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.copied, s.copy_stream));
    if (i >= 1) RETURN_IF_ERROR(copy_out(i - 1));
  }
  return copy_out(pieces - 1);
}

absl::Status NcclChannel::SendDevice(const void* data, uint64_t size) {
  State& s = *state_;
  if (!s.broken.ok()) return s.broken;
  if (s.options.rank != 0) return absl::FailedPreconditionError("NCCL Send on the student's rank");
  if (size == 0) return absl::OkStatus();
  absl::Status sent = DevicePieces(true, static_cast<char*>(const_cast<void*>(data)), size);
  return sent.ok() ? sent : s.Fail(std::move(sent));
}

absl::Status NcclChannel::RecvDevice(void* dest, uint64_t size) {
  State& s = *state_;
  if (!s.broken.ok()) return s.broken;
  if (s.options.rank != 1) return absl::FailedPreconditionError("NCCL Recv on the teacher's rank");
  if (size == 0) return absl::OkStatus();
  absl::Status received = DevicePieces(false, static_cast<char*>(dest), size);
  return received.ok() ? received : s.Fail(std::move(received));
}

absl::Status NcclChannel::DevicePieces(bool send, char* data, uint64_t size) {
  State& s = *state_;
  RETURN_IF_ERROR(s.UseDevice());
  const Deadline deadline = DeadlineIn(s.options.timeout);
  const char* what = send ? "sending a payload piece" : "receiving a payload piece";
  // The same pieces as SendPieces/RecvPieces (the wire contract), posted in
  // order on the NCCL stream without staging.
  for (uint64_t offset = 0; offset < size; offset += kPieceBytes) {
    const uint64_t n = std::min(kPieceBytes, size - offset);
    const ncclResult_t posted =
        send ? ncclSend(data + offset, n, ncclChar, 1, s.comm, s.nccl_stream)
             : ncclRecv(data + offset, n, ncclChar, 0, s.comm, s.nccl_stream);
    RETURN_IF_ERROR(s.Enqueued(posted, deadline, what));
  }
  cudaEvent_t done = s.slots[0].transferred;
  RETURN_IF_CUDA_ERROR(cudaEventRecord(done, s.nccl_stream));
  return s.Wait(done, deadline, send ? "sending a payload" : "receiving a payload");
}

absl::StatusOr<std::unique_ptr<PayloadChannel>> JoinNcclChannel(absl::string_view unique_id,
                                                                PayloadChannelOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<NcclChannel> channel,
                   NcclChannel::Join(unique_id, std::move(options)));
  return std::unique_ptr<PayloadChannel>(std::move(channel));
}

}  // namespace specstream
