// Golden tests pinning common/torch/blocks.h to transformers' numerics. The
// expected numbers were computed independently in plain Python 3 (math module
// only) from transformers' formulas; the snippets are quoted next to them.
#include "common/torch/blocks.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"

namespace specstream::nn {
namespace {

// Python helpers shared by the rope snippets below:
//
//   import math
//   def default_inv_freq(dim, base):   # _compute_default_rope_parameters
//       return [1.0 / (base ** (i / dim)) for i in range(0, dim, 2)]
//   def llama3(dim, base, factor, lo, hi, old):   # _compute_llama3_parameters
//       out = []
//       for f in default_inv_freq(dim, base):
//           w = 2 * math.pi / f
//           if w < old / hi: out.append(f)
//           elif w > old / lo: out.append(f / factor)
//           else:
//               s = (old / w - lo) / (hi - lo)
//               out.append((1 - s) * f / factor + s * f)
//       return out
//   def yarn(dim, base, factor, orig, beta_fast=32, beta_slow=1,
//            mscale=None, mscale_all_dim=None):       # _compute_yarn_parameters
//       def cdim(rot): return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
//       low = max(math.floor(cdim(beta_fast)), 0)
//       high = min(math.ceil(cdim(beta_slow)), dim - 1)
//       if low == high: high += 0.001
//       def gm(s, m=1.0): return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
//       if mscale and mscale_all_dim: att = gm(factor, mscale) / gm(factor, mscale_all_dim)
//       else: att = gm(factor)
//       out = []
//       for j, i in enumerate(range(0, dim, 2)):
//           pf = base ** (i / dim)
//           ef = 1 - min(max((j - low) / (high - low), 0.0), 1.0)
//           out.append((1.0 / (factor * pf)) * (1 - ef) + (1.0 / pf) * ef)
//       return out, att
//   # cos/sin at (p, j): att * math.cos(p * inv[j]), att * math.sin(p * inv[j])

struct InvFreqEntry {
  int index;
  double value;
};

struct CosSinEntry {
  int64_t position;
  int column;  // in [0, dim / 2); column + dim / 2 must hold the same value
  double cos;
  double sin;
};

// fp32 tables against double-precision expectations: relative 1e-6 on
// inv_freq; on cos/sin an absolute 1e-6 per radian of phase (fp32 rounding of
// position * inv_freq grows with the phase, as it does in transformers).
// Observed errors are below 1.3e-7 for both.
void ExpectInvFreq(const Rotary& rotary, const std::vector<InvFreqEntry>& expected) {
  torch::Tensor inv = rotary.inv_freq();
  ASSERT_EQ(inv.scalar_type(), torch::kFloat32);
  for (const InvFreqEntry& e : expected) {
    const double got = inv[e.index].item<double>();
    EXPECT_NEAR(got, e.value, 1e-6 * std::abs(e.value)) << "inv_freq[" << e.index << "]";
  }
}

void ExpectCosSin(const Rotary& rotary, const std::vector<CosSinEntry>& expected) {
  const int64_t half = rotary.inv_freq().size(0);
  std::vector<int64_t> positions;
  for (const CosSinEntry& e : expected) positions.push_back(e.position);
  auto [cos, sin] = rotary.CosSin(torch::tensor(positions, torch::kInt64), torch::kFloat32);
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{static_cast<int64_t>(positions.size()), 2 * half}));
  ASSERT_EQ(sin.sizes(), cos.sizes());
  for (size_t r = 0; r < expected.size(); ++r) {
    const CosSinEntry& e = expected[r];
    const double phase =
        static_cast<double>(e.position) * rotary.inv_freq()[e.column].item<double>();
    const double tol = 1e-6 * std::max(1.0, phase);
    for (int64_t col : {static_cast<int64_t>(e.column), e.column + half}) {
      EXPECT_NEAR(cos[r][col].item<double>(), e.cos, tol) << "cos p=" << e.position << " c=" << col;
      EXPECT_NEAR(sin[r][col].item<double>(), e.sin, tol) << "sin p=" << e.position << " c=" << col;
    }
  }
}

Rotary MustCreate(int64_t dim, double theta, const RopeScaling& scaling, int64_t max_position) {
  auto rotary = Rotary::Create(dim, theta, scaling, max_position);
  EXPECT_TRUE(rotary.ok()) << rotary.status();
  if (!rotary.ok()) std::abort();
  return std::move(*rotary);
}

