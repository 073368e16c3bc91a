// DDP's gradient sums (student/grad_reducer.h) on Gloo rank threads: every
// rank ends with the sum of all ranks' gradients, whatever the bucketing, a
// parameter without a gradient this step contributes zeros, and rank 0's
// parameters reach every rank.
#include "student/grad_reducer.h"

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/testing/rank_threads.h"

namespace specstream::student {
namespace {

// Three parameters of 5, 7 and 3 elements, each rank's values its own.
GradReducer::NamedParams RankParams(int rank) {
  GradReducer::NamedParams params;
  const std::vector<int64_t> sizes = {5, 7, 3};
  for (size_t i = 0; i < sizes.size(); ++i) {
    torch::Tensor p = torch::arange(sizes[i], torch::kFloat32) + 10.0 * i + 100.0 * rank;
    params.emplace_back("p" + std::to_string(i), p.requires_grad_(true));
  }
  return params;
}

// The loss on `rank`: sum((rank + 1) * p0 * p0) + sum((i + 2) * p1);
// p2 takes part on rank 0 only (rank 1 has no gradient for it).
torch::Tensor Loss(const GradReducer::NamedParams& params, int rank) {
  torch::Tensor loss = (rank + 1.0) * (params[0].second * params[0].second).sum();
  loss = loss + (params[1].second * (torch::arange(7, torch::kFloat32) + 2)).sum();
  if (rank == 0) loss = loss + params[2].second.sum() * 3;
  return loss;
}

TEST(GradReducerTest, EveryRankGetsTheSumOfTheRanksGradientsWhateverTheBuckets) {
  for (int64_t bucket_elements : {1, 4, 6, 1000}) {
    SCOPED_TRACE(bucket_elements);
    std::vector<GradReducer::NamedParams> after(2);
    std::vector<int64_t> buckets(2);
    absl::Status status = testing::RunOnRankThreads(
        2, [&](int rank, c10::intrusive_ptr<CommGroup> group) -> absl::Status {
          GradReducer::NamedParams params = RankParams(rank);
          GradReducer reducer(params, group, bucket_elements, torch::kCPU);
          for (int step = 0; step < 2; ++step) {  // the buckets are reused
            for (auto& [name, p] : params) p.mutable_grad() = torch::Tensor();
            reducer.Prepare();
            Loss(params, rank).backward();
            if (absl::Status s = reducer.Finish(); !s.ok()) return s;
          }
          after[rank] = params;
          buckets[rank] = reducer.num_buckets();
          return absl::OkStatus();
        });
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(buckets[0], buckets[1]);
    if (bucket_elements == 1) EXPECT_EQ(buckets[0], 3);  // one per parameter at least
    if (bucket_elements == 1000) EXPECT_EQ(buckets[0], 1);
    // d/dp0: 2 (r + 1) p0 on each rank, summed; d/dp1: i + 2 on each; d/dp2:
    // 3 from rank 0, zeros from rank 1.
    torch::Tensor p0_rank0 = RankParams(0)[0].second.detach(),
                  p0_rank1 = RankParams(1)[0].second.detach();
    const torch::Tensor g0 = 2 * p0_rank0 + 4 * p0_rank1;
    const torch::Tensor g1 = 2 * (torch::arange(7, torch::kFloat32) + 2);
    const torch::Tensor g2 = torch::full({3}, 3.0);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(torch::allclose(after[rank][0].second.grad(), g0)) << rank;
      EXPECT_TRUE(torch::allclose(after[rank][1].second.grad(), g1)) << rank;
      ASSERT_TRUE(after[rank][2].second.grad().defined()) << rank;
      EXPECT_TRUE(torch::allclose(after[rank][2].second.grad(), g2)) << rank;
    }
  }
}

TEST(GradReducerTest, BroadcastGivesEveryRankRankZerosParameters) {
  std::vector<GradReducer::NamedParams> after(2);
  absl::Status status = testing::RunOnRankThreads(
      2, [&](int rank, c10::intrusive_ptr<CommGroup> group) -> absl::Status {
        GradReducer::NamedParams params = RankParams(rank);
        GradReducer reducer(params, group, 6, torch::kCPU);
        if (absl::Status s = reducer.BroadcastParameters(0); !s.ok()) return s;
        after[rank] = params;
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  const GradReducer::NamedParams rank0 = RankParams(0);
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < rank0.size(); ++i) {
      EXPECT_TRUE(torch::equal(after[rank][i].second, rank0[i].second)) << rank << " p" << i;
    }
  }
}

// Without a group (one rank) the gradients are left as backward made them.
TEST(GradReducerTest, WithoutAGroupNothingChanges) {
  GradReducer::NamedParams params = RankParams(1);
  GradReducer reducer(params, c10::intrusive_ptr<CommGroup>(), 4, torch::kCPU);
  reducer.Prepare();
  Loss(params, 1).backward();
  ASSERT_TRUE(reducer.Finish().ok());
  EXPECT_TRUE(torch::allclose(params[0].second.grad(), 4 * RankParams(1)[0].second.detach()));
  EXPECT_FALSE(params[2].second.grad().defined());
  EXPECT_TRUE(reducer.BroadcastParameters().ok());
}

}  // namespace
}  // namespace specstream::student
