#include "teacher/hf_runtime.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "common/safetensors.h"
#include "common/torch/blocks.h"
#include "common/torch/process_group.h"
#include "common/torch/speculative.h"
#include "common/torch/tensor_util.h"
#include "gtest/gtest.h"
#include "teacher/decode_target.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"
#include "tests/testing/tp_forward.h"

namespace specstream::teacher {
namespace {

using specstream::testing::TinyModelOptions;
using specstream::testing::WriteTinyModel;

HfRuntimeOptions Fp32Options(const std::string& dir) {
  HfRuntimeOptions options;
  options.model_dir = dir;
  options.dtype = "float32";
  return options;
}

std::unique_ptr<HfRuntime> Load(const std::string& dir, std::vector<int> capture = {}) {
  HfRuntimeOptions options = Fp32Options(dir);
  options.capture_layer_ids = std::move(capture);
  auto runtime = HfRuntime::Create(options);
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

std::vector<int32_t> Tokens(int n, int vocab, int seed) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 7919 + seed * 104729) % vocab);
  return ids;
}

void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, double rel = 1e-5) {
  ASSERT_EQ(a.sizes(), b.sizes());
  double scale = b.abs().max().item<double>();
  double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, rel * std::max(scale, 1.0)) << "max diff " << diff << " scale " << scale;
}

TEST(HfRuntimeTest, CapturesAreTheNamedLayersOutputs) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "mistral"}) {
    specstream::testing::TempDir dir;
    TinyModelOptions model;
    model.arch = arch;
    model.layers = 8;
    WriteTinyModel(dir.path(), model);
    auto runtime = Load(dir.path());
    ASSERT_NE(runtime, nullptr) << arch;
    EXPECT_EQ(runtime->Describe().capture_layer_ids, (std::vector<int>{1, 3, 4}));
    std::vector<int32_t> ids = Tokens(21, model.vocab, 1);
    auto hidden = runtime->HiddenStates(ids);
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    ASSERT_EQ(hidden->size(), 9u);
    ForwardRequest request;
    request.sequences = {ids};
    request.want_target_ids = true;
    auto out = runtime->Forward(request);
    ASSERT_TRUE(out.ok()) << out.status();
    const SequenceCapture& c = (*out)[0];
    const int64_t H = model.hidden;
    EXPECT_EQ(c.aux_hidden.sizes(), (std::vector<int64_t>{21, 3 * H}));
    // id k = output of layer k = HF hidden_states[k + 1].
    ExpectClose(c.aux_hidden.narrow(1, 0, H), (*hidden)[2], 1e-6);
    ExpectClose(c.aux_hidden.narrow(1, H, H), (*hidden)[4], 1e-6);
    ExpectClose(c.aux_hidden.narrow(1, 2 * H, H), (*hidden)[5], 1e-6);
    EXPECT_EQ(c.target_ids.scalar_type(), torch::kInt32);
    EXPECT_EQ(c.target_ids.size(0), 21);
  }
}

TEST(HfRuntimeTest, ExplicitCaptureIdsInTheirOrder) {
  specstream::testing::TempDir dir;
  TinyModelOptions model;
  model.layers = 4;
  WriteTinyModel(dir.path(), model);
  auto runtime = Load(dir.path(), {3, 0});
  ASSERT_NE(runtime, nullptr);
  std::vector<int32_t> ids = Tokens(9, model.vocab, 2);
  auto hidden = runtime->HiddenStates(ids);
  ForwardRequest request;
  request.sequences = {ids};
  auto out = runtime->Forward(request);
  ASSERT_TRUE(out.ok() && hidden.ok());
  ExpectClose((*out)[0].aux_hidden.narrow(1, 0, model.hidden), (*hidden)[4], 1e-6);
  ExpectClose((*out)[0].aux_hidden.narrow(1, model.hidden, model.hidden), (*hidden)[1], 1e-6);
  // Below 8 layers the default ids collide: refused with a hint.
  HfRuntimeOptions options;
  options.model_dir = dir.path();
  auto refused = HfRuntime::Create(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("capture"), std::string::npos) << refused.status();
}

