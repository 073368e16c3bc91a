// Tensor- (and expert-) parallel target runtimes in one test process: one
// thread per TP rank over rank_threads.h's Gloo groups.
#ifndef SPECSTREAM_TESTS_TESTING_TP_FORWARD_H_
#define SPECSTREAM_TESTS_TESTING_TP_FORWARD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "teacher/tp_runtime.h"

namespace specstream::testing {

// Loads runtime `runtime` ("hf" | "sglang") from `options` on `tp_size` rank
// threads (options.tp_rank, tp_size and group are set per rank; ep_size is
// kept), runs `request` with rank 0 as the leader and the others following,
// stops the followers, and returns rank 0's captures. The first failure of
// any rank is the result.
absl::StatusOr<std::vector<teacher::SequenceCapture>> ForwardOnRankThreads(
    const std::string& runtime, teacher::TargetRuntimeOptions options, int tp_size,
    const teacher::ForwardRequest& request);

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_TP_FORWARD_H_