TEST(RotaryTest, DefaultMatchesTransformers) {
  // Llama-3 base: theta 500000, head_dim 128.
  //   d = default_inv_freq(128, 500000.0); [d[i] for i in idx]
  Rotary rotary = MustCreate(128, 500000.0, RopeScaling(), 131072);
  EXPECT_EQ(rotary.inv_freq().size(0), 64);
  EXPECT_DOUBLE_EQ(rotary.attention_scaling(), 1.0);
  ExpectInvFreq(rotary, {{0, 1.0},
                         {1, 0.8146172338565447},
                         {10, 0.12868737343265052},
                         {20, 0.016560440080994446},
                         {30, 0.0021311195369119653},
                         {40, 0.0002742481756762073},
                         {50, 3.529227739646723e-05},
                         {63, 2.455140791131609e-06}});
  ExpectCosSin(rotary, {{0, 5, 1.0, 0.0},
                        {1, 1, 0.686146891927544, 0.7274630180965705},
                        {7, 10, 0.6209740044990464, 0.7838311589471411},
                        {7, 63, 0.9999999998523209, 1.718598553707526e-05},
                        {100000, 40, -0.6603464519663995, 0.7509610931169387},
                        {100000, 63, 0.9700125036451384, 0.24305502005120241}});
}

TEST(RotaryTest, LinearDividesFrequenciesByFactor) {
  //   lin = [f / 4 for f in default_inv_freq(128, 10000.0)]
  RopeScaling scaling;
  scaling.kind = RopeScaling::Kind::kLinear;
  scaling.factor = 4.0;
  Rotary rotary = MustCreate(128, 10000.0, scaling, 4096);
  EXPECT_DOUBLE_EQ(rotary.attention_scaling(), 1.0);
  ExpectInvFreq(rotary, {{0, 0.25},
                         {1, 0.21649108084001634},
                         {10, 0.059284342641541386},
                         {20, 0.014058533129758726},
                         {30, 0.00333380358040831},
                         {40, 0.0007905694150420947},
                         {50, 0.00018747355233311394},
                         {63, 2.8869549617236455e-05}});
  ExpectCosSin(rotary, {{1, 1, 0.9766571899957471, 0.2148039413735489},
                        {7, 10, 0.9151201916842799, 0.40318114386926224},
                        {4000, 63, 0.9933397990439348, 0.11522171512069777}});
  // Position p under factor f is position p / f unscaled.
  Rotary plain = MustCreate(128, 10000.0, RopeScaling(), 4096);
  torch::Tensor p = torch::tensor({0.0, 4.0, 12.0, 400.0}, torch::kFloat64);
  torch::Tensor scaled = torch::outer(p, rotary.inv_freq().to(torch::kFloat64));
  torch::Tensor unscaled = torch::outer(p / 4, plain.inv_freq().to(torch::kFloat64));
  EXPECT_TRUE(torch::allclose(scaled, unscaled, 1e-6, 1e-9));
}

TEST(RotaryTest, Llama3MatchesTransformers) {
  // Llama-3.1: factor 8, low_freq_factor 1, high_freq_factor 4,
  // original_max_position_embeddings 8192, theta 500000, head_dim 128.
  //   L = llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192)
  // Indices 0..28 keep their frequency (28: wavelength 1956 < 2048), 29..34
  // are smoothed, 35.. are divided by 8 (35: wavelength 8219 > 8192).
  RopeScaling scaling;
  scaling.kind = RopeScaling::Kind::kLlama3;
  scaling.factor = 8.0;
  scaling.low_freq_factor = 1.0;
  scaling.high_freq_factor = 4.0;
  scaling.original_max_position_embeddings = 8192;
  Rotary rotary = MustCreate(128, 500000.0, scaling, 131072);
  EXPECT_DOUBLE_EQ(rotary.attention_scaling(), 1.0);
  ExpectInvFreq(rotary, {{0, 1.0},
                         {20, 0.016560440080994446},
                         {28, 0.0032114459947525913},
                         {29, 0.002166570763503359},
                         {31, 0.0008567514129196321},
                         {34, 0.00017850781276799638},
                         {35, 9.556212353964683e-05},
                         {50, 4.411534674558404e-06},
                         {63, 3.068925988914511e-07}});
  ExpectCosSin(rotary, {{1, 1, 0.686146891927544, 0.7274630180965705},
                        {7, 31, 0.9999820164908046, 0.005997223939801528},
                        {7, 34, 0.9999992193066407, 0.0012495543642029416},
                        {100000, 40, -0.9592361403362403, -0.2826057803245234},
                        {100000, 63, 0.999529121622777, 0.030684442768282773}});
}

