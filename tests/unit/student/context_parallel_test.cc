// Context-parallel primitives: the shard and rank layout (pure functions), the
// autograd all-gather (the DESIGN's two-rank check and random shapes against
// the analytic gradient), ring causal attention against full single-process
// causal attention (forward, lse and every gradient), ring block attention
// against BlockAttention over the gathered context, the Ulysses all-to-all,
// and TTT attention under ring, Ulysses and USP against single-process
// TttAttention, with cp ranks run as threads, each with its own Gloo groups
// over one TCPStore.
#include "student/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/torch/process_group.h"
#include "gtest/gtest.h"
#include "student/block_attention.h"
#include "student/ttt_attention.h"
#include "tests/testing/rank_threads.h"

namespace specstream::student {
namespace {

// ---------------------------------------------------------------------------
// Layout.

TEST(CpLayoutTest, EvenSplit) {
  for (int64_t r = 0; r < 4; ++r) {
    const CpShard shard = ShardRange(8, 4, r);
    EXPECT_EQ(shard.begin, 2 * r);
    EXPECT_EQ(shard.length, 2);
    EXPECT_EQ(shard.padded_length, 2);
  }
}

TEST(CpLayoutTest, OddLengthsPadTheTrailingShards) {
  EXPECT_EQ(PaddedShardLength(7, 2), 4);
  EXPECT_EQ(ShardRange(7, 2, 0).length, 4);
  EXPECT_EQ(ShardRange(7, 2, 1).begin, 4);
  EXPECT_EQ(ShardRange(7, 2, 1).length, 3);
  // T = 10 over 4: static length 3, the last shard holds one real row.
  const std::vector<int64_t> lengths = {3, 3, 3, 1};
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(ShardRange(10, 4, r).begin, 3 * r);
    EXPECT_EQ(ShardRange(10, 4, r).length, lengths[r]) << "rank " << r;
  }
}

TEST(CpLayoutTest, ShorterThanCpSizeLeavesEmptyShards) {
  EXPECT_EQ(PaddedShardLength(3, 4), 1);
  EXPECT_EQ(ShardRange(3, 4, 2).length, 1);
  EXPECT_EQ(ShardRange(3, 4, 3).begin, 3);
  EXPECT_EQ(ShardRange(3, 4, 3).length, 0);
  EXPECT_EQ(ShardRange(1, 4, 0).length, 1);
  EXPECT_EQ(ShardRange(1, 4, 1).length, 0);
  EXPECT_EQ(ShardRange(0, 4, 0).padded_length, 0);
  EXPECT_EQ(ShardRange(0, 4, 3).length, 0);
}

// Shards tile the sequence in rank order with equal static lengths, and the
// padding is less than one row per rank.
TEST(CpLayoutTest, ShardsTileEverySequence) {
  for (int64_t cp = 1; cp <= 5; ++cp) {
    for (int64_t t = 0; t <= 23; ++t) {
      const int64_t padded = PaddedShardLength(t, cp);
      EXPECT_GE(padded * cp, t);
      EXPECT_LT(padded * cp - t, cp);
      int64_t next = 0;
      for (int64_t r = 0; r < cp; ++r) {
        const CpShard shard = ShardRange(t, cp, r);
        EXPECT_EQ(shard.padded_length, padded);
        EXPECT_EQ(shard.begin, r * padded);
        if (shard.length > 0) {
          EXPECT_EQ(shard.begin, next) << "T=" << t << " cp=" << cp << " rank " << r;
          next = shard.begin + shard.length;
        }
      }
      EXPECT_EQ(next, t) << "T=" << t << " cp=" << cp;
    }
  }
}

TEST(CpLayoutTest, ShardSequenceCopiesAndZeroPads) {
  torch::Tensor full = torch::arange(1, 11, torch::kFloat32).view({1, 10, 1});  // 1..10
  torch::Tensor last = ShardSequence(full, 1, 4, 3);
  ASSERT_EQ(last.sizes(), torch::IntArrayRef({1, 3, 1}));
  EXPECT_TRUE(torch::equal(last.flatten(), torch::tensor({10.0F, 0.0F, 0.0F})));
  EXPECT_TRUE(
      torch::equal(ShardSequence(full, 1, 4, 1).flatten(), torch::tensor({4.0F, 5.0F, 6.0F})));
  // An empty shard is all padding.
  EXPECT_TRUE(
      torch::equal(ShardSequence(full.narrow(1, 0, 3), -2, 4, 3).flatten(), torch::zeros({1})));
  EXPECT_TRUE(torch::equal(ShardValidMask(10, 4, 3), torch::tensor({true, false, false})));
  EXPECT_TRUE(torch::equal(ShardValidMask(10, 4, 0), torch::tensor({true, true, true})));
  EXPECT_TRUE(torch::equal(ShardValidMask(3, 4, 3), torch::tensor({false})));
}

TEST(CpLayoutTest, RefusesBadArguments) {
  EXPECT_THROW(PaddedShardLength(4, 0), c10::Error);
  EXPECT_THROW(PaddedShardLength(-1, 2), c10::Error);
  EXPECT_THROW(ShardRange(4, 2, 2), c10::Error);
  EXPECT_THROW(ShardRange(4, 2, -1), c10::Error);
}

// ---------------------------------------------------------------------------
// Multi-rank harness.

// Runs fn(rank, group) on `cp` rank threads (exceptions become failures).
absl::Status RunRanks(int cp, const std::function<void(int, CommGroup&)>& fn) {
  return specstream::testing::RunOnRankThreads(cp,
                                               [&](int rank, c10::intrusive_ptr<CommGroup> group) {
                                                 fn(rank, *group);
                                                 return absl::OkStatus();
                                               });
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0 && b.numel() == 0) return 0;
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// ---------------------------------------------------------------------------
// SequenceAllGather.

// DESIGN.md §6: ranks hold [1] and [2]; each computes sum(gathered²); the
// owners receive gradients 2·x summed over both ranks: 4 and 8.
TEST(SequenceAllGatherTest, TwoRankCheck) {
  std::vector<torch::Tensor> gathered(2), grads(2);
  ASSERT_TRUE(RunRanks(2, [&](int rank, CommGroup& group) {
                torch::Tensor x = torch::full({1, 1}, rank + 1.0, torch::kFloat32);
                x.requires_grad_(true);
                torch::Tensor g = SequenceAllGather(x, group);
                g.pow(2).sum().backward();
                gathered[rank] = g.detach();
                grads[rank] = x.grad();
              }).ok());
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(torch::equal(gathered[rank], torch::tensor({{1.0F, 2.0F}}))) << gathered[rank];
  }
  EXPECT_EQ(grads[0].item<float>(), 4.0F);
  EXPECT_EQ(grads[1].item<float>(), 8.0F);
}

