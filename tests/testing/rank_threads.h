// Multi-rank tests in one process: each rank is a thread with its own Gloo
// process group over one TCPStore on a free loopback port.
#ifndef SPECSTREAM_TESTS_TESTING_RANK_THREADS_H_
#define SPECSTREAM_TESTS_TESTING_RANK_THREADS_H_

#include <functional>

#include "absl/status/status.h"
#include "common/torch/process_group.h"

namespace specstream::testing {

// Runs fn(rank, group) on `world` threads and joins them. A non-OK status or
// an exception on a rank is that rank's failure; the first one is returned.
absl::Status RunOnRankThreads(
    int world,
    const std::function<absl::Status(int rank, c10::intrusive_ptr<CommGroup> group)>& fn);

// The same, handing each rank its whole handle (group and rendezvous store,
// e.g. to create sub-groups).
absl::Status RunOnRankHandles(
    int world, const std::function<absl::Status(int rank, const ProcessGroupHandle& handle)>& fn);

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_RANK_THREADS_H_