TEST(RotaryTest, YarnMatchesTransformers) {
  // Qwen's recommended yarn: factor 4, original_max_position_embeddings
  // 32768, theta 1e6, head_dim 128, beta_fast 32, beta_slow 1.
  //   Y, att = yarn(128, 1e6, 4.0, 32768)  # ramp from low 23 to high 40
  // attention_factor = 0.1 * ln(4) + 1 = 1.138629436111989, applied to cos
  // and sin. (transformers releases before the fix of issue #38224 replaced
  // `factor` by max_position_embeddings / original_max_position_embeddings
  // when the latter is given; the fixed code and every other engine use the
  // configured factor, as here.)
  RopeScaling scaling;
  scaling.kind = RopeScaling::Kind::kYarn;
  scaling.factor = 4.0;
  scaling.original_max_position_embeddings = 32768;
  Rotary rotary = MustCreate(128, 1e6, scaling, 32768);
  EXPECT_NEAR(rotary.attention_scaling(), 1.138629436111989, 1e-12);
  ExpectInvFreq(rotary, {{0, 1.0},
                         {22, 0.008659643233600653},
                         {23, 0.006978305848598663},
                         {24, 0.005375321490790102},
                         {30, 0.0010643609812470017},
                         {39, 6.490394320837028e-05},
                         {40, 4.445698525097307e-05},
                         {41, 3.582531425592407e-05},
                         {63, 3.102344401879299e-07}});
  ExpectCosSin(rotary, {{0, 3, 1.138629436111989, 0.0},
                        {1, 0, 0.6152041098606474, 0.9581236329364153},
                        {7, 24, 1.1378234897506985, 0.04283338595357962},
                        {7, 30, 1.138597833398566, 0.008483310721511086},
                        {100000, 41, -1.029721129819549, -0.4859541002850556},
                        {100000, 63, 1.1380815407852716, 0.03531854052092713}});

  // Without original_max_position_embeddings transformers uses
  // max_position_embeddings for the correction range.
  RopeScaling implicit = scaling;
  implicit.original_max_position_embeddings.reset();
  Rotary same = MustCreate(128, 1e6, implicit, 32768);
  EXPECT_TRUE(torch::equal(same.inv_freq(), rotary.inv_freq()));
  EXPECT_DOUBLE_EQ(same.attention_scaling(), rotary.attention_scaling());

  // An explicit attention_factor wins.
  RopeScaling explicit_factor = scaling;
  explicit_factor.attention_factor = 0.75;
  EXPECT_DOUBLE_EQ(MustCreate(128, 1e6, explicit_factor, 32768).attention_scaling(), 0.75);
}

TEST(RotaryTest, YarnWithMscaleMatchesTransformers) {
  // DeepSeek-style: rope dim 64, theta 10000, factor 40, original 4096 (so
  // max_position_embeddings 163840 = 40 * 4096 and every transformers version
  // agrees on the factor), mscale 1.0, mscale_all_dim 0.5.
  //   Y2, att2 = yarn(64, 10000.0, 40.0, 4096, mscale=1.0, mscale_all_dim=0.5)
  //   # ramp from low 10 to high 23;
  //   # att2 = (0.1*ln 40 + 1) / (0.05*ln 40 + 1) = 1.1557219901962608
  RopeScaling scaling;
  scaling.kind = RopeScaling::Kind::kYarn;
  scaling.factor = 40.0;
  scaling.original_max_position_embeddings = 4096;
  scaling.mscale = 1.0;
  scaling.mscale_all_dim = 0.5;
  Rotary rotary = MustCreate(64, 10000.0, scaling, 163840);
  EXPECT_NEAR(rotary.attention_scaling(), 1.1557219901962608, 1e-12);
  ExpectInvFreq(rotary, {{0, 1.0},
                         {9, 0.07498942093324558},
                         {10, 0.056234132519034905},
                         {11, 0.03900692656714386},
                         {16, 0.0055},
                         {22, 0.0001778279410038922},
                         {23, 3.33380358040831e-05},
                         {24, 2.5e-05},
                         {31, 3.33380358040831e-06}});
  ExpectCosSin(rotary, {{1, 0, 0.6244392562455553, 0.9725065212545897},
                        {7, 16, 1.1548655615308996, 0.04448430524494967},
                        {150000, 31, 1.0142023791053936, 0.5541541778604264}});

  // mscale without mscale_all_dim: transformers falls back to
  // 0.1 * ln(factor) + 1 = 1.3688879454113936.
  RopeScaling only_mscale = scaling;
  only_mscale.mscale = 0.707;
  only_mscale.mscale_all_dim.reset();
  EXPECT_NEAR(MustCreate(64, 10000.0, only_mscale, 163840).attention_scaling(), 1.3688879454113936,
              1e-12);
}

