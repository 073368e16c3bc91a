#include "teacher/init_random.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/hf_config.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace specstream::teacher {
namespace {

using specstream::testing::FileExists;
using specstream::testing::ReadFile;
using specstream::testing::TempDir;
using ::testing::HasSubstr;

using Shape = std::vector<int64_t>;

InitRandomOptions SmallOptions(const std::string& arch, const std::string& out) {
  InitRandomOptions options;
  options.arch = arch;
  options.layers = 2;
  options.hidden = 32;
  options.heads = 4;
  options.kv_heads = 2;
  options.intermediate = 48;
  options.vocab = 100;
  options.seed = 7;
  options.out = out;
  if (arch == "qwen3_moe" || arch == "mixtral") {
    options.experts = 4;
    options.top_k = 2;
  }
  if (arch == "qwen3_moe") options.shared_expert_intermediate = 24;
  return options;
}

// What transformers expects for these options, written out independently of
// the code under test.
std::map<std::string, Shape> ExpectedTensors(const InitRandomOptions& o) {
  const int64_t d = o.head_dim > 0 ? o.head_dim : o.hidden / o.heads;
  std::map<std::string, Shape> t;
  t["model.embed_tokens.weight"] = {o.vocab, o.hidden};
  for (int64_t i = 0; i < o.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "self_attn.q_proj.weight"] = {o.heads * d, o.hidden};
    t[p + "self_attn.k_proj.weight"] = {o.kv_heads * d, o.hidden};
    t[p + "self_attn.v_proj.weight"] = {o.kv_heads * d, o.hidden};
    t[p + "self_attn.o_proj.weight"] = {o.hidden, o.heads * d};
    if (o.arch == "qwen2") {
      t[p + "self_attn.q_proj.bias"] = {o.heads * d};
      t[p + "self_attn.k_proj.bias"] = {o.kv_heads * d};
      t[p + "self_attn.v_proj.bias"] = {o.kv_heads * d};
    }
    if (o.arch == "qwen3" || o.arch == "qwen3_moe") {
      t[p + "self_attn.q_norm.weight"] = {d};
      t[p + "self_attn.k_norm.weight"] = {d};
    }
    if (o.arch == "qwen3_moe") {
      t[p + "mlp.gate.weight"] = {o.experts, o.hidden};
      for (int64_t e = 0; e < o.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        t[x + "gate_proj.weight"] = {o.intermediate, o.hidden};
        t[x + "up_proj.weight"] = {o.intermediate, o.hidden};
        t[x + "down_proj.weight"] = {o.hidden, o.intermediate};
      }
      const int64_t s = o.shared_expert_intermediate;
      t[p + "mlp.shared_expert.gate_proj.weight"] = {s, o.hidden};
      t[p + "mlp.shared_expert.up_proj.weight"] = {s, o.hidden};
      t[p + "mlp.shared_expert.down_proj.weight"] = {o.hidden, s};
      t[p + "mlp.shared_expert_gate.weight"] = {1, o.hidden};
    } else if (o.arch == "mixtral") {
      t[p + "block_sparse_moe.gate.weight"] = {o.experts, o.hidden};
      for (int64_t e = 0; e < o.experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        t[x + "w1.weight"] = {o.intermediate, o.hidden};
        t[x + "w3.weight"] = {o.intermediate, o.hidden};
        t[x + "w2.weight"] = {o.hidden, o.intermediate};
      }
    } else {
      t[p + "mlp.gate_proj.weight"] = {o.intermediate, o.hidden};
      t[p + "mlp.up_proj.weight"] = {o.intermediate, o.hidden};
      t[p + "mlp.down_proj.weight"] = {o.hidden, o.intermediate};
    }
    t[p + "input_layernorm.weight"] = {o.hidden};
    t[p + "post_attention_layernorm.weight"] = {o.hidden};
  }
  t["model.norm.weight"] = {o.hidden};
  if (!o.tie_embeddings) t["lm_head.weight"] = {o.vocab, o.hidden};
  return t;
}