// Each rank r weights its gathered copy by W_r; the gradient of shard j is
// Σ_r W_r[:, rows of j]. Shards [2, 3, 4, 5]; cp = 2 and 4; fp32 and bf16.
class SequenceAllGatherRandomTest
    : public ::testing::TestWithParam<std::tuple<int, torch::ScalarType>> {};

INSTANTIATE_TEST_SUITE_P(CpAndDtype, SequenceAllGatherRandomTest,
                         ::testing::Values(std::make_tuple(2, torch::kFloat32),
                                           std::make_tuple(4, torch::kFloat32),
                                           std::make_tuple(2, torch::kBFloat16)));

TEST_P(SequenceAllGatherRandomTest, MatchesAnalyticGradient) {
  const auto [cp, dtype] = GetParam();
  const int64_t shard = 3;
  torch::manual_seed(11);
  std::vector<torch::Tensor> locals, weights;
  for (int r = 0; r < cp; ++r) {
    locals.push_back(torch::randn({2, shard, 4, 5}).to(dtype));
    weights.push_back(torch::randn({2, cp * shard, 4, 5}).to(dtype));
  }
  std::vector<torch::Tensor> gathered(cp), grads(cp);
  ASSERT_TRUE(RunRanks(cp, [&](int rank, CommGroup& group) {
                torch::Tensor x = locals[rank].clone().requires_grad_(true);
                torch::Tensor g = SequenceAllGather(x, group);
                (g * weights[rank]).sum().backward();
                gathered[rank] = g.detach();
                grads[rank] = x.grad();
              }).ok());
  const torch::Tensor expected_gather = torch::cat(locals, 1);
  torch::Tensor weight_sum = torch::zeros({2, cp * shard, 4, 5}, torch::kFloat64);
  for (const torch::Tensor& w : weights) weight_sum += w.to(torch::kFloat64);
  // bf16: the fp32 sum of cp bf16 weights rounded once to bf16.
  const double tolerance = dtype == torch::kBFloat16 ? 1e-2 : 1e-6;
  double gather_error = 0, grad_error = 0;
  for (int r = 0; r < cp; ++r) {
    EXPECT_EQ(gathered[r].scalar_type(), dtype);
    EXPECT_EQ(grads[r].scalar_type(), dtype);
    gather_error = std::max(gather_error, MaxAbsDiff(gathered[r], expected_gather));
    grad_error = std::max(grad_error, MaxAbsDiff(grads[r], weight_sum.narrow(1, r * shard, shard)));
  }
  std::cout << "all-gather cp=" << cp << " " << dtype << ": gather error " << gather_error
            << ", gradient error " << grad_error << "\n";
  EXPECT_EQ(gather_error, 0);
  EXPECT_LE(grad_error, tolerance);
}

