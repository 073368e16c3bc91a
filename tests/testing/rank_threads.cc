#include "tests/testing/rank_threads.h"

#include <string>
#include <thread>
#include <vector>

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
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace specstream::testing