std::vector<float> Values(const TensorView& view) {
  std::vector<float> out;
  if (view.dtype == DType::kBF16) {
    for (size_t i = 0; i + 1 < view.nbytes; i += 2) {
      uint32_t bits = (uint32_t{view.data[i + 1]} << 24) | (uint32_t{view.data[i]} << 16);
      float f;
      std::memcpy(&f, &bits, 4);
      out.push_back(f);
    }
  } else {
    for (size_t i = 0; i + 3 < view.nbytes; i += 4) {
      uint32_t bits = uint32_t{view.data[i]} | (uint32_t{view.data[i + 1]} << 8) |
                      (uint32_t{view.data[i + 2]} << 16) | (uint32_t{view.data[i + 3]} << 24);
      float f;
      std::memcpy(&f, &bits, 4);
      out.push_back(f);
    }
  }
  return out;
}

double StdDev(const std::vector<float>& values) {
  double sum = 0, sq = 0;
  for (float v : values) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(values.size());
  return std::sqrt(sq / n - (sum / n) * (sum / n));
}

std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files[entry.path().filename().string()] = ReadFile(entry.path().string());
  }
  return files;
}

class InitRandomArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InitRandomArchTest, WritesAConfigAndEveryTensor) {
  TempDir dir;
  const InitRandomOptions options = SmallOptions(GetParam(), dir.path());
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  ASSERT_TRUE(FileExists(dir.Join("config.json")));
  ASSERT_TRUE(FileExists(dir.Join("model.safetensors")));
  EXPECT_FALSE(FileExists(dir.Join("model.safetensors.index.json")));

