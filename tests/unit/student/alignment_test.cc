// The EAGLE-3 alignment contract (student/eagle3_alignment.h) against masks
// computed by hand from shared/DESIGN.md §3: (t, k) counts iff t+k+1 < len,
// loss_mask[t+k] = 1 and the teacher argmax at t+k+1 is in the draft vocab.
// Every expected row below was written out position by position, not
// computed by the rule, so an off-by-one in any of the three shifts fails.
#include "student/eagle3_alignment.h"

#include <vector>

#include "gtest/gtest.h"

namespace specstream::student {
namespace {

torch::Tensor Row(const std::vector<int64_t>& values) {
  return torch::tensor(values, torch::kInt64).unsqueeze(0);
}

std::vector<int64_t> ToVector(const torch::Tensor& t) {
  torch::Tensor flat = t.to(torch::kInt64).contiguous().view({-1});
  return {flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()};
}

// Two samples padded to 10 positions:
//   sample 0, length 10: a 2-token prompt (mask 0), a masked-out gap at
//     position 5, and a teacher argmax outside the draft vocab at 8;
//   sample 1, length 6: every position masked in, padding after.
struct Batch {
  torch::Tensor lengths = torch::tensor({10, 6}, torch::kInt64);
  torch::Tensor loss_mask = torch::cat({Row({0, 0, 1, 1, 1, 0, 1, 1, 1, 1}),  //
                                        Row({1, 1, 1, 1, 1, 1, 0, 0, 0, 0})})
                                .to(torch::kUInt8);
  torch::Tensor in_vocab = torch::cat({Row({1, 1, 1, 1, 1, 1, 1, 1, 0, 1}),  //
                                       Row({1, 1, 1, 1, 1, 1, 1, 1, 1, 1})})
                               .to(torch::kBool);
};

// By hand, k = 0 .. 6 (sample 0 then sample 1):
const std::vector<std::vector<int64_t>> kSample0 = {
    {0, 0, 1, 1, 1, 0, 1, 0, 1, 0},  // k=0: t<=8, mask[t], vocab[t+1] (t=7 -> 8 out)
    {0, 1, 1, 1, 0, 1, 0, 1, 0, 0},  // k=1: t<=7, mask[t+1], vocab[t+2] (t=6 out)
    {1, 1, 1, 0, 1, 0, 1, 0, 0, 0},  // k=2: t<=6, mask[t+2] (t=3 out), vocab[t+3] (t=5)
    {1, 1, 0, 1, 0, 1, 0, 0, 0, 0},  // k=3: t<=5, mask[t+3] (t=2 out), vocab[t+4] (t=4)
    {1, 0, 1, 0, 1, 0, 0, 0, 0, 0},  // k=4: t<=4, mask[t+4] (t=1 out), vocab[t+5] (t=3)
    {0, 1, 0, 1, 0, 0, 0, 0, 0, 0},  // k=5: t<=3, mask[t+5] (t=0 out), vocab[t+6] (t=2)
    {1, 0, 1, 0, 0, 0, 0, 0, 0, 0},  // k=6: t<=2, mask[t+6] all in, vocab[t+7] (t=1)
};
const std::vector<std::vector<int64_t>> kSample1 = {
    {1, 1, 1, 1, 1, 0, 0, 0, 0, 0},  // k=0: t+1 < 6
    {1, 1, 1, 1, 0, 0, 0, 0, 0, 0},  // k=1
    {1, 1, 1, 0, 0, 0, 0, 0, 0, 0},  // k=2
    {1, 1, 0, 0, 0, 0, 0, 0, 0, 0},  // k=3
    {1, 0, 0, 0, 0, 0, 0, 0, 0, 0},  // k=4
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0},  // k=5: past the end
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0},  // k=6
};