// transformers tests `if mscale and mscale_all_dim`, so a zero counts as
// unset and the attention factor falls back to 0.1 * ln(factor) + 1.
// Disabled: Rotary::Create tests has_value() (common/torch/blocks.cc) and
// returns (0.1 * 0.707 * ln 40 + 1) / 1 = 1.2608037774058554 here.
TEST(RotaryTest, YarnZeroMscaleAllDimFallsBackLikeTransformers) {
  RopeScaling scaling;
  scaling.kind = RopeScaling::Kind::kYarn;
  scaling.factor = 40.0;
  scaling.original_max_position_embeddings = 4096;
  scaling.mscale = 0.707;
  scaling.mscale_all_dim = 0.0;
  EXPECT_NEAR(MustCreate(64, 10000.0, scaling, 163840).attention_scaling(), 1.3688879454113936,
              1e-12);
}

TEST(RotaryTest, RefusesBadArguments) {
  EXPECT_FALSE(Rotary::Create(7, 10000.0, RopeScaling(), 4096).ok());
  EXPECT_FALSE(Rotary::Create(0, 10000.0, RopeScaling(), 4096).ok());
  EXPECT_FALSE(Rotary::Create(8, 0.0, RopeScaling(), 4096).ok());
  RopeScaling llama3;
  llama3.kind = RopeScaling::Kind::kLlama3;
  llama3.factor = 8.0;
  EXPECT_FALSE(Rotary::Create(8, 10000.0, llama3, 4096).ok());  // no original max
}

TEST(RmsNormTest, Float32MatchesHandComputation) {
  //   x = [1, -2, 3, 0.5]; w = [1, 0.5, -2, 3]; r = 1 / math.sqrt(sum(v*v for v in x) / 4 + 1e-6)
  //   [wi * xi * r for xi, wi in zip(x, w)]
  torch::Tensor x = torch::tensor({1.0f, -2.0f, 3.0f, 0.5f}).view({1, 1, 4});
  torch::Tensor w = torch::tensor({1.0f, 0.5f, -2.0f, 3.0f});
  torch::Tensor y = RmsNorm(x, w, 1e-6);
  ASSERT_EQ(y.scalar_type(), torch::kFloat32);
  ASSERT_EQ(y.sizes(), x.sizes());
  const double expected[] = {0.5298128684663219, -0.5298128684663219, -3.1788772107979315,
                             0.7947193026994829};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(y[0][0][i].item<double>(), expected[i], 1e-6 * std::abs(expected[i])) << i;
  }
  // Each row is normalized on its own.
  torch::Tensor rows = torch::stack({x.view({4}), 2 * x.view({4})});
  torch::Tensor yr = RmsNorm(rows, w, 1e-6);
  EXPECT_TRUE(torch::allclose(yr[0], yr[1], 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(yr[0], y.view({4}), 1e-6, 1e-6));
}