TEST(SequenceAllGatherTest, EmptyShardsStayEmpty) {
  std::vector<torch::Tensor> gathered(2), grads(2);
  const absl::Status status = RunRanks(2, [&](int rank, CommGroup& group) {
    torch::Tensor x = torch::zeros({1, 0, 3}, torch::kFloat32).requires_grad_(true);
    torch::Tensor g = SequenceAllGather(x, group);
    g.sum().backward();
    gathered[rank] = g.detach();
    grads[rank] = x.grad();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(gathered[r].sizes(), torch::IntArrayRef({1, 0, 3}));
    EXPECT_EQ(grads[r].sizes(), torch::IntArrayRef({1, 0, 3}));
  }
}

// ---------------------------------------------------------------------------
// RingCausalAttention.

struct RingCase {
  int cp;
  int64_t batch, q_heads, kv_heads, t, d, block;
};

std::ostream& operator<<(std::ostream& os, const RingCase& c) {
  return os << "cp=" << c.cp << " B=" << c.batch << " Hq=" << c.q_heads << " Hkv=" << c.kv_heads
            << " T=" << c.t << " D=" << c.d << " block=" << c.block;
}

// Full causal attention from plain differentiable ops, HF repeat_kv for GQA:
// {out [B, Hq, T, D], lse [B, Hq, T]}.
std::pair<torch::Tensor, torch::Tensor> FullCausal(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, double scale) {
  const int64_t t = q.size(2);
  const int64_t group = q.size(1) / k.size(1);
  torch::Tensor s = torch::matmul(q, k.repeat_interleave(group, 1).transpose(-1, -2)) * scale;
  s = s.masked_fill(torch::ones({t, t}, torch::kBool).triu(1),
                    -std::numeric_limits<double>::infinity());
  return {torch::matmul(torch::softmax(s, -1), v.repeat_interleave(group, 1)),
          torch::logsumexp(s, -1)};
}

// Per-rank maximum absolute errors, reduced over ranks.
struct RingErrors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  double Max() const { return std::max({out, lse, dq, dk, dv}); }
};