TEST(HfRuntimeTest, PaddedBatchEqualsOneSequenceAtATime) {
  specstream::testing::TempDir dir;
  TinyModelOptions model;
  model.arch = "qwen3";
  model.layers = 8;
  WriteTinyModel(dir.path(), model);
  auto runtime = Load(dir.path());
  ASSERT_NE(runtime, nullptr);
  std::vector<std::vector<int32_t>> seqs = {Tokens(5, model.vocab, 3), Tokens(17, model.vocab, 4),
                                            Tokens(1, model.vocab, 5)};
  ForwardRequest batch;
  batch.sequences = seqs;
  batch.want_target_ids = true;
  auto together = runtime->Forward(batch);
  ASSERT_TRUE(together.ok()) << together.status();
  for (size_t s = 0; s < seqs.size(); ++s) {
    ForwardRequest one;
    one.sequences = {seqs[s]};
    one.want_target_ids = true;
    auto alone = runtime->Forward(one);
    ASSERT_TRUE(alone.ok());
    ExpectClose((*together)[s].aux_hidden, (*alone)[0].aux_hidden);
    ExpectClose((*together)[s].last_hidden, (*alone)[0].last_hidden);
    EXPECT_TRUE(torch::equal((*together)[s].target_ids, (*alone)[0].target_ids));
  }
}

// The incremental decoding tests: a 4-layer model of the parameter's
// architecture (llama with a sliding window of 6, qwen3), capturing 1 and 3.
class HfDecodingTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    model_.arch = GetParam();
    model_.layers = 4;
    if (std::string(GetParam()) == "llama") {
      model_.edit_config = [](HfModelConfig& c) { c.sliding_window = 6; };
    }
    WriteTinyModel(dir_.path(), model_);
    runtime_ = Load(dir_.path(), {1, 3});
    ASSERT_NE(runtime_, nullptr);
  }
  specstream::testing::TempDir dir_;
  TinyModelOptions model_;
  std::unique_ptr<HfRuntime> runtime_;
};
INSTANTIATE_TEST_SUITE_P(Architectures, HfDecodingTest, ::testing::Values("llama", "qwen3"));

