// The MoE block's pieces on random weights: routing as transformers defines
// it, grouped execution and the expert-parallel all-to-all against a
// token-by-token loop, on layouts with EP 2 and 4 and MoE-TP slices.
#include "teacher/moe.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/rank_threads.h"

namespace specstream::teacher::moe {
namespace {

constexpr int64_t kHidden = 16, kInter = 12, kExperts = 8, kTopK = 2;

double RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1.0);
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>() / scale;
}

// Every expert in full (gate, up [I, H], down [H, I]) and a router.
struct FullMoe {
  std::vector<torch::Tensor> gate, up, down;
  torch::Tensor router;
};

FullMoe RandomMoe(uint64_t seed) {
  torch::manual_seed(seed);
  FullMoe m;
  for (int64_t e = 0; e < kExperts; ++e) {
    m.gate.push_back(torch::randn({kInter, kHidden}) / 4);
    m.up.push_back(torch::randn({kInter, kHidden}) / 4);
    m.down.push_back(torch::randn({kHidden, kInter}) / 4);
  }
  m.router = torch::randn({kExperts, kHidden});
  return m;
}

// What rank `rank` of `layout` holds, sliced as model_weights.cc slices it.
Experts Slice(const FullMoe& m, const ParallelLayout& layout) {
  const int64_t local = kExperts / layout.ep_size;
  const int64_t part = kInter / layout.moe_tp_size(), at = layout.moe_tp_rank() * part;
  MoeLayerWeights w;
  w.first_expert = layout.ep_rank() * local;
  for (int64_t e = w.first_expert; e < w.first_expert + local; ++e) {
    w.gate.push_back(m.gate[e].narrow(0, at, part).contiguous());
    w.up.push_back(m.up[e].narrow(0, at, part).contiguous());
    w.down.push_back(m.down[e].narrow(1, at, part).contiguous());
  }
  return FuseExperts(w);
}

TEST(MoeTest, RoutingIsSoftmaxTopKRenormalised) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({5, kHidden});
  const torch::Tensor router = torch::randn({kExperts, kHidden});
  const Routing plain = Route(x, router, kTopK, /*renormalize=*/false);
  const Routing norm = Route(x, router, kTopK, /*renormalize=*/true);
  const torch::Tensor probs = torch::softmax(torch::matmul(x, router.t()), -1);
  for (int64_t t = 0; t < 5; ++t) {
    const auto order = probs[t].argsort(0, /*descending=*/true);
    for (int64_t k = 0; k < kTopK; ++k) {
      EXPECT_EQ(plain.experts[t][k].item<int64_t>(), order[k].item<int64_t>());
      EXPECT_NEAR(plain.weights[t][k].item<float>(), probs[t][order[k]].item<float>(), 1e-6);
    }
    EXPECT_NEAR(norm.weights[t].sum().item<float>(), 1.0, 1e-6);
    EXPECT_NEAR((norm.weights[t][0] / norm.weights[t][1]).item<float>(),
                (plain.weights[t][0] / plain.weights[t][1]).item<float>(), 1e-5);
  }
}

TEST(MoeTest, GroupedEqualsPerTokenLoop) {
  const FullMoe m = RandomMoe(1);
  const Experts all = Slice(m, ParallelLayout{});
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({37, kHidden});
  const Routing routing = Route(x, m.router, kTopK, true);
  // The random router spreads the tokens over every expert.
  EXPECT_EQ(std::get<0>(torch::_unique(routing.experts)).numel(), kExperts);
  const torch::Tensor want = PerTokenLoop(x, routing, all);
  const double diff = RelDiff(CombineLocal(x, routing, all), want);
  EXPECT_LE(diff, 1e-6);
  std::cout << "[ grouped vs per-token loop ] max relative difference " << diff << "\n";
  // And the loop is what it claims: token 0's first expert by hand.
  const int64_t e = routing.experts[0][0].item<int64_t>();
  const torch::Tensor x0 = x[0];
  const torch::Tensor y0 = torch::matmul(
      m.down[e], torch::silu(torch::matmul(m.gate[e], x0)) * torch::matmul(m.up[e], x0));
  const int64_t e1 = routing.experts[0][1].item<int64_t>();
  const torch::Tensor y1 = torch::matmul(
      m.down[e1], torch::silu(torch::matmul(m.gate[e1], x0)) * torch::matmul(m.up[e1], x0));
  EXPECT_LE(RelDiff(want[0], routing.weights[0][0] * y0 + routing.weights[0][1] * y1), 1e-6);
}

// Every rank routes its chunk and dispatches; summing the ranks' outputs
// placed at their chunks gives the single-rank result.
void ExpectDispatchMatches(int tp, int ep, int64_t tokens, torch::Dtype dtype, double tolerance) {
  const FullMoe m = RandomMoe(4);
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({tokens, kHidden}).to(dtype);
  const Experts all = Slice(m, ParallelLayout{});
  const torch::Tensor want =
      PerTokenLoop(x.to(torch::kFloat32), Route(x, m.router.to(dtype), kTopK, true), all);
  std::vector<torch::Tensor> outputs(tp);
  absl::Status status = specstream::testing::RunOnRankThreads(
      tp, [&](int rank, c10::intrusive_ptr<CommGroup> group) -> absl::Status {
        const ParallelLayout layout{rank, tp, ep};
        Experts mine = Slice(m, layout);
        mine.gate_up = mine.gate_up.to(dtype);
        mine.down = mine.down.to(dtype);
        const TokenChunk chunk = ChunkOf(tokens, rank, tp);
        const torch::Tensor rows = x.narrow(0, chunk.begin, chunk.size);
        auto out = DispatchCombine(rows, Route(rows, m.router.to(dtype), kTopK, true), mine, layout,
                                   *group);
        if (!out.ok()) return out.status();
        outputs[rank] = *out;
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  torch::Tensor got = torch::cat(outputs);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.scalar_type(), dtype);
  const double diff = RelDiff(got, want);
  EXPECT_LE(diff, tolerance) << "tp " << tp << " ep " << ep << " tokens " << tokens;
  std::cout << "[ dispatch/combine vs per-token loop ] tp " << tp << " ep " << ep << " tokens "
            << tokens << " " << c10::toString(dtype) << ": max relative difference " << diff
            << "\n";
}

TEST(MoeTest, ExpertParallelDispatchEqualsPerTokenLoop) {
  ExpectDispatchMatches(2, 2, 41, torch::kFloat32, 1e-6);
  ExpectDispatchMatches(4, 2, 41, torch::kFloat32, 1e-6);  // experts sliced over 2 MoE-TP ranks
  ExpectDispatchMatches(4, 4, 41, torch::kFloat32, 1e-6);
  ExpectDispatchMatches(2, 2, 41, torch::kBFloat16, 3e-2);  // travels as fp32
}

TEST(MoeTest, RanksWithoutTokensStillTakePart) {
  ExpectDispatchMatches(4, 4, 3, torch::kFloat32, 1e-6);  // rank 3 routes nothing
  ExpectDispatchMatches(2, 2, 1, torch::kFloat32, 1e-6);
}

TEST(MoeTest, ChunksCoverTheTokensOnce) {
  for (int64_t n : {0, 1, 5, 8, 41}) {
    int64_t next = 0;
    for (int rank = 0; rank < 4; ++rank) {
      const TokenChunk c = ChunkOf(n, rank, 4);
      EXPECT_EQ(c.begin, next);
      EXPECT_LE(c.size, n / 4 + 1);
      next += c.size;
    }
    EXPECT_EQ(next, n);
  }
}

}  // namespace
}  // namespace specstream::teacher::moe
