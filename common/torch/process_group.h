// c10d process groups for CPU (Gloo) ranks: rendezvous through a TCPStore,
// torchrun-style (rank, world size, master address and port), across hosts.
//
// Each rank binds its Gloo device to its own address (never to the master's,
// which is local only on rank 0's host): `local_addr` when given, else the
// address of `interface`, else the local address that routes to
// `master_addr`. Joining has a deadline: a rank that cannot reach the store,
// cannot bind, or never arrives makes every rank fail within `join_timeout`
// with one error naming the rank, its host and the reason.
//
// Tensors on CUDA devices use NCCL groups (CreateNcclGroup, CreateDeviceGroup)
// built over the same store; CPU tensors and small control messages use
// Gloo. Gloo in LibTorch 1.13 has no reduce_scatter and no bf16 all-reduce;
// the helpers below fall back there (all_reduce + slice, fp32 round trip)
// and use the real collectives everywhere else.
#ifndef SPECSTREAM_COMMON_TORCH_PROCESS_GROUP_H_
#define SPECSTREAM_COMMON_TORCH_PROCESS_GROUP_H_

#include <chrono>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "common/torch/compat.h"

namespace specstream {

// How long a collective or a store operation may wait on the other ranks
// once a group is up (a rank that stopped answering fails the job then).
inline constexpr std::chrono::minutes kCollectiveTimeout{5};

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // rank 0 with port 0: bind any free port (see Store)
  // This rank's own address (`--host`, SPECSTREAM_HOST); empty: see above.
  std::string local_addr;
  // A network interface to bind instead (GLOO_SOCKET_IFNAME, as torchrun).
  std::string interface;
  // Connecting to the store plus every rank's arrival (parallel.
  // rendezvous_timeout_s for training jobs).
  std::chrono::milliseconds join_timeout{std::chrono::minutes(2)};
  // Collectives and store operations once the group is up.
  std::chrono::milliseconds timeout{kCollectiveTimeout};
};

// The address this rank's Gloo device binds (see the file comment).
// InvalidArgument naming the interface or address when it has none here.
absl::StatusOr<std::string> ResolveLocalAddress(const RendezvousOptions& options);

// Rank 0 hosts the TCPStore server, others connect. The store outlives the
// group; keep both.
struct ProcessGroupHandle {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<CommGroup> group;
  int port = 0;  // the store's actual port (useful when master_port was 0)
};

// The join barrier of CreateGlooGroup on its own, for groups built over a
// store of their own (NCCL): every rank announces "<hostname>,
// <local_address>" and waits for the others until options.join_timeout;
// DeadlineExceeded naming the missing ranks (the same error on every rank),
// or the reason another rank published.
absl::Status JoinRendezvous(c10d::Store& store, const RendezvousOptions& options,
                            const std::string& local_address);

// Creates the TCPStore (server on rank 0) only. A client retries until
// `join_timeout`, then fails naming the store's address.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> CreateTcpStore(const RendezvousOptions& options,
                                                               int* bound_port = nullptr);

// Creates a Gloo process group: the store (unless `store` is given, e.g. a
// prefix of a shared one), this rank's device on its own address, the join
// barrier with its deadline, then the group. A rank that fails before the
// barrier publishes its reason in the store, so the others fail at once.
absl::StatusOr<ProcessGroupHandle> CreateGlooGroup(const RendezvousOptions& options,
                                                   c10::intrusive_ptr<c10d::Store> store = {});

// An NCCL group for tensors on `device` (cuda:N) over `store` (the world's
// TCPStore, or a prefix of it, that no other group uses), after the same
// join barrier as CreateGlooGroup. NCCL's own bootstrap binds this rank's
// address too: NCCL_SOCKET_IFNAME is set to the interface holding it
// (ResolveLocalAddress) unless the user set it. FailedPrecondition when this
// LibTorch has no NCCL process groups (SPECSTREAM_WITH_TORCH_NCCL is 0: a
// CPU build) or `device` is not a CUDA device.
absl::StatusOr<c10::intrusive_ptr<CommGroup>> CreateNcclGroup(const RendezvousOptions& options,
                                                              c10::intrusive_ptr<c10d::Store> store,
                                                              torch::Device device);

// The group for tensors on `device`: Gloo (with `store` when given) on CPU,
// NCCL on a CUDA device.
absl::StatusOr<c10::intrusive_ptr<CommGroup>> CreateDeviceGroup(
    const RendezvousOptions& options, c10::intrusive_ptr<c10d::Store> store, torch::Device device);

// The interface that holds `address` on this host ("" when none does).
std::string InterfaceOf(const std::string& address);

// Whether `group` sums bf16/fp16 tensors itself (NCCL; Gloo from LibTorch
// 2.x). Elsewhere the helpers send them as fp32.
bool ReducesNarrowFloats(const CommGroup& group);
// Whether `group` has a reduce-scatter (NCCL; Gloo from LibTorch 2.x).
bool HasReduceScatter(const CommGroup& group);

// In-place SUM all-reduce of a tensor on the group's device type; bf16/fp16
// go through fp32 where the group cannot sum them.
absl::Status AllReduceSum(CommGroup& group, torch::Tensor& tensor);

// SUM reduce-scatter along dim 0: `input` [P·n, ...] on every one of the P
// ranks; rank r gets the sum of every rank's rows [r·n, (r+1)·n). The real
// collective where the group has one, else all_reduce + slice.
absl::StatusOr<torch::Tensor> ReduceScatterSum(CommGroup& group, const torch::Tensor& input);

// Broadcast from `root` in place (contiguous tensor).
absl::Status Broadcast(CommGroup& group, torch::Tensor& tensor, int root);

// All-to-all of rows: `input` [sum(send_rows), ...] goes out in consecutive
// blocks, send_rows[p] rows to rank p; the result holds recv_rows[p] rows
// from each rank p in rank order (every rank's send_rows[q] must equal rank
// q's recv_rows[this rank]). Any row count may be 0; bf16/fp16 travel as
// their bytes.
absl::StatusOr<torch::Tensor> AllToAllRows(CommGroup& group, const torch::Tensor& input,
                                           const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TORCH_PROCESS_GROUP_H_