// Incremental decoding on the KV cache equals the full forward, whatever
// the chunks, and a truncated cache continues as if the dropped positions
// had never run (Llama with a sliding window, Qwen3 with q/k norms).
TEST_P(HfDecodingTest, ExtendOnTheKvCacheEqualsTheFullForward) {
  const std::vector<int32_t> ids = Tokens(23, model_.vocab, 7);
  ForwardRequest request;
  request.sequences = {ids};
  auto full = runtime_->Forward(request);
  ASSERT_TRUE(full.ok()) << full.status();
  KvCache cache;
  std::vector<torch::Tensor> aux, last;
  size_t at = 0;
  for (size_t chunk : {5, 1, 1, 8, 3, 5}) {
    std::vector<int32_t> part(ids.begin() + at, ids.begin() + at + chunk);
    // A rejected proposal first: run junk, then drop it.
    auto junk = runtime_->Extend(cache, Tokens(3, model_.vocab, 99));
    ASSERT_TRUE(junk.ok()) << junk.status();
    cache.Truncate(static_cast<int64_t>(at));
    auto rows = runtime_->Extend(cache, part);
    ASSERT_TRUE(rows.ok()) << rows.status();
    aux.push_back(rows->aux_hidden);
    last.push_back(rows->last_hidden);
    at += chunk;
    EXPECT_EQ(cache.length, static_cast<int64_t>(at));
  }
  ExpectClose(torch::cat(aux), (*full)[0].aux_hidden);
  ExpectClose(torch::cat(last), (*full)[0].last_hidden);
  const torch::Tensor logits = runtime_->Logits(torch::cat(last));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{23, model_.vocab}));
  request.want_target_ids = true;
  auto argmax = runtime_->Forward(request);
  ASSERT_TRUE(argmax.ok());
  EXPECT_TRUE(torch::equal(logits.argmax(-1).to(torch::kInt32), (*argmax)[0].target_ids));
  // Bad input leaves the cache as it was.
  EXPECT_EQ(runtime_->Extend(cache, {model_.vocab}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->Extend(cache, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.length, 23);
}

// Batched decoding (HfRuntime::DecodeStep through StepAnswers): three
// answers to prompts of different lengths, with different budgets and
// seeds, advanced together give exactly what each gives decoded alone by
// spec::Decode (target-only), greedy and sampled, on llama with a sliding
// window and on qwen3. Bad input changes no cache.
TEST_P(HfDecodingTest, BatchedAnswersEqualEachDecodedAlone) {
  const std::vector<std::vector<int32_t>> prompts = {
      Tokens(3, model_.vocab, 1), Tokens(9, model_.vocab, 2), Tokens(5, model_.vocab, 3)};
  const std::vector<int64_t> budgets = {10, 4, 7};
  for (double temperature : {0.0, 1.0}) {
    SCOPED_TRACE(temperature);
    std::vector<std::unique_ptr<AnswerDecoder>> batched;
    std::vector<AnswerDecoder*> all;
    std::vector<std::vector<int32_t>> alone_tokens;
    for (size_t i = 0; i < prompts.size(); ++i) {
      spec::DecodeOptions options;
      options.max_new_tokens = budgets[i];
      options.temperature = temperature;
      options.seed = 11 + i;
      DecodeTarget alone_target(*runtime_, {});
      auto alone = spec::Decode(alone_target, nullptr, prompts[i], options);
      ASSERT_TRUE(alone.ok()) << alone.status();
      batched.push_back(std::make_unique<AnswerDecoder>(options));
      ASSERT_TRUE(batched.back()->Start(*runtime_, prompts[i]).ok());
      all.push_back(batched.back().get());
      alone_tokens.push_back(alone->tokens);
    }
    int steps = 0;
    while (std::any_of(all.begin(), all.end(), [](AnswerDecoder* a) { return !a->done(); })) {
      ASSERT_TRUE(StepAnswers(*runtime_, all).ok());
      ++steps;
    }
    EXPECT_EQ(steps, 9);  // the longest budget, less the prefill's token
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(batched[i]->tokens(), alone_tokens[i]) << "answer " << i;
    }
  }
  KvCache cache;
  ASSERT_TRUE(runtime_->Extend(cache, Tokens(4, model_.vocab, 5)).ok());
  EXPECT_EQ(runtime_->DecodeStep({&cache}, {model_.vocab}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->DecodeStep({&cache}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.length, 4);
}

TEST(HfRuntimeTest, BlockwiseAttentionMatchesFullAttention) {
  torch::manual_seed(0);
  torch::Tensor q = torch::randn({2, 4, 37, 8});
  torch::Tensor k = torch::randn({2, 2, 37, 8});
  torch::Tensor v = torch::randn({2, 2, 37, 8});
  for (std::optional<int64_t> window : {std::optional<int64_t>(), std::optional<int64_t>(5)}) {
    nn::AttentionOptions small;
    small.scale = 0.3;
    small.sliding_window = window;
    small.max_score_elements = 16 * 2 * 4 * 37;  // 16-query blocks
    small.fused = false;                         // the blockwise kernel itself
    nn::AttentionOptions big = small;
    big.max_score_elements = int64_t{1} << 30;
    torch::Tensor blocked = nn::CausalAttention(q, k, v, small);
    // Reference: dense masked softmax with kv heads repeated (HF repeat_kv).
    torch::Tensor kr = k.repeat_interleave(2, 1), vr = v.repeat_interleave(2, 1);
    torch::Tensor scores = torch::matmul(q, kr.transpose(-1, -2)) * 0.3;
    torch::Tensor i = torch::arange(37).unsqueeze(1), j = torch::arange(37).unsqueeze(0);
    torch::Tensor hidden = j > i;
    if (window) hidden = hidden | (i - j >= *window);
    torch::Tensor reference =
        torch::matmul(torch::softmax(scores.masked_fill(hidden, -INFINITY), -1), vr);
    ExpectClose(blocked, reference, 1e-6);
    ExpectClose(nn::CausalAttention(q, k, v, big), reference, 1e-6);
    // What the runtimes call: LibTorch's fused kernel on 2.x (no window).
    nn::AttentionOptions runtime = small;
    runtime.fused = true;
    ExpectClose(nn::CausalAttention(q, k, v, runtime), reference, 1e-5);
  }
}

// Two TP ranks as threads in one process, each with its own Gloo group.
TEST(HfRuntimeTest, TensorParallelTwoMatchesOne) {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    specstream::testing::TempDir dir;
    TinyModelOptions model;
    model.arch = arch;
    model.layers = 8;
    model.shards = 2;
    WriteTinyModel(dir.path(), model);
    auto single = Load(dir.path());
    ASSERT_NE(single, nullptr);
    ForwardRequest request;
    request.sequences = {Tokens(13, model.vocab, 6), Tokens(30, model.vocab, 7)};
    request.want_target_ids = true;
    auto expected = single->Forward(request);
    ASSERT_TRUE(expected.ok()) << expected.status();

    HfRuntimeOptions options;
    options.model_dir = dir.path();
    options.dtype = "float32";
    auto got = specstream::testing::ForwardOnRankThreads("hf", options, 2, request);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t s = 0; s < 2; ++s) {
      ExpectClose((*got)[s].aux_hidden, (*expected)[s].aux_hidden);
      ExpectClose((*got)[s].last_hidden, (*expected)[s].last_hidden);
      EXPECT_TRUE(torch::equal((*got)[s].target_ids, (*expected)[s].target_ids)) << arch;
    }
  }
}