// The loss weights both outputs with random cotangents (zero on padding
// rows), so the gradient through lse is checked too. Every rank's shard
// gradients (padding rows included, which must be zero) are compared with
// the full reference's.
RingErrors CompareRing(const RingCase& c) {
  torch::manual_seed(c.t * 131 + c.cp);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  torch::Tensor q = torch::randn({c.batch, c.q_heads, c.t, c.d});
  torch::Tensor k = torch::randn({c.batch, c.kv_heads, c.t, c.d});
  torch::Tensor v = torch::randn({c.batch, c.kv_heads, c.t, c.d});
  torch::Tensor out_weight = torch::randn({c.batch, c.q_heads, c.t, c.d});
  torch::Tensor lse_weight = torch::randn({c.batch, c.q_heads, c.t});

  torch::Tensor rq = q.clone().requires_grad_(true), rk = k.clone().requires_grad_(true),
                rv = v.clone().requires_grad_(true);
  auto [ref_out, ref_lse] = FullCausal(rq, rk, rv, scale);
  ((ref_out * out_weight).sum() + (ref_lse * lse_weight).sum()).backward();

  std::vector<RingErrors> errors(c.cp);
  const absl::Status status = RunRanks(c.cp, [&](int rank, CommGroup& group) {
    auto shard = [&](const torch::Tensor& x) { return ShardSequence(x, 2, c.cp, rank); };
    torch::Tensor lq = shard(q).requires_grad_(true), lk = shard(k).requires_grad_(true),
                  lv = shard(v).requires_grad_(true);
    RingAttentionOptions options;
    options.scale = scale;
    options.block_size = c.block;
    RingAttentionOutput result = RingCausalAttention(lq, lk, lv, group, options);
    ((result.out * shard(out_weight)).sum() + (result.lse * shard(lse_weight)).sum()).backward();
    const CpShard range = ShardRange(c.t, c.cp, rank);
    RingErrors& e = errors[rank];
    e.out = MaxAbsDiff(result.out.narrow(2, 0, range.length),
                       ref_out.detach().narrow(2, range.begin, range.length));
    e.lse = MaxAbsDiff(result.lse.narrow(2, 0, range.length),
                       ref_lse.detach().narrow(2, range.begin, range.length));
    e.dq = MaxAbsDiff(lq.grad(), shard(rq.grad()));
    e.dk = MaxAbsDiff(lk.grad(), shard(rk.grad()));
    e.dv = MaxAbsDiff(lv.grad(), shard(rv.grad()));
  });
  EXPECT_TRUE(status.ok()) << status;
  RingErrors worst;
  for (const RingErrors& e : errors) {
    worst.out = std::max(worst.out, e.out);
    worst.lse = std::max(worst.lse, e.lse);
    worst.dq = std::max(worst.dq, e.dq);
    worst.dk = std::max(worst.dk, e.dk);
    worst.dv = std::max(worst.dv, e.dv);
  }
  return worst;
}

class RingCausalAttentionTest : public ::testing::TestWithParam<RingCase> {};

INSTANTIATE_TEST_SUITE_P(
    Shapes, RingCausalAttentionTest,
    ::testing::Values(RingCase{1, 2, 2, 2, 5, 8, 128},    // no ring: local causal attention
                      RingCase{2, 2, 2, 2, 8, 8, 128},    // even split, MHA
                      RingCase{2, 1, 4, 2, 7, 8, 128},    // odd T (padded shard), GQA
                      RingCase{2, 1, 4, 1, 13, 4, 3},     // sub-blocks inside a shard, MQA
                      RingCase{4, 2, 4, 2, 10, 8, 2},     // shards 3,3,3,1; sub-blocks
                      RingCase{4, 1, 2, 1, 16, 8, 128},   // even split over 4
                      RingCase{4, 1, 4, 2, 3, 8, 128}));  // T < cp: one empty shard

TEST_P(RingCausalAttentionTest, MatchesFullCausalAttention) {
  const RingCase c = GetParam();
  const RingErrors e = CompareRing(c);
  std::cout << c << ": max |error| out " << e.out << " lse " << e.lse << " dq " << e.dq << " dk "
            << e.dk << " dv " << e.dv << "\n";
  EXPECT_LE(e.Max(), 1e-5) << c;
}

