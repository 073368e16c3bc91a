// Family specifics of the hf runtime on tiny random checkpoints (fp32): qwen2
// q/k/v biases, qwen3 q/k norms, tied embeddings, rope scaling, mistral's
// sliding window, sharding, max_position_embeddings and long sequences.
//
// Most checks compare HfRuntime::HiddenStates layer by layer against a
// reference decoder layer written here in plain LibTorch ops, in float64, in
// the shape of transformers' eager code (repeat_kv, a dense masked softmax),
// with rope tables from the formulas or from constants computed in Python.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hf_config.h"
#include "common/safetensors.h"
#include "common/torch/tensor_util.h"
#include "gtest/gtest.h"
#include "teacher/hf_runtime.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::teacher {
namespace {

using specstream::testing::RandomTokens;
using specstream::testing::TempDir;
using specstream::testing::TinyModelOptions;
using specstream::testing::WriteTinyModel;

std::unique_ptr<HfRuntime> Load(const std::string& dir, std::vector<int> capture,
                                int64_t max_score_elements = int64_t{1} << 24) {
  HfRuntimeOptions options;
  options.model_dir = dir;
  options.dtype = "float32";
  options.capture_layer_ids = std::move(capture);
  options.max_score_elements = max_score_elements;
  auto runtime = HfRuntime::Create(options);
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

SequenceCapture ForwardOne(HfRuntime& runtime, const std::vector<int32_t>& ids,
                           bool want_target_ids = false) {
  ForwardRequest request;
  request.sequences = {ids};
  request.want_target_ids = want_target_ids;
  auto out = runtime.Forward(request);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0] : SequenceCapture();
}

// Max absolute difference, relative to max(|b|, 1).
double RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1.0);
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>() / scale;
}

void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, double rel,
                 const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_LE(RelDiff(a, b), rel) << what;
}

// Differences well above fp32 noise.
void ExpectDifferent(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_GT(RelDiff(a, b), 1e-3) << what;
}

// Rewrites a single-file checkpoint, passing every tensor (as float32)
// through `edit`.
void RewriteCheckpoint(
    const std::string& dir,
    const std::function<torch::Tensor(const std::string&, torch::Tensor)>& edit) {
  SafetensorsWriter writer;
  {
    auto checkpoint = CheckpointTensors::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    ASSERT_EQ((*checkpoint)->shard_paths().size(), 1u);
    for (const std::string& name : (*checkpoint)->names()) {
      auto view = (*checkpoint)->Get(name);
      ASSERT_TRUE(view.ok()) << view.status();
      auto tensor = TensorFromView(*view, torch::kFloat32);
      ASSERT_TRUE(tensor.ok()) << tensor.status();
      torch::Tensor edited = edit(name, *tensor);
      ASSERT_TRUE(AddTensor(writer, name, edited.to(torch::kFloat32)).ok()) << name;
    }
  }
  absl::Status status = writer.WriteFile(dir + "/model.safetensors");
  ASSERT_TRUE(status.ok()) << status;
}

