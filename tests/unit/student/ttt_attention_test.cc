// TttAttention against a naive reference built from plain differentiable ops
// (one [T, T + S] score matrix per head, HF repeat_kv for GQA), forward and
// every gradient; bf16 against fp32; and the backward against central finite
// differences in float64.
#include "student/ttt_attention.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace specstream::student {
namespace {

// The EAGLE-3 TTT attention spelled out: scores [B, Hq, T, T + S] =
// [q·k0ᵀ masked causal | q·kd_s at the same position for s = 1..S], one
// softmax, weighted sum of [v0 | vd_s].
torch::Tensor Reference(const torch::Tensor& q, const torch::Tensor& k0, const torch::Tensor& v0,
                        const torch::Tensor& kd, const torch::Tensor& vd, double scale) {
  const int64_t t = q.size(2);
  const int64_t group = q.size(1) / k0.size(1);
  torch::Tensor k = k0.repeat_interleave(group, 1);
  torch::Tensor v = v0.repeat_interleave(group, 1);
  torch::Tensor causal = torch::matmul(q, k.transpose(-1, -2)) * scale;
  torch::Tensor hidden = torch::ones({t, t}, torch::kBool).triu(1);
  causal = causal.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  const int64_t steps = kd.defined() ? kd.size(0) : 0;
  if (steps == 0) return torch::matmul(torch::softmax(causal, -1), v);
  torch::Tensor kdr = kd.repeat_interleave(group, 2);  // [S, B, Hq, T, D]
  torch::Tensor vdr = vd.repeat_interleave(group, 2);
  torch::Tensor diag = (q.unsqueeze(0) * kdr).sum(-1).permute({1, 2, 3, 0}) * scale;  // [B,Hq,T,S]
  torch::Tensor p = torch::softmax(torch::cat({causal, diag}, -1), -1);
  torch::Tensor p_causal = p.narrow(-1, 0, t);
  torch::Tensor p_diag =
      p.narrow(-1, t, steps).permute({3, 0, 1, 2}).unsqueeze(-1);  // [S,B,Hq,T,1]
  return torch::matmul(p_causal, v) + (p_diag * vdr).sum(0);
}

struct Case {
  int64_t batch, q_heads, kv_heads, t, d, steps, block;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B=" << c.batch << " Hq=" << c.q_heads << " Hkv=" << c.kv_heads << " T=" << c.t
            << " D=" << c.d << " S=" << c.steps << " block=" << c.block;
}

struct Inputs {
  torch::Tensor q, k0, v0, kd, vd;