// ---------------------------------------------------------------------------
// RingBlockAttention: each rank's own blocks against the sharded context
// equal BlockAttention over the whole context, in float64; the context's
// gradient is the sum of every rank's, sliced to the owner's shard.

struct RingBlockCase {
  int cp;
  int64_t context, blocks, bs, key_block;
};

std::ostream& operator<<(std::ostream& os, const RingBlockCase& c) {
  return os << "cp=" << c.cp << " S=" << c.context << " N=" << c.blocks << " bs=" << c.bs
            << " key_block=" << c.key_block;
}

class RingBlockAttentionTest : public ::testing::TestWithParam<RingBlockCase> {};

INSTANTIATE_TEST_SUITE_P(Shapes, RingBlockAttentionTest,
                         ::testing::Values(RingBlockCase{2, 12, 3, 4, 256},
                                           RingBlockCase{2, 11, 4, 3, 2},
                                           RingBlockCase{3, 10, 2, 2, 3},
                                           RingBlockCase{4, 13, 3, 3, 1},
                                           // shorter than cp: empty trailing shards
                                           RingBlockCase{4, 3, 2, 2, 256}));

TEST_P(RingBlockAttentionTest, EqualsBlockAttentionOverTheGatheredContext) {
  const RingBlockCase c = GetParam();
  const int64_t b = 2, hq = 4, hkv = 2, d = 8, m = c.blocks * c.bs;
  const int64_t shard = PaddedShardLength(c.context, c.cp), padded = shard * c.cp;
  torch::manual_seed(c.context * 31 + c.cp);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  // The context padded to cp shards (zero rows past S, never visible).
  torch::Tensor kc = torch::zeros({b, hkv, padded, d}, f64);
  torch::Tensor vc = torch::zeros({b, hkv, padded, d}, f64);
  kc.narrow(2, 0, c.context).copy_(torch::randn({b, hkv, c.context, d}, f64));
  vc.narrow(2, 0, c.context).copy_(torch::randn({b, hkv, c.context, d}, f64));
  struct RankInputs {
    torch::Tensor q, kb, vb, limit, upstream;
  };
  std::vector<RankInputs> in;
  for (int r = 0; r < c.cp; ++r) {
    // Limits anywhere in [0, S]: 0 (a dummy or an anchor at 0), S, and
    // random ones crossing shard edges.
    torch::Tensor limit = torch::randint(0, c.context + 1, {b, c.blocks}, torch::kInt64);
    limit.index_put_({0, 0}, 0);
    limit.index_put_({1, c.blocks - 1}, c.context);
    in.push_back({torch::randn({b, hq, m, d}, f64), torch::randn({b, hkv, m, d}, f64),
                  torch::randn({b, hkv, m, d}, f64), limit, torch::randn({b, hq, m, d}, f64)});
  }
  BlockAttentionOptions options;
  options.scale = 0.3;
  options.query_rows = c.bs;  // one block per chunk: chunks see different shards
  options.key_block = c.key_block;

  // Reference: every rank's blocks against the whole context, one process.
  torch::Tensor want_dkc = torch::zeros_like(kc), want_dvc = torch::zeros_like(vc);
  std::vector<torch::Tensor> want_out(c.cp);
  std::vector<std::vector<torch::Tensor>> want_grads(c.cp);
  for (int r = 0; r < c.cp; ++r) {
    std::vector<torch::Tensor> leaves = {
        kc.clone().requires_grad_(), vc.clone().requires_grad_(), in[r].q.clone().requires_grad_(),
        in[r].kb.clone().requires_grad_(), in[r].vb.clone().requires_grad_()};
    torch::Tensor out = BlockAttention(leaves[2], leaves[0], leaves[1], leaves[3], leaves[4],
                                       in[r].limit, c.bs, options);
    std::vector<torch::Tensor> g = torch::autograd::grad({(out * in[r].upstream).sum()}, leaves);
    want_dkc += g[0];
    want_dvc += g[1];
    want_out[r] = out.detach();
    want_grads[r] = {g[2], g[3], g[4]};
  }

  std::vector<torch::Tensor> got_out(c.cp);
  std::vector<std::vector<torch::Tensor>> got_grads(c.cp);
  const absl::Status status = RunRanks(c.cp, [&](int rank, CommGroup& group) {
    std::vector<torch::Tensor> leaves = {kc.narrow(2, rank * shard, shard).clone().requires_grad_(),
                                         vc.narrow(2, rank * shard, shard).clone().requires_grad_(),
                                         in[rank].q.clone().requires_grad_(),
                                         in[rank].kb.clone().requires_grad_(),
                                         in[rank].vb.clone().requires_grad_()};
    torch::Tensor out = RingBlockAttention(leaves[2], leaves[0], leaves[1], leaves[3], leaves[4],
                                           in[rank].limit, c.bs, group, options);
    got_out[rank] = out.detach();
    got_grads[rank] = torch::autograd::grad({(out * in[rank].upstream).sum()}, leaves);
  });
  ASSERT_TRUE(status.ok()) << status;
  double worst = 0;
  for (int r = 0; r < c.cp; ++r) {
    worst = std::max(worst, MaxAbsDiff(got_out[r], want_out[r]));
    for (int i = 0; i < 3; ++i) {
      worst = std::max(worst, MaxAbsDiff(got_grads[r][i + 2], want_grads[r][i]));
    }
    worst = std::max(worst, MaxAbsDiff(got_grads[r][0], want_dkc.narrow(2, r * shard, shard)));
    worst = std::max(worst, MaxAbsDiff(got_grads[r][1], want_dvc.narrow(2, r * shard, shard)));
  }
  std::cout << "ring block attention " << c << ": max abs error " << worst << "\n";
  EXPECT_LE(worst, 1e-12);
}