// All checkpoint tensors as float64.
std::map<std::string, torch::Tensor> ReadWeights(const std::string& dir) {
  std::map<std::string, torch::Tensor> weights;
  auto checkpoint = CheckpointTensors::Open(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  if (!checkpoint.ok()) return weights;
  for (const std::string& name : (*checkpoint)->names()) {
    auto view = (*checkpoint)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    auto tensor = TensorFromView(*view, torch::kFloat64);
    EXPECT_TRUE(tensor.ok()) << tensor.status();
    if (tensor.ok()) weights[name] = *tensor;
  }
  return weights;
}

// Rope as the reference layer applies it: cos/sin = att * cos/sin(p * f) for
// (possibly fractional) positions p and frequencies f.
struct RefRope {
  std::vector<double> inv_freq;
  double attention_scaling = 1.0;
  std::vector<double> positions;
};

std::vector<double> DefaultInvFreq(int64_t dim, double theta) {
  std::vector<double> inv;
  for (int64_t i = 0; i < dim; i += 2) inv.push_back(1.0 / std::pow(theta, double(i) / dim));
  return inv;
}

std::vector<double> Positions(int64_t t, double divisor = 1.0) {
  std::vector<double> p;
  for (int64_t i = 0; i < t; ++i) p.push_back(static_cast<double>(i) / divisor);
  return p;
}

torch::Tensor RefRmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x * torch::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// transformers' eager decoder layer i on h [T, H] (float64).
torch::Tensor RefLayer(std::map<std::string, torch::Tensor>& w, const HfModelConfig& c, int i,
                       const torch::Tensor& h, const RefRope& rope, std::optional<int64_t> window) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t t = h.size(0), d = c.head_dim;
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  auto proj = [&](const torch::Tensor& x, const std::string& name) {
    torch::Tensor y = torch::matmul(x, w.at(p + name + ".weight").t());
    auto bias = w.find(p + name + ".bias");
    return bias == w.end() ? y : y + bias->second;
  };
  torch::Tensor x = RefRmsNorm(h, w.at(p + "input_layernorm.weight"), c.rms_norm_eps);
  torch::Tensor q = proj(x, "self_attn.q_proj").view({t, hq, d});
  torch::Tensor k = proj(x, "self_attn.k_proj").view({t, hkv, d});
  torch::Tensor v = proj(x, "self_attn.v_proj").view({t, hkv, d});
  if (w.count(p + "self_attn.q_norm.weight")) {
    q = RefRmsNorm(q, w.at(p + "self_attn.q_norm.weight"), c.rms_norm_eps);
    k = RefRmsNorm(k, w.at(p + "self_attn.k_norm.weight"), c.rms_norm_eps);
  }
  torch::Tensor freqs = torch::outer(torch::tensor(rope.positions, torch::kFloat64),
                                     torch::tensor(rope.inv_freq, torch::kFloat64));
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  torch::Tensor cos = emb.cos() * rope.attention_scaling;
  torch::Tensor sin = emb.sin() * rope.attention_scaling;
  q = q.transpose(0, 1);  // [Hq, T, D]
  k = k.transpose(0, 1);
  v = v.transpose(0, 1);
  q = q * cos + RotateHalf(q) * sin;
  k = k * cos + RotateHalf(k) * sin;
  // repeat_kv: query head j reads kv head j / (Hq / Hkv).
  k = k.repeat_interleave(hq / hkv, 0);
  v = v.repeat_interleave(hq / hkv, 0);
  torch::Tensor scores = torch::matmul(q, k.transpose(1, 2)) / std::sqrt(double(d));
  torch::Tensor qi = torch::arange(t).unsqueeze(1), kj = torch::arange(t).unsqueeze(0);
  torch::Tensor hidden = kj > qi;
  if (window) hidden = hidden | (qi - kj >= *window);
  torch::Tensor probs = torch::softmax(scores.masked_fill(hidden, -INFINITY), -1);
  torch::Tensor a = torch::matmul(probs, v).transpose(0, 1).reshape({t, hq * d});
  torch::Tensor out = h + proj(a, "self_attn.o_proj");
  x = RefRmsNorm(out, w.at(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
  torch::Tensor m =
      proj(torch::silu(proj(x, "mlp.gate_proj")) * proj(x, "mlp.up_proj"), "mlp.down_proj");
  return out + m;
}

// Every layer of the runtime (fed the runtime's own input to that layer) and
// the final norm against the reference.
void ExpectLayersMatchReference(const std::string& dir, HfRuntime& runtime,
                                const std::vector<int32_t>& ids, const RefRope& rope,
                                std::optional<int64_t> window, const std::string& what) {
  auto config = LoadHfConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  std::map<std::string, torch::Tensor> w = ReadWeights(dir);
  auto hidden = runtime.HiddenStates(ids);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  ASSERT_EQ(hidden->size(), static_cast<size_t>(config->num_hidden_layers + 1));
  torch::Tensor ids64 = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()));
  ExpectClose((*hidden)[0], w.at("model.embed_tokens.weight").index_select(0, ids64), 1e-7,
              what + " embeddings");
  for (int i = 0; i < config->num_hidden_layers; ++i) {
    torch::Tensor expected =
        RefLayer(w, *config, i, (*hidden)[i].to(torch::kFloat64), rope, window);
    ExpectClose((*hidden)[i + 1], expected, 2e-5, absl::StrCat(what, " layer ", i));
  }
  SequenceCapture capture = ForwardOne(runtime, ids);
  ExpectClose(capture.last_hidden,
              RefRmsNorm((*hidden).back().to(torch::kFloat64), w.at("model.norm.weight"),
                         config->rms_norm_eps),
              2e-5, what + " final norm");
}