  auto config = LoadHfConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, GetParam());
  const std::map<std::string, std::string> archs = {
      {"llama", "LlamaForCausalLM"},        {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},        {"mistral", "MistralForCausalLM"},
      {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"mixtral", "MixtralForCausalLM"}};
  EXPECT_EQ(config->architectures, std::vector<std::string>{archs.at(GetParam())});
  EXPECT_EQ(config->num_hidden_layers, 2);
  EXPECT_EQ(config->hidden_size, 32);
  EXPECT_EQ(config->num_attention_heads, 4);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_EQ(config->head_dim, 8);
  EXPECT_EQ(config->intermediate_size, 48);
  EXPECT_EQ(config->vocab_size, 100);
  EXPECT_EQ(config->max_position_embeddings, 4096);
  EXPECT_EQ(config->rope_theta, 10000.0);
  EXPECT_EQ(config->torch_dtype, "bfloat16");
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->sliding_window.has_value());
  EXPECT_EQ(config->attention_bias, GetParam() == "qwen2");

  auto ckpt = CheckpointTensors::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const auto expected = ExpectedTensors(options);
  std::vector<std::string> want_names;
  for (const auto& [name, shape] : expected) want_names.push_back(name);
  EXPECT_EQ((*ckpt)->names(), want_names);  // Both sorted; nothing extra, nothing missing.
  for (const auto& [name, shape] : expected) {
    auto view = (*ckpt)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->shape, shape) << name;
    EXPECT_EQ(view->dtype, DType::kBF16) << name;
  }
  const bool has_bias = (*ckpt)->Contains("model.layers.1.self_attn.k_proj.bias");
  const bool has_qk_norm = (*ckpt)->Contains("model.layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(has_bias, GetParam() == "qwen2");
  EXPECT_EQ(has_qk_norm, GetParam() == "qwen3" || GetParam() == "qwen3_moe");
  EXPECT_TRUE((*ckpt)->Contains("lm_head.weight"));
  if (config->is_moe()) {
    EXPECT_EQ(config->num_experts, 4);
    EXPECT_EQ(config->num_experts_per_tok, 2);
    EXPECT_TRUE(config->norm_topk_prob);
    EXPECT_TRUE(config->IsMoeLayer(0) && config->IsMoeLayer(1));
    if (GetParam() == "qwen3_moe") {
      EXPECT_EQ(config->moe_intermediate_size, 48);
      EXPECT_EQ(config->shared_expert_intermediate_size, std::optional<int64_t>(24));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, InitRandomArchTest,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral", "qwen3_moe",
                                           "mixtral"));

TEST(InitRandomTest, InitScalesAreTheDocumentedOnes) {
  TempDir dir;
  InitRandomOptions options = SmallOptions("qwen3", dir.path());
  options.dtype = "float32";
  options.hidden = 64;
  options.intermediate = 128;
  options.vocab = 512;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  auto ckpt = CheckpointTensors::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto std_of = [&](const std::string& name) {
    auto view = (*ckpt)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, DType::kF32);
    return StdDev(Values(*view));
  };
  const double two_l = 2.0 * options.layers;
  EXPECT_NEAR(std_of("model.embed_tokens.weight"), 1.0, 0.03);
  EXPECT_NEAR(std_of("model.layers.0.self_attn.q_proj.weight"), 1 / std::sqrt(64.0), 0.005);
  EXPECT_NEAR(std_of("model.layers.1.mlp.up_proj.weight"), 1 / std::sqrt(64.0), 0.005);
  EXPECT_NEAR(std_of("model.layers.0.self_attn.o_proj.weight"), 0.5 / std::sqrt(64.0 * two_l),
              0.005);
  EXPECT_NEAR(std_of("model.layers.1.mlp.down_proj.weight"), 0.5 / std::sqrt(128.0 * two_l), 0.003);
  EXPECT_NEAR(std_of("lm_head.weight"), 1 / std::sqrt(64.0), 0.005);
  for (const std::string name :
       {"model.norm.weight", "model.layers.1.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight", "model.layers.0.self_attn.q_norm.weight",
        "model.layers.1.self_attn.k_norm.weight"}) {
    auto view = (*ckpt)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    for (float v : Values(*view)) ASSERT_EQ(v, 1.0f) << name;
  }
  // Different tensors get different streams.
  auto q0 = (*ckpt)->Get("model.layers.0.self_attn.q_proj.weight");
  auto q1 = (*ckpt)->Get("model.layers.1.self_attn.q_proj.weight");
  ASSERT_TRUE(q0.ok() && q1.ok());
  EXPECT_NE(Values(*q0), Values(*q1));
}

TEST(InitRandomTest, Bf16IsTheRoundedFloat32) {
  TempDir f32_dir, bf16_dir;
  InitRandomOptions options = SmallOptions("llama", f32_dir.path());
  options.dtype = "float32";
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  options.dtype = "bfloat16";
  options.out = bf16_dir.path();
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  auto f32 = CheckpointTensors::Open(f32_dir.path());
  auto bf16 = CheckpointTensors::Open(bf16_dir.path());
  ASSERT_TRUE(f32.ok() && bf16.ok());
  auto a = (*f32)->Get("model.layers.0.mlp.gate_proj.weight");
  auto b = (*bf16)->Get("model.layers.0.mlp.gate_proj.weight");
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<float> full = Values(*a);
  const std::vector<float> rounded = Values(*b);
  ASSERT_EQ(full.size(), rounded.size());
  int inexact = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    // Round to nearest: within half a bf16 ulp (2^-8 relative).
    ASSERT_LE(std::fabs(rounded[i] - full[i]), std::ldexp(std::fabs(full[i]), -8)) << i;
    inexact += rounded[i] != full[i];
  }
  EXPECT_GT(inexact, 0);
}

TEST(InitRandomTest, TiedEmbeddingsHaveNoLmHead) {
  TempDir dir;
  InitRandomOptions options = SmallOptions("llama", dir.path());
  options.tie_embeddings = true;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  auto config = LoadHfConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->tie_word_embeddings);
  auto ckpt = CheckpointTensors::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE((*ckpt)->Contains("lm_head.weight"));
  EXPECT_TRUE((*ckpt)->Contains("model.embed_tokens.weight"));
  EXPECT_EQ((*ckpt)->names().size(), ExpectedTensors(options).size());
}

