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
// Gloo in this LibTorch has no reduce_scatter and no bf16 all-reduce; the
// helpers here provide the fallbacks (all_reduce + slice, fp32 round trip).
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
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
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

// In-place SUM all-reduce of a CPU tensor; bf16/fp16 go through fp32.
absl::Status AllReduceSum(CommGroup& group, torch::Tensor& tensor);

// Broadcast from `root` in place (contiguous CPU tensor).
absl::Status Broadcast(CommGroup& group, torch::Tensor& tensor, int root);

// All-to-all of rows: `input` [sum(send_rows), ...] goes out in consecutive
// blocks, send_rows[p] rows to rank p; the result holds recv_rows[p] rows
// from each rank p in rank order (every rank's send_rows[q] must equal rank
// q's recv_rows[this rank]). Any row count may be 0; bf16/fp16 travel as fp32.
absl::StatusOr<torch::Tensor> AllToAllRows(CommGroup& group, const torch::Tensor& input,
                                           const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TORCH_PROCESS_GROUP_H_
