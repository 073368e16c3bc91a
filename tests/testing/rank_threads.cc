#include "tests/testing/rank_threads.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/torch/process_group.h"

namespace specstream::testing {

absl::Status RunOnRankThreads(
    int world, const std::function<absl::Status(int, c10::intrusive_ptr<CommGroup>)>& fn) {
  return RunOnRankHandles(
      world, [&](int rank, const ProcessGroupHandle& handle) { return fn(rank, handle.group); });
}

absl::Status RunOnRankHandles(
    int world, const std::function<absl::Status(int, const ProcessGroupHandle&)>& fn) {
  RendezvousOptions rendezvous;
  rendezvous.world_size = world;
  rendezvous.timeout = std::chrono::seconds(60);
  int port = 0;
  auto store = CreateTcpStore(rendezvous, &port);
  if (!store.ok()) return store.status();
  std::vector<absl::Status> statuses(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      RendezvousOptions r = rendezvous;
      r.rank = rank;
      r.master_port = port;
      auto group = rank == 0 ? CreateGlooGroup(r, *store) : CreateGlooGroup(r);
      if (!group.ok()) {
        statuses[rank] = group.status();
        return;
      }
      try {
        statuses[rank] = fn(rank, *group);
      } catch (const std::exception& e) {
        statuses[rank] = absl::InternalError("rank " + std::to_string(rank) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every failing rank is named: the first failure is often a consequence.
  std::string failures;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (int rank = 0; rank < world; ++rank) {
    if (statuses[rank].ok()) continue;
    if (code == absl::StatusCode::kOk) code = statuses[rank].code();
    absl::StrAppend(&failures, failures.empty() ? "" : "; ", "rank ", rank, ": ",
                    statuses[rank].message());
  }
  return code == absl::StatusCode::kOk ? absl::OkStatus() : absl::Status(code, failures);
}

}  // namespace specstream::testing