// Random norm weights (init-random writes ones), so that a norm whose weight
// is ignored is caught too.
torch::Tensor RandomizeNorms(const std::string& name, torch::Tensor t) {
  if (name.find("norm") == std::string::npos) return t;
  torch::manual_seed(static_cast<uint64_t>(std::hash<std::string>()(name) % 100000));
  return 0.5 + torch::rand(t.sizes(), torch::kFloat32);
}

TEST(HfFamiliesTest, EveryFamilyMatchesTheReferenceLayer) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "mistral"}) {
    TempDir dir;
    TinyModelOptions model;
    model.arch = arch;
    model.layers = 3;
    WriteTinyModel(dir.path(), model);
    RewriteCheckpoint(dir.path(), RandomizeNorms);
    auto runtime = Load(dir.path(), {0, 2});
    ASSERT_NE(runtime, nullptr) << arch;
    const int64_t d = runtime->config().head_dim;
    RefRope rope{DefaultInvFreq(d, runtime->config().rope_theta), 1.0, Positions(13)};
    ExpectLayersMatchReference(dir.path(), *runtime, RandomTokens(13, model.vocab, 1), rope,
                               std::nullopt, arch);
  }
}

TEST(HfFamiliesTest, Qwen2QkvBiasesAreUsed) {
  TempDir dir;
  TinyModelOptions model;
  model.arch = "qwen2";
  model.layers = 2;
  WriteTinyModel(dir.path(), model);
  std::vector<int32_t> ids = RandomTokens(10, model.vocab, 2);
  SequenceCapture with_bias;
  {
    auto runtime = Load(dir.path(), {0, 1});
    ASSERT_NE(runtime, nullptr);
    with_bias = ForwardOne(*runtime, ids);
  }
  int zeroed = 0;
  RewriteCheckpoint(dir.path(), [&](const std::string& name, torch::Tensor t) {
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      EXPECT_GT(t.abs().max().item<double>(), 0.0) << name;
      ++zeroed;
      return torch::zeros_like(t);
    }
    return t;
  });
  EXPECT_EQ(zeroed, 2 * 3);  // q, k, v per layer
  auto runtime = Load(dir.path(), {0, 1});
  ASSERT_NE(runtime, nullptr);
  SequenceCapture without = ForwardOne(*runtime, ids);
  ExpectDifferent(with_bias.aux_hidden, without.aux_hidden, "aux_hidden");
  ExpectDifferent(with_bias.last_hidden, without.last_hidden, "last_hidden");
}

TEST(HfFamiliesTest, Qwen3QkNormsAreUsed) {
  TempDir dir;
  TinyModelOptions model;
  model.arch = "qwen3";
  model.layers = 2;
  WriteTinyModel(dir.path(), model);
  std::vector<int32_t> ids = RandomTokens(10, model.vocab, 3);
  SequenceCapture ones;
  {
    auto runtime = Load(dir.path(), {0, 1});
    ASSERT_NE(runtime, nullptr);
    ones = ForwardOne(*runtime, ids);
  }
  for (const char* which : {"q_norm", "k_norm"}) {
    TempDir edited;
    WriteTinyModel(edited.path(), model);
    RewriteCheckpoint(edited.path(), [&](const std::string& name, torch::Tensor t) {
      return name.find(which) != std::string::npos ? t * 3 : t;
    });
    auto runtime = Load(edited.path(), {0, 1});
    ASSERT_NE(runtime, nullptr);
    SequenceCapture scaled = ForwardOne(*runtime, ids);
    ExpectDifferent(ones.aux_hidden, scaled.aux_hidden, which);
    // Position 0 attends to itself only: a score scale cannot change it.
    ExpectClose(ones.aux_hidden[0], scaled.aux_hidden[0], 1e-5, which);
  }
}

