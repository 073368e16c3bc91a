// The trainer's data order (student/epoch_plan.h): batches of a sampler
// order, token-budget packing, the same number of steps on every DP rank and
// in every epoch, and refusals.
#include "student/epoch_plan.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace specstream::student {
namespace {

EpochPlan Make(const EpochPlanOptions& options, const std::vector<int64_t>& lengths) {
  absl::StatusOr<EpochPlan> plan = EpochPlan::Create(options, lengths);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

TEST(EpochPlanTest, BatchSizeCutsTheSamplerOrderOfEachEpoch) {
  EpochPlanOptions options;
  options.seed = 42;
  options.batch_size = 4;
  EpochPlan plan = Make(options, std::vector<int64_t>(10, 5));
  // 10 samples in batches of 4: 4, 4 and 2.
  EXPECT_EQ(plan.steps_per_epoch(), 3);
  EXPECT_EQ(plan.largest_batch(), 4);
  SamplerOptions sampler;
  sampler.seed = 42;
  const std::vector<int64_t> order0 = (*DistributedSampler::Create(10, sampler))->Indices(0);
  const std::vector<int64_t> order1 = (*DistributedSampler::Create(10, sampler))->Indices(1);
  EXPECT_EQ(plan.Batch(0), std::vector<int64_t>(order0.begin(), order0.begin() + 4));
  EXPECT_EQ(plan.Batch(2), std::vector<int64_t>(order0.begin() + 8, order0.end()));
  // Step 3 is the first of epoch 1; asking for epoch 0 again afterwards
  // gives the same batches.
  EXPECT_EQ(plan.Batch(3), std::vector<int64_t>(order1.begin(), order1.begin() + 4));
  EXPECT_EQ(plan.Batch(1), std::vector<int64_t>(order0.begin() + 4, order0.begin() + 8));
  const std::vector<int64_t> order2 = (*DistributedSampler::Create(10, sampler))->Indices(2);
  EXPECT_EQ(plan.Batch(7), std::vector<int64_t>(order2.begin() + 4, order2.begin() + 8));
}

TEST(EpochPlanTest, TokenBudgetsPackBySortedLengthAndStayWithinTheBudget) {
  // Lengths 1..9 plus a 30-token sample longer than the budget.
  const std::vector<int64_t> lengths = {9, 1, 30, 5, 3, 7, 2, 8, 4, 6};
  EpochPlanOptions options;
  options.batch_tokens = 12;
  EpochPlan plan = Make(options, lengths);
  std::multiset<int64_t> seen;
  for (int64_t step = 0; step < plan.steps_per_epoch(); ++step) {
    const std::vector<int64_t> batch = plan.Batch(step);
    ASSERT_FALSE(batch.empty());
    int64_t longest = 0;
    for (int64_t i : batch) longest = std::max(longest, lengths[i]);
    // Within the budget, or one sample alone that exceeds it.
    EXPECT_TRUE(static_cast<int64_t>(batch.size()) * longest <= 12 || batch.size() == 1)
        << "step " << step;
    seen.insert(batch.begin(), batch.end());
  }
  // Packed by length: [1,2,3] (9), [4,5] (10), [6] , [7], [8], [9], [30].
  EXPECT_EQ(plan.steps_per_epoch(), 7);
  EXPECT_EQ(plan.largest_batch(), 3);
  EXPECT_EQ(seen.size(), lengths.size());
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), lengths.size());
}

TEST(EpochPlanTest, MaxLengthTruncatesBeforePacking) {
  EpochPlanOptions options;
  options.batch_tokens = 8;
  options.max_length = 4;
  // Truncated to 4 tokens each, two samples fill a budget of 8.
  EpochPlan plan = Make(options, {100, 100, 100, 100});
  EXPECT_EQ(plan.steps_per_epoch(), 2);
  EXPECT_EQ(plan.largest_batch(), 2);
}

TEST(EpochPlanTest, EveryDpRankHasTheSameStepsInEveryEpochAndTheRanksCoverTheData) {
  const std::vector<int64_t> lengths = {3, 9, 4, 4, 12, 1, 7, 7, 2, 5, 6};
  for (bool tokens : {false, true}) {
    EpochPlanOptions options;
    options.seed = 3;
    options.dp_size = 3;
    if (tokens) {
      options.batch_tokens = 14;
    } else {
      options.batch_size = 2;
    }
    std::vector<EpochPlan> ranks;
    for (int r = 0; r < 3; ++r) {
      options.dp_rank = r;
      ranks.push_back(Make(options, lengths));
    }
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::set<int64_t> covered;
      for (EpochPlan& plan : ranks) {
        EXPECT_EQ(plan.steps_per_epoch(), ranks[0].steps_per_epoch());
        for (int64_t s = 0; s < plan.steps_per_epoch(); ++s) {
          for (int64_t i : plan.Batch(epoch * plan.steps_per_epoch() + s)) covered.insert(i);
        }
      }
      EXPECT_EQ(covered.size(), lengths.size())
          << (tokens ? "tokens" : "samples") << " epoch " << epoch;
    }
  }
}

TEST(EpochPlanTest, RefusesPlansItCannotMake) {
  EpochPlanOptions neither;
  absl::StatusOr<EpochPlan> plan = EpochPlan::Create(neither, {1, 2});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("batch_size"), std::string::npos) << plan.status();

  EpochPlanOptions both;
  both.batch_size = 1;
  both.batch_tokens = 8;
  EXPECT_EQ(EpochPlan::Create(both, {1, 2}).status().code(), absl::StatusCode::kInvalidArgument);

  // No samples, or a rank outside the group.
  EpochPlanOptions one;
  one.batch_size = 1;
  EXPECT_FALSE(EpochPlan::Create(one, {}).ok());
  one.dp_size = 2;
  one.dp_rank = 2;
  EXPECT_EQ(EpochPlan::Create(one, {1, 2}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specstream::student