TEST(RingBlockAttentionShapeTest, RefusesLimitsPastTheShardedContext) {
  const absl::Status status = RunRanks(2, [&](int, CommGroup& group) {
    torch::Tensor q = torch::randn({1, 2, 4, 4}), kc = torch::randn({1, 1, 3, 4});
    torch::Tensor kb = torch::randn({1, 1, 4, 4});
    BlockAttentionOptions options;
    // Two shards of 3: limits up to 6 are in range, 7 is not.
    EXPECT_NO_THROW(
        RingBlockAttention(q, kc, kc, kb, kb, torch::tensor({{0, 6}}), 2, group, options));
    EXPECT_THROW(RingBlockAttention(q, kc, kc, kb, kb, torch::tensor({{0, 7}}), 2, group, options),
                 c10::Error);
  });
  ASSERT_TRUE(status.ok()) << status;
}

// ---------------------------------------------------------------------------
// TTT attention under every CP mode, exactly as the draft calls it: Ulysses
// all-to-all (sequence -> heads) of q, k0, v0 and the diagonal keys, then ring
// TTT attention over the ring group (or plain TttAttention when the ring has
// one rank), then the inverse all-to-all. Against single-process
// TttAttention: the output and the gradients of q, k0, v0, kd and vd.

struct CpTttCase {
  int cp, ulysses;
  int64_t t, steps;
  torch::Dtype dtype;
};

std::ostream& operator<<(std::ostream& os, const CpTttCase& c) {
  return os << "cp=" << c.cp << " ulysses=" << c.ulysses << " T=" << c.t << " S=" << c.steps << " "
            << c10::toString(c.dtype);
}

class CpTttAttentionTest : public ::testing::TestWithParam<CpTttCase> {};

