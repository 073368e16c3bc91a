#include "tests/testing/tp_forward.h"

#include "teacher/tp_launcher.h"
#include "tests/testing/rank_threads.h"

namespace specstream::testing {

absl::StatusOr<std::vector<teacher::SequenceCapture>> ForwardOnRankThreads(
    const std::string& runtime, teacher::TargetRuntimeOptions options, int tp_size,
    const teacher::ForwardRequest& request) {
  absl::StatusOr<std::vector<teacher::SequenceCapture>> got = absl::UnknownError("not run");
  absl::Status status =
      RunOnRankThreads(tp_size, [&](int rank, c10::intrusive_ptr<CommGroup> group) -> absl::Status {
        teacher::TargetRuntimeOptions mine = options;
        mine.tp_rank = rank;
        mine.tp_size = tp_size;
        mine.group = group;
        auto loaded = teacher::CreateTargetRuntime(runtime, mine);
        if (!loaded.ok()) return loaded.status();
        if (rank != 0) return (*loaded)->RunFollower();
        got = (*loaded)->Forward(request);
        absl::Status stopped = (*loaded)->StopFollowers();
        return got.ok() ? stopped : got.status();
      });
  if (!status.ok()) return status;
  return got;
}

}  // namespace specstream::testing
