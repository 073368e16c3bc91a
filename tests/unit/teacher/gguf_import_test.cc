// The GGUF importer (teacher/gguf_import.h): a random Llama checkpoint is
// written as llama.cpp writes a GGUF (its tensor names, its Q/K row
// permutation, F32), imported back, and compared tensor by tensor, bitwise;
// the rebuilt tokenizer.json loads and splits digits as SmolLM2's does.
// SmolLM2ReferenceTest imports the real SmolLM2-135M-Instruct GGUF
// (tests/testing/fetch_smollm2.sh) and holds it against transformers
// loading the same file and HF tokenizers on the converted tokenizer.json
// (tests/testing/smollm2_reference.py).
#include "teacher/gguf_import.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/gguf.h"
#include "common/hf_config.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "common/torch/tensor_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "teacher/hf_runtime.h"
#include "teacher/init_random.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_tokenizer.h"

namespace specstream::teacher {
namespace {

using specstream::testing::TempDir;
using ::testing::HasSubstr;

constexpr int64_t kHeads = 4, kKvHeads = 2, kHidden = 32, kLayers = 2, kVocab = 300;

// convert_hf_to_gguf's permute, written out: rows of head h go from
// (2, d/2) to (d/2, 2) order.
std::vector<float> Permute(const std::vector<float>& w, int64_t heads, int64_t cols) {
  const int64_t d = static_cast<int64_t>(w.size()) / cols / heads, half = d / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        std::memcpy(&out[(h * d + i * 2 + j) * cols], &w[(h * d + j * half + i) * cols],
                    cols * sizeof(float));
      }
    }
  }
  return out;
}

// A GPT-2 byte-level vocabulary: the 256 byte symbols, merges of "1"+"2" and
// "a"+"b" (so that a run of digits could merge if nothing split it), the
// specials as control tokens, padded with user tokens to kVocab.
nlohmann::json TokenizerMetadata() {
  nlohmann::json tokens = nlohmann::json::array(), types = nlohmann::json::array();
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(specstream::testing::ByteSymbol(static_cast<unsigned char>(b)));
    types.push_back(1);
  }
  tokens.push_back("12");
  tokens.push_back("ab");
  types.push_back(1);
  types.push_back(1);
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(special);
    types.push_back(3);
  }
  while (tokens.size() < static_cast<size_t>(kVocab)) {
    tokens.push_back(absl::StrCat("<unused", tokens.size(), ">"));
    types.push_back(4);
  }
  return {{"tokenizer.ggml.model", "gpt2"},          {"tokenizer.ggml.pre", "smollm"},
          {"tokenizer.ggml.tokens", tokens},         {"tokenizer.ggml.token_type", types},
          {"tokenizer.ggml.merges", {"1 2", "a b"}}, {"tokenizer.ggml.bos_token_id", 259},
          {"tokenizer.ggml.eos_token_id", 260},      {"tokenizer.chat_template", "{{ messages }}"}};
}

class GgufImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InitRandomOptions o;
    o.arch = "llama";
    o.layers = kLayers;
    o.hidden = kHidden;
    o.heads = kHeads;
    o.kv_heads = kKvHeads;
    o.intermediate = 48;
    o.vocab = kVocab;
    o.dtype = "float32";
    o.rope_theta = 100000;
    o.seed = 3;
    o.out = dir_.path() + "/hf";
    ASSERT_TRUE(WriteRandomCheckpoint(o).ok());
    auto original = CheckpointTensors::Open(o.out);
    ASSERT_TRUE(original.ok()) << original.status();
    original_ = std::move(*original);
  }

  std::vector<float> Original(const std::string& name) const {
    TensorView v = *original_->Get(name);
    std::vector<float> out(v.nbytes / 4);
    std::memcpy(out.data(), v.data, v.nbytes);
    return out;
  }

  // The GGUF llama.cpp would write for the random checkpoint.
  std::string Gguf(const nlohmann::json& extra_metadata = {}, const std::string& drop = "") const {
    nlohmann::json m = {{"general.architecture", "llama"},
                        {"llama.block_count", kLayers},
                        {"llama.context_length", 512},
                        {"llama.embedding_length", kHidden},
                        {"llama.feed_forward_length", 48},
                        {"llama.attention.head_count", kHeads},
                        {"llama.attention.head_count_kv", kKvHeads},
                        {"llama.rope.freq_base", 100000.0},
                        {"llama.attention.layer_norm_rms_epsilon", 1e-6},
                        {"llama.vocab_size", kVocab}};
    m.update(TokenizerMetadata());
    if (extra_metadata.is_object()) m.update(extra_metadata);
    std::vector<GgufWriteTensor> tensors;
    auto add = [&](const std::string& gguf, const std::string& hf, int64_t permute_heads) {
      if (gguf == drop) return;
      std::vector<float> w = Original(hf);
      TensorView v = *original_->Get(hf);
      if (permute_heads > 0) w = Permute(w, permute_heads, kHidden);
      std::vector<int64_t> dims(v.shape.rbegin(), v.shape.rend());
      tensors.push_back(
          {gguf, dims, 0, std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4)});
    };
    add("token_embd.weight", "model.embed_tokens.weight", 0);
    add("output_norm.weight", "model.norm.weight", 0);
    add("output.weight", "lm_head.weight", 0);
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string g = absl::StrCat("blk.", l, "."), h = absl::StrCat("model.layers.", l, ".");
      add(g + "attn_norm.weight", h + "input_layernorm.weight", 0);
      add(g + "attn_q.weight", h + "self_attn.q_proj.weight", kHeads);
      add(g + "attn_k.weight", h + "self_attn.k_proj.weight", kKvHeads);
      add(g + "attn_v.weight", h + "self_attn.v_proj.weight", 0);
      add(g + "attn_output.weight", h + "self_attn.o_proj.weight", 0);
      add(g + "ffn_norm.weight", h + "post_attention_layernorm.weight", 0);
      add(g + "ffn_gate.weight", h + "mlp.gate_proj.weight", 0);
      add(g + "ffn_up.weight", h + "mlp.up_proj.weight", 0);
      add(g + "ffn_down.weight", h + "mlp.down_proj.weight", 0);
    }
    absl::StatusOr<std::string> bytes = SerializeGguf(m, tensors);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : std::string();
  }

  absl::Status Import(const std::string& gguf_bytes, const std::string& out) const {
    const std::string path = dir_.path() + "/model.gguf";
    absl::Status written = WriteFileAtomically(path, gguf_bytes);
    if (!written.ok()) return written;
    GgufImportOptions options;
    options.gguf = path;
    options.out = out;
    return ImportGguf(options);
  }

  TempDir dir_;
  std::unique_ptr<CheckpointTensors> original_;
};

