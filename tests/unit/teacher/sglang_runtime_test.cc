// The sglang runtime against the hf runtime on tiny random dense checkpoints
// (fp32): same captures for every family, packed ragged batches equal to one
// sequence at a time, tensor parallelism, and the same refusals. On MoE
// checkpoints (qwen3_moe with a shared expert, mixtral): every TP/EP layout
// against a token-by-token expert loop, and the layouts refused before load.
#include "teacher/sglang_runtime.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "common/torch/process_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "teacher/hf_runtime.h"
#include "teacher/model_weights.h"
#include "teacher/tp_launcher.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"
#include "tests/testing/tp_forward.h"

namespace specstream::teacher {
namespace {

using specstream::testing::ForwardOnRankThreads;
using specstream::testing::RandomTokens;
using specstream::testing::TempDir;
using specstream::testing::TinyModelOptions;
using specstream::testing::WriteTinyModel;
using ::testing::HasSubstr;

constexpr double kRelTolerance = 1e-5;

TargetRuntimeOptions Options(const std::string& dir) {
  TargetRuntimeOptions options;
  options.model_dir = dir;
  options.dtype = "float32";
  return options;
}

std::unique_ptr<SglangRuntime> LoadSglang(const std::string& dir) {
  auto runtime = SglangRuntime::Create(Options(dir));
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

std::unique_ptr<HfRuntime> LoadHf(const std::string& dir) {
  auto runtime = HfRuntime::Create(Options(dir));
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

// Max absolute difference, relative to max(|b|, 1).
double RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1.0);
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>() / scale;
}

// Compares every capture; returns the largest relative difference seen.
double ExpectSameCaptures(const std::vector<SequenceCapture>& got,
                          const std::vector<SequenceCapture>& want, const std::string& what) {
  double worst = 0;
  EXPECT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < std::min(got.size(), want.size()); ++s) {
    const std::string where = what + " sequence " + std::to_string(s);
    EXPECT_EQ(got[s].aux_hidden.sizes(), want[s].aux_hidden.sizes()) << where;
    EXPECT_EQ(got[s].last_hidden.sizes(), want[s].last_hidden.sizes()) << where;
    if (got[s].aux_hidden.sizes() != want[s].aux_hidden.sizes() ||
        got[s].last_hidden.sizes() != want[s].last_hidden.sizes()) {
      continue;
    }
    EXPECT_EQ(got[s].aux_hidden.scalar_type(), want[s].aux_hidden.scalar_type()) << where;
    const double aux = RelDiff(got[s].aux_hidden, want[s].aux_hidden);
    const double last = RelDiff(got[s].last_hidden, want[s].last_hidden);
    EXPECT_LE(aux, kRelTolerance) << where << " aux_hidden";
    EXPECT_LE(last, kRelTolerance) << where << " last_hidden";
    worst = std::max({worst, aux, last});
    EXPECT_EQ(got[s].target_ids.defined(), want[s].target_ids.defined()) << where;
    if (want[s].target_ids.defined() && got[s].target_ids.defined()) {
      EXPECT_TRUE(torch::equal(got[s].target_ids, want[s].target_ids)) << where << " target_ids";
    }
  }
  return worst;
}

// Lengths skewed about 10:1, in an order that is neither sorted nor uniform.
ForwardRequest SkewedRequest(int vocab) {
  ForwardRequest request;
  for (int n : {7, 70, 1, 12, 64, 3}) request.sequences.push_back(RandomTokens(n, vocab, n + 11));
  request.want_target_ids = true;
  return request;
}

TEST(SglangRuntimeTest, MatchesHfRuntimeForEveryDenseFamily) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "mistral"}) {
    for (bool tie : {false, true}) {
      TempDir dir;
      TinyModelOptions model;
      model.arch = arch;
      model.tie_embeddings = tie;
      model.shards = 2;
      WriteTinyModel(dir.path(), model);
      auto hf = LoadHf(dir.path());
      auto sglang = LoadSglang(dir.path());
      ASSERT_NE(hf, nullptr);
      ASSERT_NE(sglang, nullptr);
      EXPECT_EQ(sglang->Describe().runtime, "sglang");
      EXPECT_EQ(sglang->Describe().capture_layer_ids, hf->Describe().capture_layer_ids);
      EXPECT_EQ(sglang->Describe().hidden_size, hf->Describe().hidden_size);

      const ForwardRequest request = SkewedRequest(model.vocab);
      auto want = hf->Forward(request);
      auto got = sglang->Forward(request);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      const std::string what = std::string(arch) + (tie ? " tied" : "");
      const double worst = ExpectSameCaptures(*got, *want, what);
      std::cout << "[ sglang vs hf ] " << what << ": max relative difference " << worst << "\n";
    }
  }
}