TEST(RmsNormTest, Bfloat16NormalizesInFloat32CastsBackThenScales) {
  // HF LlamaRMSNorm on bf16: h = x.float(); h *= rsqrt(mean(h^2) + eps);
  // weight * h.to(bf16), the product rounded to bf16. Emulated in Python with
  // round-to-nearest-even on the float32 bit pattern:
  //   def bf16(v): b = struct.unpack('<I', struct.pack('<f', v))[0]
  //                b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000; ...
  //   r = 1 / math.sqrt(sum(v*v for v in xb) / 8 + 1e-6)
  //   [bf16(wi * bf16(xi * r)) for xi, wi in zip(xb, wb)]
  // Multiplying by the weight before the cast (bf16(w * x * r)) gives
  // 0.1826171875 instead of 0.18359375 at index 6. Every intermediate is at
  // least 5e-4 (relative) away from a bf16 rounding midpoint, so fp32 vs
  // double differences cannot flip a rounding.
  const std::vector<float> xs = {0.10009765625f, -1.296875f,      2.703125f,  0.55078125f,
                                 3.296875f,      -0.02001953125f, 1.1015625f, -2.203125f};
  const std::vector<float> ws = {1.5f, 0.75f, 1.25f, -1.5f, 1.75f, 2.5f, 0.30078125f, 1.0f};
  const std::vector<float> expected = {0.0830078125f, -0.53515625f,     1.8671875f,  -0.45703125f,
                                       3.1875f,       -0.027587890625f, 0.18359375f, -1.21875f};
  torch::Tensor x = torch::tensor(xs).to(torch::kBFloat16).view({1, 8});
  torch::Tensor w = torch::tensor(ws).to(torch::kBFloat16);
  // The inputs are exact in bf16.
  ASSERT_TRUE(torch::equal(x.to(torch::kFloat32).view({8}), torch::tensor(xs)));
  torch::Tensor y = RmsNorm(x, w, 1e-6);
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  torch::Tensor got = y.to(torch::kFloat32).view({8});
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i].item<float>(), expected[i]) << i;
}

TEST(LinearTest, WeightTransposedPlusBias) {
  torch::Tensor x = torch::tensor({1.0f, 2.0f}).view({1, 2});
  torch::Tensor w = torch::tensor({1.0f, 0.0f, 3.0f, -1.0f, 0.5f, 0.5f}).view({3, 2});
  torch::Tensor b = torch::tensor({0.25f, 0.0f, -1.0f});
  EXPECT_TRUE(torch::equal(Linear(x, w), torch::tensor({1.0f, 1.0f, 1.5f}).view({1, 3})));
  EXPECT_TRUE(torch::equal(Linear(x, w, b), torch::tensor({1.25f, 1.0f, 0.5f}).view({1, 3})));
}

TEST(SwiGluMlpTest, MatchesHandComputation) {
  //   xs = [0.5, -1.0]
  //   gate = [[1, 0], [0, 1], [1, 1]]; up = [[2, 1], [-1, 0.5], [0.25, -0.75]]
  //   down = [[1, -1, 0.5], [0, 2, 1]]
  //   silu = lambda z: z / (1 + math.exp(-z))
  //   h = [silu(g) * u for g, u in zip(gate @ xs, up @ xs)]; down @ h
  torch::Tensor x = torch::tensor({0.5f, -1.0f}).view({1, 1, 2});
  torch::Tensor gate = torch::tensor({1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f}).view({3, 2});
  torch::Tensor up = torch::tensor({2.0f, 1.0f, -1.0f, 0.5f, 0.25f, -0.75f}).view({3, 2});
  torch::Tensor down = torch::tensor({1.0f, -1.0f, 0.5f, 0.0f, 2.0f, 1.0f}).view({2, 3});
  torch::Tensor y = SwiGluMlp(x, gate, up, down);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 1, 2}));
  EXPECT_NEAR(y[0][0][0].item<double>(), -0.3515284426695894, 1e-6);
  EXPECT_NEAR(y[0][0][1].item<double>(), 0.3727088001408016, 1e-6);
}

TEST(ApplyRotaryTest, RotateHalfSemantics) {
  // out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2]);
  // for x = [1, 2, 3, 4]:
  //   [1*c0 - 3*s0, 2*c1 - 4*s1, 3*c2 + 1*s2, 4*c3 + 2*s3]
  // (an interleaved GPT-J rotation would pair 1 with 2 instead).
  const float c[] = {0.5f, -0.25f, 2.0f, 1.5f};
  const float s[] = {0.125f, 1.0f, -0.5f, 0.75f};
  torch::Tensor cos = torch::tensor({c[0], c[1], c[2], c[3], 1.0f, 1.0f, 1.0f, 1.0f}).view({2, 4});
  torch::Tensor sin = torch::tensor({s[0], s[1], s[2], s[3], 0.0f, 0.0f, 0.0f, 0.0f}).view({2, 4});
  // [B=1, H=2, T=2, D=4]; head 1 is head 0 times -2.
  torch::Tensor head = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f}).view({2, 4});
  torch::Tensor x = torch::stack({head, -2 * head}).unsqueeze(0);
  torch::Tensor y = ApplyRotary(x, cos, sin);
  ASSERT_EQ(y.sizes(), x.sizes());
  const float expected[] = {1 * c[0] - 3 * s[0], 2 * c[1] - 4 * s[1], 3 * c[2] + 1 * s[2],
                            4 * c[3] + 2 * s[3]};
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(y[0][0][0][i].item<float>(), expected[i]) << i;
    EXPECT_FLOAT_EQ(y[0][1][0][i].item<float>(), -2 * expected[i]) << i;
  }
  // Position 1 has cos 1, sin 0: unchanged.
  EXPECT_TRUE(torch::equal(y[0][0][1], head[1]));
}