TEST(HfFamiliesTest, TiedEmbeddingsAreTheLmHead) {
  TempDir dir;
  TinyModelOptions model;
  model.layers = 2;
  model.tie_embeddings = true;
  WriteTinyModel(dir.path(), model);
  auto config = LoadHfConfig(dir.path());
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->tie_word_embeddings);
  std::map<std::string, torch::Tensor> w = ReadWeights(dir.path());
  EXPECT_EQ(w.count("lm_head.weight"), 0u);
  auto runtime = Load(dir.path(), {0, 1});
  ASSERT_NE(runtime, nullptr);
  SequenceCapture c = ForwardOne(*runtime, RandomTokens(40, model.vocab, 4), true);
  torch::Tensor logits =
      torch::matmul(c.last_hidden.to(torch::kFloat64), w.at("model.embed_tokens.weight").t());
  EXPECT_TRUE(torch::equal(c.target_ids, logits.argmax(-1).to(torch::kInt32)));
  // Not trivially the input token: the model computes something.
  EXPECT_GT(std::get<0>(torch::_unique(c.target_ids)).numel(), 3);

  // Untied (same seed): lm_head.weight exists and is what is used.
  TempDir untied_dir;
  model.tie_embeddings = false;
  WriteTinyModel(untied_dir.path(), model);
  std::map<std::string, torch::Tensor> wu = ReadWeights(untied_dir.path());
  ASSERT_EQ(wu.count("lm_head.weight"), 1u);
  auto untied = Load(untied_dir.path(), {0, 1});
  ASSERT_NE(untied, nullptr);
  SequenceCapture u = ForwardOne(*untied, RandomTokens(40, model.vocab, 4), true);
  torch::Tensor untied_logits =
      torch::matmul(u.last_hidden.to(torch::kFloat64), wu.at("lm_head.weight").t());
  EXPECT_TRUE(torch::equal(u.target_ids, untied_logits.argmax(-1).to(torch::kInt32)));
}

