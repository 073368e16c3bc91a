#include "common/torch/process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream {

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> CreateTcpStore(const RendezvousOptions& options,
                                                               int* bound_port) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " must be in [0, ", options.world_size, ")"));
  }
  c10::intrusive_ptr<c10d::TCPStore> store;
  absl::Status status =
      CatchTorch(absl::StrCat("TCPStore ", options.master_addr, ":", options.master_port), [&] {
        c10d::TCPStoreOptions store_options;
        store_options.port = static_cast<uint16_t>(options.master_port);
        store_options.isServer = options.rank == 0;
        store_options.numWorkers = options.world_size;
        store_options.waitWorkers = false;
        store_options.timeout = options.timeout;
        store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
      });
  if (!status.ok()) return absl::UnavailableError(status.message());
  if (bound_port != nullptr) *bound_port = store->getPort();
  return c10::intrusive_ptr<c10d::Store>(store);
}

absl::StatusOr<ProcessGroupHandle> CreateGlooGroup(const RendezvousOptions& options,
                                                   c10::intrusive_ptr<c10d::Store> store) {
  ProcessGroupHandle handle;
  if (!store) {
    auto created = CreateTcpStore(options, &handle.port);
    if (!created.ok()) return created.status();
    store = *created;
  }
  handle.store = store;
  absl::Status status = CatchTorch(absl::StrCat("Gloo group rank ", options.rank), [&] {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create();
    gloo_options->timeout = options.timeout;
    gloo_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options.master_addr));
    handle.group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank,
                                                               options.world_size, gloo_options);
  });
  if (!status.ok()) return absl::UnavailableError(status.message());
  return handle;
}

absl::Status AllReduceSum(c10d::ProcessGroup& group, torch::Tensor& tensor) {
  return CatchTorch("all_reduce", [&] {
    const bool narrow =
        tensor.scalar_type() == torch::kBFloat16 || tensor.scalar_type() == torch::kFloat16;
    std::vector<torch::Tensor> buffers{narrow ? tensor.to(torch::kFloat32) : tensor.contiguous()};
    group.allreduce(buffers)->wait();
    if (narrow || !tensor.is_contiguous()) {
      tensor.copy_(buffers[0]);
    } else if (buffers[0].data_ptr() != tensor.data_ptr()) {
      tensor.copy_(buffers[0]);
    }
  });
}

absl::Status Broadcast(c10d::ProcessGroup& group, torch::Tensor& tensor, int root) {
  return CatchTorch("broadcast", [&] {
    std::vector<torch::Tensor> buffers{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group.broadcast(buffers, options)->wait();
  });
}

absl::StatusOr<torch::Tensor> AllToAllRows(c10d::ProcessGroup& group, const torch::Tensor& input,
                                           const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows) {
  torch::Tensor output;
  RETURN_IF_ERROR(CatchTorch("all_to_all", [&] {
    const bool narrow =
        input.scalar_type() == torch::kBFloat16 || input.scalar_type() == torch::kFloat16;
    torch::Tensor send = narrow ? input.to(torch::kFloat32) : input.contiguous();
    int64_t rows = 0;
    for (int64_t r : recv_rows) rows += r;
    std::vector<int64_t> shape = send.sizes().vec();
    shape[0] = rows;
    torch::Tensor receive = torch::empty(shape, send.options());
    std::vector<int64_t> out_splits = recv_rows, in_splits = send_rows;
    group.alltoall_base(receive, send, out_splits, in_splits)->wait();
    output = narrow ? receive.to(input.scalar_type()) : receive;
  }));
  return output;
}

}  // namespace specstream