TEST(ApplyRotaryTest, ScoresDependOnRelativePositionOnly) {
  // With real rotary tables, <R(p) q, R(p') k> depends on p - p' only.
  Rotary rotary = MustCreate(16, 10000.0, RopeScaling(), 4096);
  torch::manual_seed(3);
  torch::Tensor q = torch::randn({16}, torch::kFloat64);
  torch::Tensor k = torch::randn({16}, torch::kFloat64);
  auto score = [&](int64_t pq, int64_t pk) {
    auto [cos, sin] = rotary.CosSin(torch::tensor({pq, pk}, torch::kInt64), torch::kFloat32);
    cos = cos.to(torch::kFloat64);
    sin = sin.to(torch::kFloat64);
    torch::Tensor rq = ApplyRotary(q.view({1, 16}), cos[0].view({1, 16}), sin[0].view({1, 16}));
    torch::Tensor rk = ApplyRotary(k.view({1, 16}), cos[1].view({1, 16}), sin[1].view({1, 16}));
    return (rq * rk).sum().item<double>();
  };
  EXPECT_NEAR(score(5, 2), score(13, 10), 1e-5);
  EXPECT_NEAR(score(3, 3), (q * k).sum().item<double>(), 1e-5);
  EXPECT_GT(std::abs(score(5, 2) - score(5, 3)), 1e-3);
}

// q [1, 4, 3, 2], k/v [1, 2, 3, 2]. Query head h must use kv head h / 2
// (repeat_kv); h % 2 would swap the kv heads of query heads 1 and 2.
struct GqaExample {
  torch::Tensor q, k, v;
};

GqaExample MakeGqaExample() {
  GqaExample e;
  e.q = torch::tensor({1.0f,  0.0f, 0.0f,  1.0f,  1.0f,  1.0f,   // head 0
                       -1.0f, 0.5f, 2.0f,  0.0f,  0.0f,  -1.0f,  // head 1
                       0.5f,  0.5f, 1.0f,  -1.0f, -2.0f, 1.0f,   // head 2
                       0.0f,  2.0f, -1.0f, -1.0f, 1.0f,  0.0f})  // head 3
            .view({1, 4, 3, 2});
  e.k = torch::tensor({1.0f, 2.0f, -1.0f, 0.0f, 0.0f, 3.0f,   // kv head 0
                       2.0f, -1.0f, 0.0f, 1.0f, 1.0f, 1.0f})  // kv head 1
            .view({1, 2, 3, 2});
  e.v = torch::tensor({1.0f, 0.0f, 0.0f, 1.0f, 2.0f, 2.0f,     // kv head 0
                       -3.0f, 1.0f, 4.0f, 0.0f, 0.0f, -2.0f})  // kv head 1
            .view({1, 2, 3, 2});
  return e;
}

void ExpectAttention(const torch::Tensor& got, const double (&expected)[4][3][2]) {
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, 4, 3, 2}));
  for (int h = 0; h < 4; ++h) {
    for (int t = 0; t < 3; ++t) {
      for (int d = 0; d < 2; ++d) {
        EXPECT_NEAR(got[0][h][t][d].item<double>(), expected[h][t][d], 1e-6)
            << "head " << h << " t " << t << " d " << d;
      }
    }
  }
}