TEST_F(GgufImportTest, ImportsEveryTensorBitwiseWithQkUnpermuted) {
  const std::string out = dir_.path() + "/imported";
  absl::Status imported = Import(Gguf(), out);
  ASSERT_TRUE(imported.ok()) << imported;
  auto tensors = CheckpointTensors::Open(out);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ((*tensors)->names(), original_->names());
  for (const std::string& name : original_->names()) {
    TensorView a = *original_->Get(name), b = *(*tensors)->Get(name);
    EXPECT_EQ(a.shape, b.shape) << name;
    ASSERT_EQ(a.nbytes, b.nbytes) << name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << name;
  }
  auto config = LoadHfConfig(out);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "llama");
  EXPECT_EQ(config->num_attention_heads, kHeads);
  EXPECT_EQ(config->num_key_value_heads, kKvHeads);
  EXPECT_EQ(config->head_dim, kHidden / kHeads);
  EXPECT_EQ(config->rope_theta, 100000.0);
  EXPECT_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 259);
  EXPECT_EQ(config->eos_token_ids, std::vector<int64_t>{260});

  // No output.weight: tied embeddings.
  const std::string tied = dir_.path() + "/tied";
  ASSERT_TRUE(Import(Gguf({}, "output.weight"), tied).ok());
  auto tied_config = LoadHfConfig(tied);
  ASSERT_TRUE(tied_config.ok());
  EXPECT_TRUE(tied_config->tie_word_embeddings);
  EXPECT_FALSE((*CheckpointTensors::Open(tied))->Contains("lm_head.weight"));
}

TEST_F(GgufImportTest, RebuildsTheTokenizerWithItsDigitSplitAndSpecials) {
  const std::string out = dir_.path() + "/imported";
  ASSERT_TRUE(Import(Gguf(), out).ok());
  auto tokenizer = Tokenizer::FromDirectory(out);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // "12" is a merge, but SmolLM2's Digits stage splits every digit first;
  // "ab" merges; the control token is matched whole.
  auto ids = (*tokenizer)->EncodeIds("ab12<|im_end|>");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{257, '1', '2', 260}));
  auto config = ReadFileToString(out + "/tokenizer_config.json");
  ASSERT_TRUE(config.ok());
  const nlohmann::json c = nlohmann::json::parse(*config);
  EXPECT_EQ(c["chat_template"], "{{ messages }}");
  EXPECT_EQ(c["bos_token"], "<|im_start|>");
  EXPECT_EQ(c["eos_token"], "<|im_end|>");
}

TEST_F(GgufImportTest, RefusesWhatItCannotImportNamingTheKeyOrTensor) {
  const std::string out = dir_.path() + "/refused";
  EXPECT_THAT(Import(Gguf({{"general.architecture", "qwen2"}}), out).message(),
              HasSubstr("general.architecture: \"qwen2\" (supported: llama)"));
  EXPECT_THAT(Import(Gguf({{"tokenizer.ggml.model", "llama"}}), out).message(),
              HasSubstr("tokenizer.ggml.model: \"llama\""));
  EXPECT_THAT(Import(Gguf({{"tokenizer.ggml.pre", "falcon"}}), out).message(),
              HasSubstr("tokenizer.ggml.pre: \"falcon\""));
  EXPECT_THAT(Import(Gguf({{"llama.rope.scaling.type", "yarn"}}), out).message(),
              HasSubstr("llama.rope.scaling.type"));
  EXPECT_THAT(Import(Gguf({}, "blk.1.ffn_up.weight"), out).message(),
              HasSubstr("no tensor for model.layers.1.mlp.up_proj.weight"));
  EXPECT_THAT(
      Import(Gguf({{"llama.feed_forward_length", 64}}), out).message(),
      HasSubstr("tensor blk.0.ffn_gate.weight has shape [48, 32], config.json asks [64, 32]"));
  EXPECT_FALSE(std::filesystem::exists(out + "/config.json"));
  EXPECT_THAT(GgufToHfName("blk.0.attn_qkv.weight").status().message(),
              HasSubstr("blk.0.attn_qkv.weight"));
}