// Tiny llama (head_dim 8, theta 10000) with each rope_scaling kind, against
// the reference layer with frequencies computed in Python:
//   default_inv_freq(8, 10000.0)               = [1, 0.1, 0.01, 0.001]
//   llama3(8, 10000.0, 8.0, 1.0, 4.0, 64)      = [1.0, 0.013042256043820465, 0.00125, 0.000125]
//     (wavelengths 6.3 / 62.8 / 628 / 6283 against 16 and 64: kept, smoothed,
//     divided, divided)
//   yarn(8, 10000.0, 4.0, 256)                 = [1.0, 0.0625, 0.0025, 0.00025], att
//     1.138629436111989 (ramp from low 0 to high 2)
// (helpers as in tests/unit/common/torch/blocks_test.cc). Linear with factor 4 is
// checked as position p -> p / 4 with the default frequencies.
TEST(HfFamiliesTest, RopeScalingKindsMatchTheirFormulas) {
  struct Case {
    const char* name;
    RopeScaling scaling;
    RefRope rope;
  };
  const int64_t t = 11;
  std::vector<Case> cases;
  {
    RopeScaling s;
    s.kind = RopeScaling::Kind::kLinear;
    s.factor = 4.0;
    cases.push_back({"linear", s, {DefaultInvFreq(8, 10000.0), 1.0, Positions(t, 4.0)}});
  }
  {
    RopeScaling s;
    s.kind = RopeScaling::Kind::kLlama3;
    s.factor = 8.0;
    s.low_freq_factor = 1.0;
    s.high_freq_factor = 4.0;
    s.original_max_position_embeddings = 64;
    cases.push_back(
        {"llama3", s, {{1.0, 0.013042256043820465, 0.00125, 0.000125}, 1.0, Positions(t)}});
  }
  {
    RopeScaling s;
    s.kind = RopeScaling::Kind::kYarn;
    s.factor = 4.0;
    s.original_max_position_embeddings = 256;
    cases.push_back({"yarn", s, {{1.0, 0.0625, 0.0025, 0.00025}, 1.138629436111989, Positions(t)}});
  }
  TinyModelOptions model;
  model.layers = 2;
  std::vector<int32_t> ids = RandomTokens(t, model.vocab, 5);
  TempDir plain_dir;
  WriteTinyModel(plain_dir.path(), model);
  auto plain = Load(plain_dir.path(), {0, 1});
  ASSERT_NE(plain, nullptr);
  ASSERT_EQ(plain->config().head_dim, 8);
  SequenceCapture unscaled = ForwardOne(*plain, ids);

  for (const Case& c : cases) {
    TempDir dir;
    TinyModelOptions scaled_model = model;
    scaled_model.edit_config = [&](HfModelConfig& config) { config.rope_scaling = c.scaling; };
    WriteTinyModel(dir.path(), scaled_model);
    auto runtime = Load(dir.path(), {0, 1});
    ASSERT_NE(runtime, nullptr) << c.name;
    ASSERT_EQ(runtime->config().rope_scaling.kind, c.scaling.kind) << c.name;
    ExpectLayersMatchReference(dir.path(), *runtime, ids, c.rope, std::nullopt, c.name);
    SequenceCapture scaled = ForwardOne(*runtime, ids);
    // Position 0 attends only to itself: rope cannot change it.
    ExpectClose(scaled.aux_hidden[0], unscaled.aux_hidden[0], 1e-5,
                absl::StrCat(c.name, " position 0"));
    ExpectDifferent(scaled.aux_hidden.narrow(0, 1, t - 1), unscaled.aux_hidden.narrow(0, 1, t - 1),
                    c.name);
  }
}

TEST(HfFamiliesTest, MistralSlidingWindow) {
  const int64_t t = 12;
  TinyModelOptions model;
  model.arch = "mistral";
  model.layers = 2;
  std::vector<int32_t> ids = RandomTokens(t, model.vocab, 6);
  TempDir full_dir, window_dir;
  WriteTinyModel(full_dir.path(), model);
  model.edit_config = [](HfModelConfig& c) { c.sliding_window = 4; };
  WriteTinyModel(window_dir.path(), model);
  auto full = Load(full_dir.path(), {0, 1});
  auto windowed = Load(window_dir.path(), {0, 1});
  ASSERT_NE(full, nullptr);
  ASSERT_NE(windowed, nullptr);
  ASSERT_EQ(windowed->config().sliding_window, 4);
  ASSERT_FALSE(full->config().sliding_window.has_value());
  SequenceCapture a = ForwardOne(*full, ids, true);
  SequenceCapture b = ForwardOne(*windowed, ids, true);
  // Positions 0..3 see all their keys either way.
  ExpectClose(b.aux_hidden.narrow(0, 0, 4), a.aux_hidden.narrow(0, 0, 4), 1e-6, "early aux");
  ExpectClose(b.last_hidden.narrow(0, 0, 4), a.last_hidden.narrow(0, 0, 4), 1e-6, "early last");
  for (int64_t p = 4; p < t; ++p) {
    ExpectDifferent(b.last_hidden[p], a.last_hidden[p], absl::StrCat("position ", p));
  }
  RefRope rope{DefaultInvFreq(8, 10000.0), 1.0, Positions(t)};
  ExpectLayersMatchReference(window_dir.path(), *windowed, ids, rope, 4, "mistral window 4");
}