TEST(AheadTest, ShiftsAlongTheSequenceAndZeroPadsPastTheEnd) {
  const torch::Tensor x = Row({1, 2, 3, 4, 5});
  EXPECT_EQ(ToVector(Ahead(x, 0, 5)), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(ToVector(Ahead(x, 2, 3)), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(ToVector(Ahead(x, 2, 4)), (std::vector<int64_t>{3, 4, 5, 0}));
  EXPECT_EQ(ToVector(Ahead(x, 1, 2)), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ToVector(Ahead(x, 5, 3)), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(ToVector(Ahead(x, 7, 2)), (std::vector<int64_t>{0, 0}));
  // Trailing dimensions come along: [1, 3, 2] -> rows 1.. of each feature pair.
  const torch::Tensor features = torch::arange(6, torch::kInt64).view({1, 3, 2});
  const torch::Tensor ahead = Ahead(features, 1, 3);
  EXPECT_EQ(ahead.sizes(), (std::vector<int64_t>{1, 3, 2}));
  EXPECT_EQ(ToVector(ahead), (std::vector<int64_t>{2, 3, 4, 5, 0, 0}));
  EXPECT_EQ(Ahead(features.to(torch::kBool), 1, 3).scalar_type(), torch::kBool);
}

TEST(Eagle3AlignmentTest, ValidMasksMatchHandComputedPositionsForKOf1And3And7) {
  const Batch b;
  for (int ttt_steps : {1, 3, 7}) {
    for (int k = 0; k < ttt_steps; ++k) {
      const torch::Tensor mask = Eagle3ValidMask(b.lengths, 0, b.loss_mask, b.in_vocab, k, 10);
      ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{2, 10}));
      EXPECT_EQ(mask.scalar_type(), torch::kBool);
      EXPECT_EQ(ToVector(mask[0]), kSample0[k]) << "sample 0, K " << ttt_steps << ", k " << k;
      EXPECT_EQ(ToVector(mask[1]), kSample1[k]) << "sample 1, K " << ttt_steps << ", k " << k;
    }
  }
}

TEST(Eagle3AlignmentTest, CountsAreTheHandComputedTotalsPerStep) {
  const Batch b;
  // Sample 0: 5 5 5 4 3 2 2; sample 1: 5 4 3 2 1 0 0.
  EXPECT_EQ(ToVector(Eagle3ValidCounts(b.lengths, 0, b.loss_mask, b.in_vocab, 1, 10)),
            (std::vector<int64_t>{10}));
  EXPECT_EQ(ToVector(Eagle3ValidCounts(b.lengths, 0, b.loss_mask, b.in_vocab, 3, 10)),
            (std::vector<int64_t>{10, 9, 8}));
  EXPECT_EQ(ToVector(Eagle3ValidCounts(b.lengths, 0, b.loss_mask, b.in_vocab, 7, 10)),
            (std::vector<int64_t>{10, 9, 8, 6, 4, 2, 2}));
}

// A context-parallel shard sees the same positions as the whole sequence:
// positions [offset, offset + 5) with a halo of the next 3 rows where the
// data has them (the last shard's halo runs past the data: nothing there).
TEST(Eagle3AlignmentTest, ShardsWithAHaloSeeTheWholeSequencesPositions) {
  const Batch b;
  const torch::Tensor first_mask = b.loss_mask.narrow(1, 0, 8);
  const torch::Tensor first_vocab = b.in_vocab.narrow(1, 0, 8);
  const torch::Tensor last_mask = b.loss_mask.narrow(1, 5, 5);
  const torch::Tensor last_vocab = b.in_vocab.narrow(1, 5, 5);
  for (int k = 0; k < 3; ++k) {
    const torch::Tensor first = Eagle3ValidMask(b.lengths, 0, first_mask, first_vocab, k, 5);
    const torch::Tensor last = Eagle3ValidMask(b.lengths, 5, last_mask, last_vocab, k, 5);
    for (int s = 0; s < 2; ++s) {
      const std::vector<int64_t>& whole = (s == 0 ? kSample0 : kSample1)[k];
      EXPECT_EQ(ToVector(first[s]), std::vector<int64_t>(whole.begin(), whole.begin() + 5))
          << "first shard, sample " << s << ", k " << k;
      EXPECT_EQ(ToVector(last[s]), std::vector<int64_t>(whole.begin() + 5, whole.end()))
          << "last shard, sample " << s << ", k " << k;
    }
  }
  // Shard 0 of sample 0 at k = 2 by hand: t = 4 needs mask[6] and vocab[7],
  // both in the halo.
  EXPECT_EQ(ToVector(Eagle3ValidMask(b.lengths, 0, first_mask, first_vocab, 2, 5)[0]),
            (std::vector<int64_t>{1, 1, 1, 0, 1}));
  // Without the halo the same shard loses what lies past its rows.
  EXPECT_EQ(ToVector(Eagle3ValidMask(b.lengths, 0, b.loss_mask.narrow(1, 0, 5),
                                     b.in_vocab.narrow(1, 0, 5), 2, 5)[0]),
            (std::vector<int64_t>{1, 1, 0, 0, 0}));
}

}  // namespace
}  // namespace specstream::student