TEST(InitRandomTest, ExplicitHeadDim) {
  TempDir dir;
  InitRandomOptions options = SmallOptions("qwen3", dir.path());
  options.hidden = 30;  // Not divisible by 4 heads.
  options.head_dim = 16;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  auto config = LoadHfConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim, 16);
  auto ckpt = CheckpointTensors::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Get("model.layers.0.self_attn.q_proj.weight")->shape, (Shape{64, 30}));
  EXPECT_EQ((*ckpt)->Get("model.layers.0.self_attn.o_proj.weight")->shape, (Shape{30, 64}));
  EXPECT_EQ((*ckpt)->Get("model.layers.0.self_attn.k_norm.weight")->shape, (Shape{16}));
}

TEST(InitRandomTest, ShardedCheckpointHasAnIndexAndTheSameTensors) {
  TempDir single_dir, sharded_dir;
  InitRandomOptions options = SmallOptions("qwen2", single_dir.path());
  options.layers = 3;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  options.out = sharded_dir.path();
  options.shards = 3;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());

  EXPECT_FALSE(FileExists(sharded_dir.Join("model.safetensors")));
  const std::vector<std::string> files = {"model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors"};
  for (const std::string& file : files) EXPECT_TRUE(FileExists(sharded_dir.Join(file))) << file;

  nlohmann::json index =
      nlohmann::json::parse(ReadFile(sharded_dir.Join("model.safetensors.index.json")));
  const auto expected = ExpectedTensors(options);
  ASSERT_EQ(index["weight_map"].size(), expected.size());
  std::set<std::string> used_files;
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(index["weight_map"].contains(name)) << name;
    used_files.insert(index["weight_map"][name].get<std::string>());
  }
  EXPECT_EQ(used_files, std::set<std::string>(files.begin(), files.end()));  // None empty.
  // Layer order: embeddings first, lm_head last.
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], files[0]);
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], files[2]);
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], files[2]);

  auto sharded = CheckpointTensors::Open(sharded_dir.path());
  auto single = CheckpointTensors::Open(single_dir.path());
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ((*sharded)->shard_paths().size(), 3u);
  uint64_t total = 0;
  for (const auto& [name, shape] : expected) {
    auto a = (*sharded)->Get(name);
    auto b = (*single)->Get(name);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    total += a->nbytes;
    // Values depend on the seed and the name only, not on the layout.
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << name;
    // Each tensor sits in the shard the index names.
    auto in_file =
        SafetensorsFile::Open(sharded_dir.Join(index["weight_map"][name].get<std::string>()));
    ASSERT_TRUE(in_file.ok());
    EXPECT_TRUE((*in_file)->Contains(name)) << name;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);

  // Writing a single-file checkpoint over it removes the index (and back).
  options.shards = 1;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  EXPECT_FALSE(FileExists(sharded_dir.Join("model.safetensors.index.json")));
  EXPECT_TRUE(CheckpointTensors::Open(sharded_dir.path()).ok());
  options.shards = 2;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  EXPECT_FALSE(FileExists(sharded_dir.Join("model.safetensors")));
}

TEST(InitRandomTest, SameSeedSameBytesOtherSeedOtherWeights) {
  TempDir a, b, c;
  InitRandomOptions options = SmallOptions("mistral", a.path());
  options.shards = 2;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  options.out = b.path();
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());
  options.out = c.path();
  options.seed = 8;
  ASSERT_TRUE(WriteRandomCheckpoint(options).ok());

  const auto first = DirContents(a.path());
  const auto second = DirContents(b.path());
  const auto other = DirContents(c.path());
  ASSERT_EQ(first.size(), 4u);  // config, index, two shards
  EXPECT_TRUE(first == second);
  ASSERT_EQ(other.size(), 4u);
  EXPECT_EQ(other.at("config.json"), first.at("config.json"));
  EXPECT_EQ(other.at("model.safetensors.index.json"), first.at("model.safetensors.index.json"));
  EXPECT_NE(other.at("model-00001-of-00002.safetensors"),
            first.at("model-00001-of-00002.safetensors"));
  EXPECT_NE(other.at("model-00002-of-00002.safetensors"),
            first.at("model-00002-of-00002.safetensors"));
}