// Python (the q/k/v above as nested lists q[h][t], k[kv][t], v[kv][t]):
//   def attend(mapping, window=None, scale=0.5):
//       out = []
//       for h in range(4):
//           kv = mapping(h); rows = []
//           for i in range(3):
//               js = [j for j in range(3) if j <= i and (window is None or i - j < window)]
//               s = [scale * sum(a*b for a, b in zip(q[h][i], k[kv][j])) for j in js]
//               m = max(s); e = [math.exp(x - m) for x in s]; z = sum(e)
//               rows.append([sum(e[n] / z * v[kv][j][d] for n, j in enumerate(js))
//                            for d in range(2)])
//           out.append(rows)
//       return out
TEST(CausalAttentionTest, GqaHeadMappingMatchesRepeatKv) {
  GqaExample e = MakeGqaExample();
  AttentionOptions options;
  options.scale = 0.5;
  //   attend(lambda h: h // 2)
  // (attend(lambda h: h % 2) differs in heads 1 and 2, e.g. head 1 t 0 is
  // {-3, 1}.)
  const double expected[4][3][2] = {
      {{1.0, 0.0}, {0.7310585786300049, 0.2689414213699951}, {1.4049315925004435, 1.0}},
      {{1.0, 0.0},
       {0.8807970779778823, 0.11920292202211755},
       {0.511712663954326, 0.9090204855439394}},
      {{-3.0, 1.0},
       {-2.1655795458451768, 0.8807970779778823},
       {2.7161809699149457, -0.48387389372549855}},
      {{-3.0, 1.0}, {0.5, 0.5}, {-0.7741462802635718, -0.10791138038134274}}};
  for (bool fused : {true, false}) {  // LibTorch's kernel (2.x) and the blockwise one
    SCOPED_TRACE(fused ? "fused" : "blockwise");
    options.fused = fused;
    ExpectAttention(CausalAttention(e.q, e.k, e.v, options), expected);
  }
}

TEST(CausalAttentionTest, FusedKernelAgreesWithBlockwise) {
  AttentionOptions fused, blockwise;
  fused.scale = blockwise.scale = 0.25;
  blockwise.fused = false;
  blockwise.max_score_elements = 2 * 8 * 70 * 16;  // several query blocks
  if (!UsesFusedAttention(fused)) GTEST_SKIP() << "this LibTorch (1.13) has no fused attention";
  EXPECT_FALSE(UsesFusedAttention(blockwise));
  AttentionOptions window = fused;
  window.sliding_window = 8;
  EXPECT_FALSE(UsesFusedAttention(window)) << "windows stay blockwise";
  torch::manual_seed(7);
  // [B 2, Hq 8, T 70, D 16] against 2 kv heads (GQA 4).
  torch::Tensor q = torch::randn({2, 8, 70, 16}), k = torch::randn({2, 2, 70, 16}),
                v = torch::randn({2, 2, 70, 16});
  torch::Tensor reference = CausalAttention(q, k, v, blockwise);
  EXPECT_TRUE(torch::allclose(CausalAttention(q, k, v, fused), reference, 1e-5, 1e-5));
  torch::Tensor bf16 = CausalAttention(q.to(torch::kBFloat16), k.to(torch::kBFloat16),
                                       v.to(torch::kBFloat16), fused);
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(bf16.to(torch::kFloat32), reference, 3e-2, 3e-2));
}

TEST(CausalAttentionTest, SlidingWindowHidesKeysAtWindowDistance) {
  GqaExample e = MakeGqaExample();
  AttentionOptions options;
  options.scale = 0.5;
  options.sliding_window = 2;  // query 2 sees keys 1 and 2 only
  //   attend(lambda h: h // 2, window=2)
  const double expected[4][3][2] = {
      {{1.0, 0.0},
       {0.7310585786300049, 0.2689414213699951},
       {1.7615941559557646, 1.8807970779778822}},
      {{1.0, 0.0},
       {0.8807970779778823, 0.11920292202211755},
       {0.36485104761271264, 1.1824255238063563}},
      {{-3.0, 1.0},
       {-2.1655795458451768, 0.8807970779778823},
       {2.9242343145200196, -0.5378828427399902}},
      {{-3.0, 1.0}, {0.5, 0.5}, {1.5101626751925818, -1.2449186624037092}}};
  ExpectAttention(CausalAttention(e.q, e.k, e.v, options), expected);
}

TEST(CausalAttentionTest, Bfloat16KeepsDtype) {
  GqaExample e = MakeGqaExample();
  AttentionOptions options;
  options.scale = 0.5;
  torch::Tensor got = CausalAttention(e.q.to(torch::kBFloat16), e.k.to(torch::kBFloat16),
                                      e.v.to(torch::kBFloat16), options);
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  torch::Tensor reference = CausalAttention(e.q, e.k, e.v, options);
  EXPECT_TRUE(torch::allclose(got.to(torch::kFloat32), reference, 2e-2, 2e-2));
}

}  // namespace
}  // namespace specstream::nn