// ForwardRequest::capture_layer_ids (what the compute batcher asks for a
// batch of streams with their own layers) overrides the described set for
// that forward only, in its order, on one rank, under TP (the followers keep
// the described set: their captures are dropped) and on sglang.
TEST(HfRuntimeTest, RequestedCaptureLayersOverrideTheDescribedOnes) {
  specstream::testing::TempDir dir;
  TinyModelOptions model;
  model.layers = 8;
  model.shards = 2;
  WriteTinyModel(dir.path(), model);
  auto runtime = Load(dir.path());
  ASSERT_NE(runtime, nullptr);
  std::vector<int32_t> ids = Tokens(11, model.vocab, 8);
  auto hidden = runtime->HiddenStates(ids);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  ForwardRequest request;
  request.sequences = {ids, Tokens(5, model.vocab, 9)};
  request.capture_layer_ids = {7, 0, 5};
  auto out = runtime->Forward(request);
  ASSERT_TRUE(out.ok()) << out.status();
  const int64_t H = model.hidden;
  const torch::Tensor& aux = (*out)[0].aux_hidden;
  EXPECT_EQ(aux.sizes(), (std::vector<int64_t>{11, 3 * H}));
  ExpectClose(aux.narrow(1, 0, H), (*hidden)[8], 1e-6);
  ExpectClose(aux.narrow(1, H, H), (*hidden)[1], 1e-6);
  ExpectClose(aux.narrow(1, 2 * H, H), (*hidden)[6], 1e-6);
  EXPECT_EQ(runtime->Describe().capture_layer_ids, (std::vector<int>{1, 3, 4}));
  ForwardRequest plain;
  plain.sequences = {ids};
  auto described = runtime->Forward(plain);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ((*described)[0].aux_hidden.size(1), 3 * H);
  ExpectClose((*described)[0].aux_hidden.narrow(1, 0, H), (*hidden)[2], 1e-6);

  HfRuntimeOptions options;
  options.model_dir = dir.path();
  options.dtype = "float32";
  for (const char* name : {"hf", "sglang"}) {
    auto got = specstream::testing::ForwardOnRankThreads(name, options, 2, request);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    for (size_t s = 0; s < 2; ++s) {
      ExpectClose((*got)[s].aux_hidden, (*out)[s].aux_hidden);
      ExpectClose((*got)[s].last_hidden, (*out)[s].last_hidden);
    }
  }

  ForwardRequest bad = plain;
  bad.capture_layer_ids = {2, 8};
  auto refused = runtime->Forward(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("capture layer id 8 is outside [0, 8)"),
            std::string::npos)
      << refused.status();
}

TEST(HfRuntimeTest, BadRequestsAreRefusedAndRuntimeKeepsWorking) {
  specstream::testing::TempDir dir;
  TinyModelOptions model;
  model.layers = 8;
  WriteTinyModel(dir.path(), model);
  auto runtime = Load(dir.path());
  ASSERT_NE(runtime, nullptr);
  ForwardRequest bad;
  bad.sequences = {{1, 2, model.vocab}};
  auto r = runtime->Forward(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("token 2"), std::string::npos) << r.status();
  bad.sequences = {{}};
  EXPECT_EQ(runtime->Forward(bad).status().code(), absl::StatusCode::kInvalidArgument);
  ForwardRequest good;
  good.sequences = {{1, 2, 3}};
  EXPECT_TRUE(runtime->Forward(good).ok());
}