// Mistral's sliding window applies within each packed segment as it does in
// each padded row (the window is shorter than the longer sequences).
TEST(SglangRuntimeTest, SlidingWindowMatchesHf) {
  TempDir dir;
  TinyModelOptions model;
  model.arch = "mistral";
  model.edit_config = [](HfModelConfig& c) { c.sliding_window = 5; };
  WriteTinyModel(dir.path(), model);
  auto hf = LoadHf(dir.path());
  auto sglang = LoadSglang(dir.path());
  ASSERT_NE(hf, nullptr);
  ASSERT_NE(sglang, nullptr);
  const ForwardRequest request = SkewedRequest(model.vocab);
  auto want = hf->Forward(request);
  auto got = sglang->Forward(request);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  const double worst = ExpectSameCaptures(*got, *want, "mistral window 5");
  std::cout << "[ sglang vs hf ] mistral sliding window 5: max relative difference " << worst
            << "\n";
}

// In bfloat16 (a target's usual dtype) the two runtimes give the same
// captures bit for bit, padded (hf) against packed (sglang): a draft trained
// from either store is then the same draft (runtime_parity_test). This needs
// hf's attention to run per sequence over padding, since both attention
// kernels round by the key count.
TEST(SglangRuntimeTest, Bfloat16CapturesEqualHfBitForBit) {
  TempDir dir;
  TinyModelOptions model;
  model.arch = "qwen3";
  model.layers = 8;
  WriteTinyModel(dir.path(), model);
  TargetRuntimeOptions options = Options(dir.path());
  options.dtype = "bfloat16";
  auto hf = HfRuntime::Create(options);
  auto sglang = SglangRuntime::Create(options);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(sglang.ok()) << sglang.status();
  const ForwardRequest request = SkewedRequest(model.vocab);
  auto want = (*hf)->Forward(request);
  auto got = (*sglang)->Forward(request);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t s = 0; s < want->size(); ++s) {
    const SequenceCapture &g = (*got)[s], &w = (*want)[s];
    ASSERT_EQ(w.aux_hidden.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(g.aux_hidden, w.aux_hidden))
        << "sequence " << s << " aux_hidden differs by up to "
        << RelDiff(g.aux_hidden, w.aux_hidden);
    EXPECT_TRUE(torch::equal(g.last_hidden, w.last_hidden))
        << "sequence " << s << " last_hidden differs by up to "
        << RelDiff(g.last_hidden, w.last_hidden);
    EXPECT_TRUE(torch::equal(g.target_ids, w.target_ids)) << "sequence " << s;
  }
}

// Runs SkewedRequest packed and each of its sequences alone; expects the same
// captures and prints the largest difference.
void ExpectPackedEqualsOneAtATime(const TinyModelOptions& model, const std::string& what) {
  TempDir dir;
  WriteTinyModel(dir.path(), model);
  auto sglang = LoadSglang(dir.path());
  ASSERT_NE(sglang, nullptr);
  const ForwardRequest packed = SkewedRequest(model.vocab);
  auto got = sglang->Forward(packed);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<SequenceCapture> want;
  for (const auto& seq : packed.sequences) {
    ForwardRequest one;
    one.sequences = {seq};
    one.want_target_ids = true;
    auto single = sglang->Forward(one);
    ASSERT_TRUE(single.ok()) << single.status();
    want.push_back((*single)[0]);
  }
  const double worst = ExpectSameCaptures(*got, want, what);
  std::cout << "[ packed vs one at a time ] " << what << ": max relative difference " << worst
            << "\n";
}

TEST(SglangRuntimeTest, PackedBatchEqualsOneSequenceAtATime) {
  for (const char* arch : {"llama", "qwen3"}) {
    TinyModelOptions model;
    model.arch = arch;
    ExpectPackedEqualsOneAtATime(model, arch);
  }
}