INSTANTIATE_TEST_SUITE_P(
    Modes, CpTttAttentionTest,
    ::testing::Values(CpTttCase{2, 1, 9, 2, torch::kFloat32},    // ring, odd T
                      CpTttCase{2, 2, 9, 2, torch::kFloat32},    // Ulysses, odd T
                      CpTttCase{4, 1, 13, 3, torch::kFloat32},   // ring over 4
                      CpTttCase{4, 4, 13, 3, torch::kFloat32},   // Ulysses over 4
                      CpTttCase{4, 2, 13, 3, torch::kFloat32},   // USP: 2 x ring 2
                      CpTttCase{4, 2, 3, 2, torch::kFloat32},    // USP, T < cp: empty shard
                      CpTttCase{4, 1, 3, 1, torch::kFloat32},    // ring, T < cp
                      CpTttCase{2, 2, 8, 0, torch::kFloat32},    // step 0 only
                      CpTttCase{4, 2, 13, 2, torch::kBFloat16},  // bf16 travels bit-exactly
                      CpTttCase{2, 1, 10, 2, torch::kFloat64}));

TEST_P(CpTttAttentionTest, MatchesSingleProcessTttAttention) {
  const CpTttCase c = GetParam();
  const int64_t batch = 2, q_heads = 8, kv_heads = 4, d = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  torch::manual_seed(c.t * 7 + c.cp + c.ulysses);
  auto make = [&](std::vector<int64_t> shape) { return torch::randn(shape).to(c.dtype); };
  std::vector<torch::Tensor> ref = {make({batch, q_heads, c.t, d}), make({batch, kv_heads, c.t, d}),
                                    make({batch, kv_heads, c.t, d}),
                                    make({c.steps, batch, kv_heads, c.t, d}),
                                    make({c.steps, batch, kv_heads, c.t, d})};
  const torch::Tensor weight = make({batch, q_heads, c.t, d});
  for (torch::Tensor& x : ref) x.requires_grad_(true);
  TttAttentionOptions ttt;
  ttt.scale = scale;
  ttt.block_size = 4;
  const torch::Tensor ref_out = TttAttention(ref[0], ref[1], ref[2], ref[3], ref[4], ttt);
  (ref_out * weight).sum().backward();

  std::vector<double> errors(c.cp, 0.0);
  const absl::Status status = specstream::testing::RunOnRankHandles(
      c.cp, [&](int rank, const ProcessGroupHandle& handle) -> absl::Status {
        const CpLayout layout{c.cp, c.cp, c.ulysses, rank};
        auto groups = CreateCpGroups(layout, handle.store, "127.0.0.1", std::chrono::seconds(60));
        if (!groups.ok()) return groups.status();
        std::vector<torch::Tensor> local;
        for (size_t i = 0; i < ref.size(); ++i) {
          local.push_back(
              ShardSequence(ref[i].detach(), i < 3 ? 2 : 3, c.cp, rank).requires_grad_(true));
        }
        torch::Tensor q = local[0], k0 = local[1], v0 = local[2], kd = local[3], vd = local[4];
        if (groups->ulysses) {
          q = SequenceToHeads(q, *groups->ulysses);
          k0 = SequenceToHeads(k0, *groups->ulysses);
          v0 = SequenceToHeads(v0, *groups->ulysses);
          std::vector<torch::Tensor> kds, vds;
          for (int64_t s = 0; s < c.steps; ++s) {
            kds.push_back(SequenceToHeads(kd[s], *groups->ulysses));
            vds.push_back(SequenceToHeads(vd[s], *groups->ulysses));
          }
          kd = c.steps > 0 ? torch::stack(kds) : torch::Tensor();
          vd = c.steps > 0 ? torch::stack(vds) : torch::Tensor();
        }
        torch::Tensor out;
        if (groups->ring) {
          RingAttentionOptions options;
          options.scale = scale;
          options.block_size = 2;
          out = RingTttAttention(q, k0, v0, kd, vd, *groups->ring, options);
        } else {
          out = TttAttention(q, k0, v0, kd, vd, ttt);
        }
        if (groups->ulysses) out = HeadsToSequence(out, *groups->ulysses);
        (out.to(torch::kFloat64) * ShardSequence(weight, 2, c.cp, rank).to(torch::kFloat64))
            .sum()
            .backward();
        const CpShard range = ShardRange(c.t, c.cp, rank);
        double e = MaxAbsDiff(out.narrow(2, 0, range.length),
                              ref_out.detach().narrow(2, range.begin, range.length));
        for (size_t i = 0; i < ref.size(); ++i) {
          if (ref[i].numel() == 0) continue;
          e = std::max(e, MaxAbsDiff(local[i].grad(),
                                     ShardSequence(ref[i].grad(), i < 3 ? 2 : 3, c.cp, rank)));
        }
        errors[rank] = e;
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  const double worst = *std::max_element(errors.begin(), errors.end());
  std::cout << c << ": max |error| " << worst << "\n";
  EXPECT_LE(worst, c.dtype == torch::kBFloat16 ? 5e-2 : 1e-5) << c;
}

TEST(UlyssesAllToAllTest, RoundTripAndGradientAreExact) {
  const int u = 2;
  torch::manual_seed(11);
  const torch::Tensor full = torch::randn({1, 4, 6, 3});
  ASSERT_TRUE(
      specstream::testing::RunOnRankThreads(u, [&](int rank, c10::intrusive_ptr<CommGroup> group) {
        torch::Tensor x = ShardSequence(full, 2, u, rank).requires_grad_(true);
        torch::Tensor heads = SequenceToHeads(x, *group);
        // Rank r holds heads [2r, 2r+2) over the whole sequence.
        EXPECT_TRUE(torch::equal(heads, full.narrow(1, 2 * rank, 2)));
        EXPECT_TRUE(torch::equal(HeadsToSequence(heads, *group), x));
        // d/dx sum(heads * c) = c, sharded back by sequence.
        torch::Tensor c = torch::arange(heads.numel()).reshape(heads.sizes()).to(torch::kFloat32);
        (heads * c).sum().backward();
        EXPECT_TRUE(torch::equal(x.grad(), HeadsToSequence(c, *group)));
        return absl::OkStatus();
      }).ok());
}

TEST(CpLayoutTest, RankLayoutAndRefusals) {
  // World 8 = DP 2 x CP 4, USP 2 x 2: rank 6 is dp 1, cp 2 = ring 1, ulysses 0.
  const CpLayout layout{8, 4, 2, 6};
  EXPECT_EQ(layout.dp_size(), 2);
  EXPECT_EQ(layout.dp_rank(), 1);
  EXPECT_EQ(layout.cp_rank(), 2);
  EXPECT_EQ(layout.ring_size(), 2);
  EXPECT_EQ(layout.ring_rank(), 1);
  EXPECT_EQ(layout.ulysses_rank(), 0);
  EXPECT_TRUE(ValidateCpLayout(layout, 8, 4).ok());
  auto message = [](const absl::Status& s) { return std::string(s.message()); };
  absl::Status world = ValidateCpLayout(CpLayout{6, 4, 1, 0}, 8, 4);
  EXPECT_EQ(world.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(message(world).find("parallel.cp_size 4 does not divide the world of 6"),
            std::string::npos)
      << world;
  absl::Status heads = ValidateCpLayout(CpLayout{4, 4, 4, 0}, 8, 2);
  EXPECT_NE(
      message(heads).find("parallel.ulysses_degree 4 must divide the draft's attention heads"),
      std::string::npos)
      << heads;
  EXPECT_FALSE(ValidateCpLayout(CpLayout{4, 4, 3, 0}, 12, 6).ok());
}

TEST(RingCausalAttentionShapeTest, RefusesMismatchedHeads) {
  ASSERT_TRUE(
      RunRanks(1, [](int, CommGroup& group) {
        torch::Tensor q = torch::zeros({1, 3, 4, 8});
        torch::Tensor kv = torch::zeros({1, 2, 4, 8});
        try {
          RingCausalAttention(q, kv, kv, group, {});
          ADD_FAILURE() << "Hq = 3 over Hkv = 2 was accepted";
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("multiple of Hkv"), std::string::npos) << e.what();
        }
        EXPECT_THROW(RingCausalAttention(q, kv.narrow(2, 0, 3), kv.narrow(2, 0, 3), group, {}),
                     c10::Error);
      }).ok());
}

}  // namespace
}  // namespace specstream::student