TEST(HfRuntimeTest, BrokenCheckpointsAreRefusedByName) {
  specstream::testing::TempDir dir;
  TinyModelOptions model;
  model.layers = 8;
  model.shards = 2;
  WriteTinyModel(dir.path(), model);
  // Heads not divisible by TP.
  HfRuntimeOptions options;
  options.model_dir = dir.path();
  options.tp_size = 3;
  options.tp_rank = 0;
  options.group = c10::intrusive_ptr<CommGroup>();
  auto tp3 = HfRuntime::Create(options);
  ASSERT_FALSE(tp3.ok());

  // A config that does not match the weights: the tensor is named.
  std::string config = specstream::testing::ReadFile(dir.Join("config.json"));
  std::string wrong = config;
  size_t at = wrong.find("\"intermediate_size\": ");
  ASSERT_NE(at, std::string::npos);
  wrong.replace(at, std::string("\"intermediate_size\": ").size() + 2, "\"intermediate_size\": 96");
  specstream::testing::WriteFile(dir.Join("config.json"), wrong);
  auto mismatch = HfRuntime::Create(Fp32Options(dir.path()));
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("mlp.gate_proj.weight"), std::string::npos)
      << mismatch.status();
  specstream::testing::WriteFile(dir.Join("config.json"), config);

  // A missing shard.
  std::filesystem::rename(dir.Join("model-00002-of-00002.safetensors"), dir.Join("moved"));
  auto missing = HfRuntime::Create(Fp32Options(dir.path()));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model-00002-of-00002"), std::string::npos)
      << missing.status();
  // A truncated shard.
  std::string bytes = specstream::testing::ReadFile(dir.Join("moved"));
  specstream::testing::WriteFile(dir.Join("model-00002-of-00002.safetensors"),
                                 bytes.substr(0, bytes.size() - 10));
  auto truncated = HfRuntime::Create(Fp32Options(dir.path()));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("model-00002-of-00002"), std::string::npos)
      << truncated.status();
}

}  // namespace
}  // namespace specstream::teacher

namespace specstream::teacher {
namespace {

// init-random's weights must make predictions depend on the input, or a draft
// has nothing to learn.
TEST(HfRuntimeInitTest, RandomTeacherArgmaxIsDiverse) {
  for (const char* dtype : {"float32", "bfloat16"}) {
    specstream::testing::TempDir dir;
    TinyModelOptions model;
    model.arch = "qwen3";
    model.layers = 8;
    model.hidden = 64;
    model.heads = 4;
    model.kv_heads = 2;
    model.intermediate = 128;
    model.vocab = 2048;
    model.dtype = dtype;
    WriteTinyModel(dir.path(), model);
    HfRuntimeOptions options;
    options.model_dir = dir.path();
    auto runtime = HfRuntime::Create(options);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    std::vector<int32_t> ids;
    uint64_t state = 12345;
    for (int i = 0; i < 1000; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      ids.push_back(static_cast<int32_t>((state >> 33) % model.vocab));
    }
    ForwardRequest request;
    request.sequences = {ids};
    request.want_target_ids = true;
    auto out = (*runtime)->Forward(request);
    ASSERT_TRUE(out.ok()) << out.status();
    torch::Tensor target = (*out)[0].target_ids;
    int64_t distinct = std::get<0>(torch::_unique(target)).numel();
    EXPECT_GE(distinct, 100) << dtype;
    // ... and on context, not only on the current token: the same token at
    // different positions gets different predictions somewhere.
    std::map<int32_t, std::set<int32_t>> by_token;
    for (int i = 0; i < 1000; ++i) by_token[ids[i]].insert(target[i].item<int32_t>());
    int context_dependent = 0;
    for (const auto& [token, predictions] : by_token) context_dependent += predictions.size() > 1;
    EXPECT_GT(context_dependent, 0) << dtype;
    std::cout << dtype << ": " << distinct << " distinct argmax values over 1000 tokens, "
              << context_dependent << " tokens with context-dependent predictions\n";
  }
}

}  // namespace
}  // namespace specstream::teacher