// A sequence's captures do not depend on its neighbours: the same sequence
// packed after different ones gives the same rows (no cross-segment leak, RoPE
// restarts at 0).
TEST(SglangRuntimeTest, SegmentsDoNotSeeEachOther) {
  TempDir dir;
  TinyModelOptions model;
  WriteTinyModel(dir.path(), model);
  auto sglang = LoadSglang(dir.path());
  ASSERT_NE(sglang, nullptr);
  const auto probe = RandomTokens(9, model.vocab, 3);
  ForwardRequest a, b;
  a.sequences = {RandomTokens(20, model.vocab, 1), probe};
  b.sequences = {RandomTokens(5, model.vocab, 2), probe};
  auto ga = sglang->Forward(a);
  auto gb = sglang->Forward(b);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_LE(RelDiff((*ga)[1].aux_hidden, (*gb)[1].aux_hidden), kRelTolerance);
  EXPECT_LE(RelDiff((*ga)[1].last_hidden, (*gb)[1].last_hidden), kRelTolerance);
}

TEST(SglangRuntimeTest, TensorParallelTwoMatchesOne) {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    TempDir dir;
    TinyModelOptions model;
    model.arch = arch;
    WriteTinyModel(dir.path(), model);
    auto single = LoadSglang(dir.path());
    ASSERT_NE(single, nullptr);
    const ForwardRequest request = SkewedRequest(model.vocab);
    auto expected = single->Forward(request);
    ASSERT_TRUE(expected.ok()) << expected.status();

    auto got = ForwardOnRankThreads("sglang", Options(dir.path()), 2, request);
    ASSERT_TRUE(got.ok()) << got.status();
    const double worst = ExpectSameCaptures(*got, *expected, arch);
    std::cout << "[ sglang tp2 vs tp1 ] " << arch << ": max relative difference " << worst << "\n";
  }
}

TEST(SglangRuntimeTest, BadRequestsAreRefusedAndRuntimeKeepsWorking) {
  TempDir dir;
  TinyModelOptions model;
  WriteTinyModel(dir.path(), model);
  auto sglang = LoadSglang(dir.path());
  ASSERT_NE(sglang, nullptr);
  ForwardRequest empty;
  EXPECT_EQ(sglang->Forward(empty).status().code(), absl::StatusCode::kInvalidArgument);
  ForwardRequest bad;
  bad.sequences = {RandomTokens(4, model.vocab, 1), {}};
  EXPECT_EQ(sglang->Forward(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.sequences = {{1, 2, model.vocab}};
  EXPECT_EQ(sglang->Forward(bad).status().code(), absl::StatusCode::kInvalidArgument);
  ForwardRequest good;
  good.sequences = {RandomTokens(4, model.vocab, 1)};
  EXPECT_TRUE(sglang->Forward(good).ok());
}

TEST(SglangRuntimeTest, RuntimeIsChosenByName) {
  TempDir dir;
  TinyModelOptions model;
  WriteTinyModel(dir.path(), model);
  auto sglang = CreateTargetRuntime("sglang", Options(dir.path()));
  ASSERT_TRUE(sglang.ok()) << sglang.status();
  EXPECT_EQ((*sglang)->Describe().runtime, "sglang");
  auto hf = CreateTargetRuntime("hf", Options(dir.path()));
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->Describe().runtime, "hf");
  auto unknown = CreateTargetRuntime("vllm", Options(dir.path()));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("--runtime"), std::string::npos);
}

// A tiny MoE target whose sizes allow TP 4 and EP 4.
TinyModelOptions MoeModel(const std::string& arch) {
  TinyModelOptions model;
  model.arch = arch;
  model.kv_heads = 4;
  model.intermediate = 16;
  model.experts = 4;
  model.top_k = 2;
  if (arch == "qwen3_moe") model.shared_expert_intermediate = 16;
  return model;
}