TEST(HfFamiliesTest, ShardedCheckpointEqualsSingleFile) {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    TinyModelOptions model;
    model.arch = arch;
    model.layers = 8;
    TempDir one, three;
    WriteTinyModel(one.path(), model);
    model.shards = 3;
    WriteTinyModel(three.path(), model);
    ASSERT_TRUE(specstream::testing::FileExists(three.Join("model.safetensors.index.json")));
    ASSERT_TRUE(specstream::testing::FileExists(three.Join("model-00003-of-00003.safetensors")));
    auto a = Load(one.path(), {});
    auto b = Load(three.path(), {});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    ForwardRequest request;
    request.sequences = {RandomTokens(9, model.vocab, 7), RandomTokens(20, model.vocab, 8)};
    request.want_target_ids = true;
    auto x = a->Forward(request);
    auto y = b->Forward(request);
    ASSERT_TRUE(x.ok() && y.ok());
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_TRUE(torch::equal((*x)[s].aux_hidden, (*y)[s].aux_hidden)) << arch;
      EXPECT_TRUE(torch::equal((*x)[s].last_hidden, (*y)[s].last_hidden)) << arch;
      EXPECT_TRUE(torch::equal((*x)[s].target_ids, (*y)[s].target_ids)) << arch;
    }
  }
}

TEST(HfFamiliesTest, MaxPositionEmbeddingsIsEnforced) {
  TempDir dir;
  TinyModelOptions model;
  model.layers = 2;
  model.edit_config = [](HfModelConfig& c) { c.max_position_embeddings = 16; };
  WriteTinyModel(dir.path(), model);
  auto runtime = Load(dir.path(), {0, 1});
  ASSERT_NE(runtime, nullptr);
  EXPECT_EQ(runtime->Describe().max_position_embeddings, 16);
  ForwardRequest request;
  request.sequences = {RandomTokens(16, model.vocab, 9)};
  EXPECT_TRUE(runtime->Forward(request).ok());
  request.sequences = {RandomTokens(3, model.vocab, 9), RandomTokens(17, model.vocab, 9)};
  auto refused = runtime->Forward(request);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("max_position_embeddings"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("sequence 1"), std::string::npos) << refused.status();
  EXPECT_EQ(runtime->HiddenStates(RandomTokens(17, model.vocab, 9)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Still usable.
  request.sequences = {RandomTokens(5, model.vocab, 10)};
  EXPECT_TRUE(runtime->Forward(request).ok());
}

// 8192 tokens through blockwise attention (64 query blocks of 128) give the
// same first 64 positions as a 64-token run.
TEST(HfFamiliesLongTest, LongSequenceIsCausalUnderBlockwiseAttention) {
  constexpr int kLong = 8192, kShort = 64;
  TempDir dir;
  TinyModelOptions model;
  model.layers = 2;
  model.hidden = 32;
  model.heads = 4;
  model.kv_heads = 2;
  model.edit_config = [](HfModelConfig& c) { c.max_position_embeddings = 8192; };
  WriteTinyModel(dir.path(), model);
  // Blocks of max_score_elements / (heads * T) = 128 query rows.
  auto runtime = Load(dir.path(), {0, 1}, int64_t{4} * kLong * 128);
  ASSERT_NE(runtime, nullptr);
  std::vector<int32_t> ids = RandomTokens(kLong, model.vocab, 11);
  auto start = std::chrono::steady_clock::now();
  SequenceCapture long_run = ForwardOne(*runtime, ids);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << kLong << "-token forward took " << seconds << " s\n";
  ASSERT_EQ(long_run.last_hidden.size(0), kLong);
  EXPECT_TRUE(torch::isfinite(long_run.last_hidden).all().item<bool>());
  SequenceCapture short_run =
      ForwardOne(*runtime, std::vector<int32_t>(ids.begin(), ids.begin() + kShort));
  ExpectClose(long_run.last_hidden.narrow(0, 0, kShort), short_run.last_hidden, 1e-5,
              "last_hidden");
  ExpectClose(long_run.aux_hidden.narrow(0, 0, kShort), short_run.aux_hidden, 1e-5, "aux_hidden");
}

}  // namespace
}  // namespace specstream::teacher