TEST(SmolLM2ReferenceTest, WeightsTokenizerAndLogitsAgreeWithTransformers) {
  const std::string fixtures = specstream::testing::FixturesDir();
  const std::string gguf = fixtures + "/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  const std::string python = fixtures + "/pyref/bin/python";
  if (!specstream::testing::FileExists(gguf) || !specstream::testing::FileExists(python)) {
    const std::string message =
        "missing " + gguf + " or " + python + "; run tests/testing/fetch_smollm2.sh " + fixtures;
    if (specstream::testing::RunningInCi()) FAIL() << message;
    GTEST_SKIP() << message;
  }
  TempDir dir;
  GgufImportOptions options;
  options.gguf = gguf;
  options.out = dir.path() + "/hf";
  absl::Status imported = ImportGguf(options);
  ASSERT_TRUE(imported.ok()) << imported;

  // Digits, punctuation, a chat turn with its control tokens, code and
  // non-ASCII text.
  const std::vector<std::string> prompts = {
      "Hello, my name is", "The capital of France is Paris. 12345 apples cost $3.50!",
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
      "  indented\tcode:\n    def f(x): return x ** 2  # \u00fcberpr\u00fcfen \u65e5\u672c\u8a9e"};
  ASSERT_TRUE(
      WriteFileAtomically(dir.path() + "/prompts.json", nlohmann::json(prompts).dump()).ok());
  const std::string reference = dir.path() + "/reference.safetensors";
  const std::string command = absl::StrCat("'", python, "' '", specstream::testing::SourceDir(),
                                           "/tests/testing/smollm2_reference.py' '", gguf, "' '",
                                           options.out, "' '", dir.path(), "/prompts.json' '",
                                           reference, "' > '", dir.path(), "/reference.log' 2>&1");
  const int rc = std::system(command.c_str());
  ASSERT_EQ(rc, 0) << specstream::testing::ReadFile(dir.path() + "/reference.log");
  auto ref = SafetensorsFile::Open(reference);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const auto& meta = (*ref)->metadata();
  std::printf("SmolLM2 import vs transformers %s: %s of %s weights equal, max |diff| %s\n",
              meta.at("transformers").c_str(), meta.at("weights_equal").c_str(),
              meta.at("weights_compared").c_str(), meta.at("max_abs_diff").c_str());
  EXPECT_EQ(meta.at("weights_equal"), meta.at("weights_compared"));
  EXPECT_EQ(meta.at("max_abs_diff"), "0.0");

  auto tokenizer = Tokenizer::FromDirectory(options.out);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  HfRuntimeOptions runtime_options;
  runtime_options.model_dir = options.out;
  runtime_options.dtype = "float32";
  auto runtime = HfRuntime::Create(runtime_options);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  auto checkpoint = CheckpointTensors::Open(options.out);
  ASSERT_TRUE(checkpoint.ok());
  const torch::Tensor embed = *TensorFromView(*(*checkpoint)->Get("model.embed_tokens.weight"));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const torch::Tensor want_ids = *TensorFromView(*(*ref)->Get(absl::StrCat("ids.", i)));
    auto ids = (*tokenizer)->EncodeIds(prompts[i]);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_EQ(std::vector<int32_t>(want_ids.data_ptr<int32_t>(),
                                   want_ids.data_ptr<int32_t>() + want_ids.numel()),
              *ids)
        << prompts[i];
    ForwardRequest request;
    request.sequences = {*ids};
    auto captures = (*runtime)->Forward(request);
    ASSERT_TRUE(captures.ok()) << captures.status();
    const torch::Tensor logits = (*captures)[0].last_hidden.to(torch::kFloat32).matmul(embed.t());
    const torch::Tensor want = *TensorFromView(*(*ref)->Get(absl::StrCat("logits.", i)));
    const double diff = (logits - want).abs().max().item<double>();
    const double scale = want.abs().max().item<double>();
    const bool same_argmax = torch::equal(logits.argmax(-1), want.argmax(-1));
    std::printf("prompt %zu (%zu tokens): max |logit diff| %.3g (max |logit| %.3g), argmax %s\n", i,
                ids->size(), diff, scale, same_argmax ? "equal" : "differs");
    EXPECT_LE(diff, 1e-4 * scale) << prompts[i];
    EXPECT_TRUE(same_argmax) << prompts[i];
  }
}

}  // namespace
}  // namespace specstream::teacher