TEST(SglangRuntimeMoeTest, EveryExpertParallelLayoutMatchesThePerTokenLoop) {
  TinyModelOptions with_dense_layers = MoeModel("qwen3_moe");
  with_dense_layers.mlp_only_layers = {0, 5};  // dense MLPs among the sparse layers
  const std::vector<std::pair<std::string, TinyModelOptions>> models = {
      {"qwen3_moe", MoeModel("qwen3_moe")},
      {"mixtral", MoeModel("mixtral")},
      {"qwen3_moe with dense layers 0,5", with_dense_layers}};
  for (const auto& [arch, model] : models) {
    TempDir dir;
    WriteTinyModel(dir.path(), model);
    TargetRuntimeOptions reference = Options(dir.path());
    reference.moe_per_token_loop = true;
    auto loop = SglangRuntime::Create(reference);
    ASSERT_TRUE(loop.ok()) << loop.status();
    const ForwardRequest request = SkewedRequest(model.vocab);
    auto want = (*loop)->Forward(request);
    ASSERT_TRUE(want.ok()) << want.status();
    for (auto [tp, ep] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 4}}) {
      TargetRuntimeOptions options = Options(dir.path());
      options.ep_size = ep;
      auto got = ForwardOnRankThreads("sglang", options, tp, request);
      ASSERT_TRUE(got.ok()) << arch << " tp " << tp << " ep " << ep << ": " << got.status();
      const std::string what =
          std::string(arch) + " tp " + std::to_string(tp) + " ep " + std::to_string(ep);
      const double worst = ExpectSameCaptures(*got, *want, what);
      std::cout << "[ sglang MoE vs per-token loop ] " << what << ": max relative difference "
                << worst << "\n";
    }
  }
}

TEST(SglangRuntimeMoeTest, PackedBatchEqualsOneSequenceAtATime) {
  ExpectPackedEqualsOneAtATime(MoeModel("qwen3_moe"), "qwen3_moe");
}

// The experts matter: dropping the top-1 expert's weight (top-k 1 instead of
// 2) changes the captures, so the comparisons above compare real routing.
TEST(SglangRuntimeMoeTest, RoutingChangesTheCaptures) {
  TempDir two, one;
  TinyModelOptions model = MoeModel("mixtral");
  WriteTinyModel(two.path(), model);
  model.top_k = 1;
  WriteTinyModel(one.path(), model);
  auto a = LoadSglang(two.path());
  auto b = LoadSglang(one.path());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const ForwardRequest request = SkewedRequest(model.vocab);
  auto ga = a->Forward(request);
  auto gb = b->Forward(request);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_GT(RelDiff((*ga)[1].last_hidden, (*gb)[1].last_hidden), 1e-3);
}

TEST(SglangRuntimeMoeTest, ImpossibleLayoutsAreRefusedBeforeLoad) {
  TempDir dir;
  WriteTinyModel(dir.path(), MoeModel("qwen3_moe"));
  auto config = LoadHfConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  struct Case {
    int tp, ep;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {2, 4, "does not divide the tensor-parallel size 2"},
           {3, 3, "num_attention_heads 4 is not divisible"},
           {4, 0, "--ep 0 must be at least 1"},
       }) {
    absl::Status status = CheckParallelLayout(*config, ParallelLayout{0, c.tp, c.ep});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.tp << "/" << c.ep;
    EXPECT_THAT(status.message(), HasSubstr(c.says));
  }
  HfModelConfig experts = *config;
  experts.num_experts = 6;  // 6 experts over EP 4
  EXPECT_THAT(CheckParallelLayout(experts, ParallelLayout{0, 4, 4}).message(),
              HasSubstr("num_experts 6 is not divisible by the expert-parallel size --ep 4"));
  HfModelConfig inter = *config;
  inter.moe_intermediate_size = 6;  // sliced over tp / ep = 4
  EXPECT_THAT(CheckParallelLayout(inter, ParallelLayout{0, 4, 1}).message(),
              HasSubstr("moe_intermediate_size 6 is not divisible by the expert tensor-parallel "
                        "size 4"));
  // With EP 2 the experts are sliced over tp / ep = 2 ranks only.
  EXPECT_TRUE(CheckParallelLayout(inter, ParallelLayout{0, 4, 2}).ok());

  // Through the runtimes: EP on a dense model, MoE on the hf runtime.
  TempDir dense;
  WriteTinyModel(dense.path(), TinyModelOptions());
  TargetRuntimeOptions ep = Options(dense.path());
  ep.ep_size = 2;
  ep.tp_size = 2;
  auto refused = SglangRuntime::Create(ep);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("has no experts"));
  auto hf = HfRuntime::Create(Options(dir.path()));
  EXPECT_EQ(hf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hf.status().message(), HasSubstr("--runtime sglang"));
  TargetRuntimeOptions loop = Options(dir.path());
  loop.moe_per_token_loop = true;
  loop.tp_size = 2;
  EXPECT_EQ(SglangRuntime::Create(loop).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specstream::teacher