  std::vector<torch::Tensor> Differentiable() const {
    std::vector<torch::Tensor> all = {q, k0, v0};
    if (kd.defined()) {
      all.push_back(kd);
      all.push_back(vd);
    }
    return all;
  }
};

Inputs MakeInputs(const Case& c, torch::Dtype dtype, uint64_t seed) {
  torch::manual_seed(seed);
  auto options = torch::TensorOptions().dtype(dtype);
  Inputs in;
  in.q = torch::randn({c.batch, c.q_heads, c.t, c.d}, options).requires_grad_();
  in.k0 = torch::randn({c.batch, c.kv_heads, c.t, c.d}, options).requires_grad_();
  in.v0 = torch::randn({c.batch, c.kv_heads, c.t, c.d}, options).requires_grad_();
  if (c.steps > 0) {
    in.kd = torch::randn({c.steps, c.batch, c.kv_heads, c.t, c.d}, options).requires_grad_();
    in.vd = torch::randn({c.steps, c.batch, c.kv_heads, c.t, c.d}, options).requires_grad_();
  }
  return in;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

class TttAttentionVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(TttAttentionVsReference, ForwardAndGradientsMatch) {
  const Case c = GetParam();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  Inputs in = MakeInputs(c, torch::kFloat32, /*seed=*/1234 + c.t + c.steps);

  torch::Tensor got = TttAttention(in.q, in.k0, in.v0, in.kd, in.vd, {scale, c.block});
  torch::Tensor want = Reference(in.q, in.k0, in.v0, in.kd, in.vd, scale);
  ASSERT_EQ(got.sizes(), want.sizes());
  ASSERT_EQ(got.scalar_type(), torch::kFloat32);
  const double forward_err = MaxAbsDiff(got, want);
  EXPECT_LT(forward_err, 1e-5) << c;

  // A random weighting makes every output element's gradient distinct.
  torch::Tensor weight = torch::randn(got.sizes());
  std::vector<torch::Tensor> inputs = in.Differentiable();
  std::vector<torch::Tensor> got_grads = torch::autograd::grad({(got * weight).sum()}, inputs);
  std::vector<torch::Tensor> want_grads = torch::autograd::grad({(want * weight).sum()}, inputs);
  const char* names[] = {"q", "k0", "v0", "kd", "vd"};
  double grad_err = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(got_grads[i].defined()) << names[i];
    ASSERT_EQ(got_grads[i].sizes(), inputs[i].sizes()) << names[i];
    const double err = MaxAbsDiff(got_grads[i], want_grads[i]);
    grad_err = std::max(grad_err, err);
    EXPECT_LT(err, 1e-5) << "d" << names[i] << " " << c;
  }
  // The gradients must carry signal, or the comparison proves nothing.
  EXPECT_GT(want_grads[0].abs().max().item<double>(), 1e-2);
  std::cout << c << ": forward max err " << forward_err << ", grad max err " << grad_err << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TttAttentionVsReference,
    ::testing::Values(Case{2, 4, 2, 37, 8, 3, 16},     // T not a multiple of the block, GQA 2
                      Case{2, 2, 2, 5, 8, 1, 16},      // T < block
                      Case{2, 4, 4, 20, 8, 0, 16},     // S = 0, no GQA
                      Case{2, 4, 2, 64, 8, 7, 16},     // T a multiple of the block, S = 7
                      Case{2, 2, 1, 13, 4, 3, 1},      // block 1
                      Case{2, 2, 2, 19, 8, 7, 1},      // block 1, S = 7
                      Case{2, 4, 2, 150, 16, 3, 128},  // default block, T > block
                      Case{2, 2, 1, 100, 8, 1, 128},   // default block, T < block
                      Case{2, 4, 2, 48, 8, 0, 128}));  // S = 0, GQA 2

TEST(TttAttentionTest, EmptyDiagonalsEqualUndefined) {
  const Case c{2, 4, 2, 21, 8, 0, 8};
  Inputs in = MakeInputs(c, torch::kFloat32, 7);
  torch::Tensor empty = torch::zeros({0, c.batch, c.kv_heads, c.t, c.d});
  torch::Tensor a = TttAttention(in.q, in.k0, in.v0, {}, {}, {0.3, 8});
  torch::Tensor b = TttAttention(in.q, in.k0, in.v0, empty, empty, {0.3, 8});
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(TttAttentionTest, DiagonalsChangeTheOutputOnlyAtTheirPosition) {
  const Case c{1, 2, 1, 12, 8, 2, 4};
  Inputs in = MakeInputs(c, torch::kFloat32, 11);
  torch::NoGradGuard no_grad;
  torch::Tensor base = TttAttention(in.q, in.k0, in.v0, in.kd, in.vd, {0.5, 4});
  torch::Tensor vd = in.vd.clone();
  vd.select(3, 5).add_(1.0);  // step values at position 5 only
  torch::Tensor changed = TttAttention(in.q, in.k0, in.v0, in.kd, vd, {0.5, 4});
  torch::Tensor diff = (changed - base).abs().amax({0, 1, 3});  // per position
  for (int64_t t = 0; t < c.t; ++t) {
    if (t == 5) {
      EXPECT_GT(diff[t].item<double>(), 1e-3);
    } else {
      EXPECT_EQ(diff[t].item<double>(), 0.0) << "position " << t;
    }
  }
}

TEST(TttAttentionTest, GradientsOnlyForInputsThatRequireThem) {
  const Case c{2, 4, 2, 30, 8, 3, 8};
  const double scale = 0.35;
  Inputs in = MakeInputs(c, torch::kFloat32, 5);
  in.k0 = in.k0.detach();
  in.v0 = in.v0.detach();
  in.vd = in.vd.detach();
  torch::Tensor got = TttAttention(in.q, in.k0, in.v0, in.kd, in.vd, {scale, 8});
  torch::Tensor want = Reference(in.q, in.k0, in.v0, in.kd, in.vd, scale);
  torch::Tensor weight = torch::randn(got.sizes());
  auto got_grads = torch::autograd::grad({(got * weight).sum()}, {in.q, in.kd});
  auto want_grads = torch::autograd::grad({(want * weight).sum()}, {in.q, in.kd});
  EXPECT_LT(MaxAbsDiff(got_grads[0], want_grads[0]), 1e-5);
  EXPECT_LT(MaxAbsDiff(got_grads[1], want_grads[1]), 1e-5);
}

TEST(TttAttentionTest, Bf16CloseToFp32) {
  const Case c{2, 4, 2, 70, 32, 3, 16};
  const double scale = 1.0 / std::sqrt(32.0);
  Inputs in = MakeInputs(c, torch::kBFloat16, 21);
  torch::Tensor got = TttAttention(in.q, in.k0, in.v0, in.kd, in.vd, {scale, 16});
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16);

  // The same (bf16-representable) values in fp32.
  auto fp32 = [](const torch::Tensor& x) {
    return x.detach().to(torch::kFloat32).requires_grad_();
  };
  Inputs ref{fp32(in.q), fp32(in.k0), fp32(in.v0), fp32(in.kd), fp32(in.vd)};
  torch::Tensor want = TttAttention(ref.q, ref.k0, ref.v0, ref.kd, ref.vd, {scale, 16});
  // Outputs are O(1); bf16 keeps 8 bits of mantissa.
  const double forward_err = MaxAbsDiff(got, want);
  EXPECT_LT(forward_err, 1e-2);

  torch::Tensor weight = torch::randn(got.sizes());
  auto got_grads =
      torch::autograd::grad({(got * weight.to(torch::kBFloat16)).sum()}, in.Differentiable());
  auto want_grads = torch::autograd::grad({(want * weight).sum()}, ref.Differentiable());
  for (size_t i = 0; i < got_grads.size(); ++i) {
    ASSERT_EQ(got_grads[i].scalar_type(), torch::kBFloat16);
    const double magnitude = want_grads[i].abs().max().item<double>();
    const double err = MaxAbsDiff(got_grads[i], want_grads[i]);
    EXPECT_LT(err, 2e-2 * std::max(1.0, magnitude)) << i;
    std::cout << "bf16 grad " << i << ": max err " << err << " (max |grad| " << magnitude << ")\n";
  }
  std::cout << "bf16 forward max err " << forward_err << "\n";
}

// gradcheck in C++: central differences of sum(out · w) in float64.
TEST(TttAttentionTest, Float64GradientsMatchFiniteDifferences) {
  const Case c{1, 4, 2, 6, 3, 2, 4};
  const double scale = 0.7;
  Inputs in = MakeInputs(c, torch::kFloat64, 99);
  torch::Tensor weight = torch::randn({c.batch, c.q_heads, c.t, c.d}, torch::kFloat64);
  auto objective = [&](const Inputs& x) {
    return (TttAttention(x.q, x.k0, x.v0, x.kd, x.vd, {scale, 4}) * weight).sum();
  };
  torch::Tensor out = TttAttention(in.q, in.k0, in.v0, in.kd, in.vd, {scale, 4});
  ASSERT_EQ(out.scalar_type(), torch::kFloat64);
  EXPECT_LT(MaxAbsDiff(out, Reference(in.q, in.k0, in.v0, in.kd, in.vd, scale)), 1e-12);
  std::vector<torch::Tensor> inputs = in.Differentiable();
  std::vector<torch::Tensor> analytic = torch::autograd::grad({objective(in)}, inputs);

  torch::NoGradGuard no_grad;
  const double eps = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    torch::Tensor flat = inputs[i].view(-1);
    torch::Tensor grad = analytic[i].reshape(-1);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double orig = flat[e].item<double>();
      flat[e] = orig + eps;
      const double plus = objective(in).item<double>();
      flat[e] = orig - eps;
      const double minus = objective(in).item<double>();
      flat[e] = orig;
      const double numeric = (plus - minus) / (2 * eps);
      const double err = std::abs(numeric - grad[e].item<double>());
      worst = std::max(worst, err);
      EXPECT_LT(err, 1e-6 * std::max(1.0, std::abs(numeric))) << "input " << i << " element " << e;
    }
  }
  std::cout << "finite-difference max err " << worst << "\n";
}

TEST(TttAttentionTest, RejectsMismatchedShapes) {
  torch::Tensor q = torch::randn({1, 3, 4, 8});
  torch::Tensor kv = torch::randn({1, 2, 4, 8});  // 3 query heads over 2 kv heads
  EXPECT_THROW(TttAttention(q, kv, kv, {}, {}, {1.0, 4}), c10::Error);
  torch::Tensor q4 = torch::randn({1, 4, 4, 8});
  torch::Tensor kd = torch::randn({2, 1, 2, 5, 8});  // wrong T
  EXPECT_THROW(TttAttention(q4, kv, kv, kd, kd, {1.0, 4}), c10::Error);
  EXPECT_THROW(TttAttention(q4, kv, kv, {}, {}, {1.0, 0}), c10::Error);
}

}  // namespace
}  // namespace specstream::student