TEST(InitRandomTest, RefusesBadOptionsNamingTheFlag) {
  TempDir dir;
  struct Case {
    std::function<void(InitRandomOptions&)> edit;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {[](InitRandomOptions& o) { o.arch = "gpt2"; }, "--arch"},
      {[](InitRandomOptions& o) { o.arch = "qwen3_moe"; }, "--experts"},
      {[](InitRandomOptions& o) { o.experts = 4; }, "--experts"},  // llama has none.
      {[](InitRandomOptions& o) { o.top_k = 2; }, "--top-k"},
      {[](InitRandomOptions& o) { o.mlp_only_layers = {0}; }, "--mlp-only-layers"},  // llama
      {[](InitRandomOptions& o) {
         o.arch = "qwen3_moe";
         o.experts = 4;
         o.top_k = 2;
         o.mlp_only_layers = {2};  // of 2 layers
       },
       "--mlp-only-layers"},
      {[](InitRandomOptions& o) {
         o.arch = "mixtral";
         o.experts = 4;
         o.top_k = 5;
       },
       "--top-k"},
      {[](InitRandomOptions& o) {
         o.arch = "mixtral";
         o.experts = 4;
         o.top_k = 2;
         o.shared_expert_intermediate = 8;
       },
       "--shared-expert-intermediate"},
      {[](InitRandomOptions& o) { o.layers = 0; }, "--layers"},
      {[](InitRandomOptions& o) { o.hidden = 0; }, "--hidden"},
      {[](InitRandomOptions& o) { o.heads = -4; }, "--heads"},
      {[](InitRandomOptions& o) { o.kv_heads = 0; }, "--kv-heads"},
      {[](InitRandomOptions& o) { o.intermediate = 0; }, "--intermediate"},
      {[](InitRandomOptions& o) { o.vocab = 0; }, "--vocab"},
      {[](InitRandomOptions& o) { o.hidden = 30; }, "--heads"},  // 4 does not divide 30.
      {[](InitRandomOptions& o) { o.kv_heads = 3; }, "--kv-heads"},
      {[](InitRandomOptions& o) { o.head_dim = -1; }, "--head-dim"},
      {[](InitRandomOptions& o) { o.dtype = "float16"; }, "--dtype"},
      {[](InitRandomOptions& o) { o.max_position = 0; }, "--max-position"},
      {[](InitRandomOptions& o) { o.rope_theta = 0; }, "--rope-theta"},
      {[](InitRandomOptions& o) { o.vocab = int64_t{1} << 40; }, "--vocab"},
      {[](InitRandomOptions& o) { o.shards = 0; }, "--shards"},
      {[](InitRandomOptions& o) { o.shards = 1000; }, "--shards"},
      {[](InitRandomOptions& o) { o.out.clear(); }, "--out"},
  };
  for (const Case& c : cases) {
    InitRandomOptions options = SmallOptions("llama", dir.Join("out"));
    c.edit(options);
    absl::Status status = WriteRandomCheckpoint(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.flag << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.flag)) << status;
  }
  EXPECT_FALSE(FileExists(dir.Join("out")));  // Validated before anything is written.

  InitRandomOptions divides = SmallOptions("llama", "");
  divides.hidden = 30;
  EXPECT_THAT(MakeRandomConfig(divides).status().message(), HasSubstr("--head-dim"));
  divides.head_dim = 8;
  EXPECT_TRUE(MakeRandomConfig(divides).ok());  // `out` is not MakeRandomConfig's concern.
}

}  // namespace
}  // namespace specstream::teacher
