// CreateNcclGroup for CUDA LibTorch builds (SPECSTREAM_WITH_TORCH_NCCL=1;
// common/torch/CMakeLists.txt compiles this file only then, with
// USE_C10D_NCCL, which c10d's ProcessGroupNCCL.hpp is guarded by).
#include <cstdlib>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "absl/strings/str_cat.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"

namespace specstream {

absl::StatusOr<c10::intrusive_ptr<CommGroup>> CreateNcclGroup(const RendezvousOptions& options,
                                                              c10::intrusive_ptr<c10d::Store> store,
                                                              torch::Device device) {
  if (!device.is_cuda() || !device.has_index()) {
    return absl::FailedPreconditionError(
        absl::StrCat("an NCCL process group needs a CUDA device cuda:N, got ", device.str()));
  }
  if (!store) return absl::InvalidArgumentError("an NCCL process group needs the rendezvous store");
  ASSIGN_OR_RETURN(const std::string local, ResolveLocalAddress(options));
  // NCCL's bootstrap and socket transport bind the interface holding this
  // rank's address, as Gloo does, unless the user chose one.
  if (std::getenv("NCCL_SOCKET_IFNAME") == nullptr) {
    const std::string interface = InterfaceOf(local);
    if (!interface.empty()) setenv("NCCL_SOCKET_IFNAME", ("=" + interface).c_str(), 1);
  }
  RETURN_IF_ERROR(JoinRendezvous(*store, options, local));
  c10::intrusive_ptr<CommGroup> group;
  RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("NCCL group rank ", options.rank, " of ", options.world_size, " on ",
                              LocalHostname(), " (", device.str(), ")"),
                 [&] {
                   c10::cuda::set_device(device.index());
                   auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
                   nccl_options->timeout = options.timeout;
                   auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
                       store, options.rank, options.world_size, nccl_options);
                   // Bound to the device and connected now (a collective over every
                   // rank, all of which have joined), so a broken link fails here.
                   nccl->setBoundDeviceId(device);
                   nccl->eagerConnectSingleDevice(device);
                   group = nccl;
                 }));
  SS_LOG_INFO("NCCL group: rank {}/{} on {} via {}", options.rank, options.world_size, device.str(),
              local);
  return group;
}

}  // namespace specstream
