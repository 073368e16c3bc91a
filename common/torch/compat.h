// What differs between the LibTorch versions SpecStream builds against
// (cmake/TorchCompat.cmake checks which at configure time): 1.13 and 2.x.
//
// CommGroup is the c10d object that runs collectives: in 1.13 a
// ProcessGroupGloo *is* a c10d::ProcessGroup; in 2.x it (and
// ProcessGroupNCCL) is a c10d::Backend, and c10d::ProcessGroup is a
// dispatcher-facing wrapper we do not need. Both have the same collective
// calls (allreduce, broadcast, allgather, alltoall_base, send, recv,
// barrier, getRank, getSize), so code written against CommGroup serves both.
#ifndef SPECSTREAM_COMMON_TORCH_COMPAT_H_
#define SPECSTREAM_COMMON_TORCH_COMPAT_H_

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define SPECSTREAM_TORCH_2 1
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#define SPECSTREAM_TORCH_2 0
#endif

namespace specstream {

#if SPECSTREAM_TORCH_2
using CommGroup = c10d::Backend;
#else
using CommGroup = c10d::ProcessGroup;
#endif

// Batched point-to-point: sends and receives issued between StartCoalescing
// and EndCoalescing go out as one group call, and the returned work waits
// for all of them. NCCL needs it for a ring exchange (batch_isend_irecv in
// Python); Gloo's send and recv are asynchronous without it. NCCL process
// groups exist only in 2.x builds (cmake/TorchCompat.cmake), so 1.13 never
// batches.
#if SPECSTREAM_TORCH_2
inline bool CoalescesPointToPoint(const CommGroup& group) {
  return group.getBackendName() == "nccl";
}
inline void StartCoalescing(CommGroup& group) { group.startCoalescing(); }
inline c10::intrusive_ptr<c10d::Work> EndCoalescing(CommGroup& group) {
  return group.endCoalescing();
}
#else
inline bool CoalescesPointToPoint(const CommGroup&) { return false; }
inline void StartCoalescing(CommGroup&) {}
inline c10::intrusive_ptr<c10d::Work> EndCoalescing(CommGroup&) { return {}; }
#endif

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TORCH_COMPAT_H_
