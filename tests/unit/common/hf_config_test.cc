#include "common/hf_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Published config.json files (as on the Hugging Face Hub), verbatim apart
// from formatting.
constexpr char kLlama31_8B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kQwen25_7B[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 18944,
  "max_position_embeddings": 131072,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 152064
})";

constexpr char kQwen3_8B[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen3-0.6B: head_dim (128) differs from hidden_size / heads (64).
constexpr char kQwen3_06B[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kMistral7B[] = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr char kQwen3_30B_A3B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kMixtral8x7B[] = R"({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// A minimal config of `model_type` with the required sizes, plus `extra`
// fields (a JSON object's members, without braces).
std::string Minimal(const std::string& model_type, const std::string& extra = "") {
  return R"({"model_type": ")" + model_type +
         R"(", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 8, "num_attention_heads": 8)" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

HfModelConfig MustParse(const std::string& json) {
  auto config = ParseHfConfig(json);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : HfModelConfig();
}

void ExpectError(const std::string& json, const std::vector<std::string>& pieces) {
  auto config = ParseHfConfig(json);
  ASSERT_FALSE(config.ok()) << "accepted: " << json;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& piece : pieces) {
    EXPECT_THAT(config.status().message(), HasSubstr(piece));
  }
}

// ---------------------------------------------------------------------------
// Published configs

TEST(HfConfigTest, Llama31_8B) {
  HfModelConfig c = MustParse(kLlama31_8B);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_THAT(c.architectures, ElementsAre("LlamaForCausalLM"));
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_TRUE(c.eos_token_id_is_list);
  EXPECT_FALSE(c.is_moe());
}

TEST(HfConfigTest, Qwen25_7B) {
  HfModelConfig c = MustParse(kQwen25_7B);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.hidden_size, 3584);
  EXPECT_EQ(c.num_attention_heads, 28);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 152064);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_TRUE(c.attention_bias);  // Qwen2 always has q/k/v biases.
  // use_sliding_window is false, so the 131072 window does not apply.
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.max_window_layers, 28);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151643));
  EXPECT_FALSE(c.eos_token_id_is_list);
}

TEST(HfConfigTest, Qwen3_8BHonoursExplicitHeadDim) {
  HfModelConfig c = MustParse(kQwen3_8B);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // Written as an integer in the file.
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_FALSE(c.attention_bias);

  HfModelConfig small = MustParse(kQwen3_06B);
  EXPECT_EQ(small.head_dim, 128);
  EXPECT_NE(small.head_dim, small.hidden_size / small.num_attention_heads);
  EXPECT_TRUE(small.tie_word_embeddings);
}

TEST(HfConfigTest, Mistral7B) {
  HfModelConfig c = MustParse(kMistral7B);
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_FALSE(c.attention_bias);
}

TEST(HfConfigTest, Qwen3_30B_A3B) {
  HfModelConfig c = MustParse(kQwen3_30B_A3B);
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.head_dim, 128);  // Not 2048 / 32.
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.001);
  EXPECT_FALSE(c.shared_expert_intermediate_size.has_value());
  EXPECT_TRUE(c.IsMoeLayer(0));
  EXPECT_TRUE(c.IsMoeLayer(47));
}

TEST(HfConfigTest, Mixtral8x7B) {
  HfModelConfig c = MustParse(kMixtral8x7B);
  EXPECT_EQ(c.model_type, "mixtral");
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.02);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_TRUE(c.IsMoeLayer(5));
}

// ---------------------------------------------------------------------------
// Defaults

TEST(HfConfigTest, DefaultsFollowTransformers) {
  HfModelConfig llama = MustParse(Minimal("llama"));
  EXPECT_THAT(llama.architectures, ElementsAre("LlamaForCausalLM"));
  EXPECT_EQ(llama.num_key_value_heads, 8);  // = num_attention_heads
  EXPECT_EQ(llama.head_dim, 32);            // = 256 / 8
  EXPECT_DOUBLE_EQ(llama.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(llama.rms_norm_eps, 1e-6);
  EXPECT_EQ(llama.max_position_embeddings, 2048);
  EXPECT_FALSE(llama.tie_word_embeddings);
  EXPECT_EQ(llama.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_FALSE(llama.bos_token_id.has_value());
  EXPECT_TRUE(llama.eos_token_ids.empty());
  EXPECT_TRUE(llama.torch_dtype.empty());

  EXPECT_EQ(MustParse(Minimal("qwen3")).head_dim, 128);     // Qwen3Config default.
  EXPECT_EQ(MustParse(Minimal("qwen3_moe")).head_dim, 32);  // hidden / heads.
  EXPECT_EQ(MustParse(Minimal("mistral")).sliding_window, 4096);
  EXPECT_FALSE(MustParse(Minimal("mistral", R"("sliding_window": null)")).sliding_window);
  EXPECT_FALSE(MustParse(Minimal("qwen2")).sliding_window);
  EXPECT_EQ(MustParse(Minimal("qwen2", R"("use_sliding_window": true)")).sliding_window, 4096);
  EXPECT_TRUE(MustParse(Minimal("qwen2", R"("attention_bias": false)")).attention_bias);
  EXPECT_FALSE(MustParse(Minimal("mistral", R"("attention_bias": true)")).attention_bias);

  HfModelConfig mixtral = MustParse(Minimal("mixtral"));
  EXPECT_DOUBLE_EQ(mixtral.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(mixtral.rms_norm_eps, 1e-5);
  EXPECT_EQ(mixtral.num_experts, 8);
  EXPECT_EQ(mixtral.num_experts_per_tok, 2);

  HfModelConfig moe = MustParse(Minimal("qwen3_moe"));
  EXPECT_EQ(moe.num_experts, 128);
  EXPECT_EQ(moe.num_experts_per_tok, 8);
  EXPECT_FALSE(moe.norm_topk_prob);

  // transformers >= 4.56 writes "dtype" instead of "torch_dtype".
  EXPECT_EQ(MustParse(Minimal("llama", R"("dtype": "float16")")).torch_dtype, "float16");
}

TEST(HfConfigTest, SparseLayersFollowMlpOnlyLayersAndStep) {
  HfModelConfig c =
      MustParse(Minimal("qwen3_moe", R"("decoder_sparse_step": 2, "mlp_only_layers": [3])"));
  EXPECT_FALSE(c.IsMoeLayer(0));
  EXPECT_TRUE(c.IsMoeLayer(1));
  EXPECT_FALSE(c.IsMoeLayer(2));
  EXPECT_FALSE(c.IsMoeLayer(3));  // Listed dense.
  EXPECT_TRUE(c.IsMoeLayer(5));
}

TEST(HfConfigTest, RopeScalingVariants) {
  HfModelConfig yarn = MustParse(Minimal("qwen2", R"("rope_scaling": {"type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 32768})"));
  EXPECT_EQ(yarn.rope_scaling.kind, RopeScaling::Kind::kYarn);
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.factor, 4.0);
  EXPECT_EQ(yarn.rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.beta_slow, 1.0);
  EXPECT_FALSE(yarn.rope_scaling.mscale.has_value());

  HfModelConfig yarn_full = MustParse(
      Minimal("llama", R"("rope_scaling": {"rope_type": "yarn", "factor": 2, "beta_fast": 16,
                   "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0,
                   "attention_factor": 1.1})"));
  EXPECT_DOUBLE_EQ(yarn_full.rope_scaling.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(*yarn_full.rope_scaling.mscale, 0.707);
  EXPECT_DOUBLE_EQ(*yarn_full.rope_scaling.attention_factor, 1.1);

  HfModelConfig linear =
      MustParse(Minimal("llama", R"("rope_scaling": {"type": "linear", "factor": 2.0})"));
  EXPECT_EQ(linear.rope_scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_DOUBLE_EQ(linear.rope_scaling.factor, 2.0);

  EXPECT_EQ(
      MustParse(Minimal("llama", R"("rope_scaling": {"rope_type": "default"})")).rope_scaling.kind,
      RopeScaling::Kind::kNone);
}

// ---------------------------------------------------------------------------
// Errors

TEST(HfConfigTest, RefusesUnsupportedModelTypeByName) {
  ExpectError(Minimal("gpt2"), {"unsupported model_type \"gpt2\"",
                                "(supported: llama, qwen2, qwen3, mistral, qwen3_moe, mixtral)"});
  ExpectError(R"({"vocab_size": 10})", {"\"model_type\"", "missing"});
}

TEST(HfConfigTest, RefusesBadFieldsNamingThem) {
  ExpectError("{not json", {"not valid JSON"});
  ExpectError("[1]", {"JSON object"});
  ExpectError(Minimal("llama", R"("hidden_size": 0)"), {"\"hidden_size\"", "must be positive"});
  ExpectError(Minimal("llama", R"("vocab_size": -5)"), {"\"vocab_size\"", "must be positive"});
  ExpectError(Minimal("llama", R"("vocab_size": "big")"), {"\"vocab_size\"", "must be an integer"});
  ExpectError(Minimal("llama", R"("vocab_size": 1000.5)"),
              {"\"vocab_size\"", "must be an integer"});
  ExpectError(R"({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                  "num_hidden_layers": 8, "num_attention_heads": 8})",
              {"\"vocab_size\"", "missing"});
  ExpectError(Minimal("llama", R"("num_attention_heads": 7)"),
              {"\"num_attention_heads\"", "does not divide hidden_size 256"});
  ExpectError(Minimal("llama", R"("num_key_value_heads": 3)"),
              {"\"num_key_value_heads\"", "3 does not divide num_attention_heads 8"});
  ExpectError(Minimal("llama", R"("tie_word_embeddings": "yes")"),
              {"\"tie_word_embeddings\"", "true or false"});
  ExpectError(Minimal("llama", R"("rms_norm_eps": 0)"), {"\"rms_norm_eps\"", "positive"});
  ExpectError(Minimal("llama", R"("hidden_act": "gelu")"), {"\"hidden_act\"", "gelu"});
  ExpectError(Minimal("llama", R"("torch_dtype": "int8")"), {"\"torch_dtype\"", "int8"});
  ExpectError(Minimal("mistral", R"("sliding_window": 0)"), {"\"sliding_window\"", "positive"});
  ExpectError(Minimal("llama", R"("eos_token_id": [1, "x"])"), {"\"eos_token_id\""});
  ExpectError(Minimal("llama", R"("architectures": "LlamaForCausalLM")"),
              {"\"architectures\"", "list of strings"});
}

TEST(HfConfigTest, ExplicitHeadDimNeedNotDivideHidden) {
  HfModelConfig c =
      MustParse(Minimal("llama", R"("num_attention_heads": 7, "num_key_value_heads": 7,
                                                   "head_dim": 64)"));
  EXPECT_EQ(c.head_dim, 64);
  ExpectError(Minimal("llama", R"("head_dim": 0)"), {"\"head_dim\"", "must be positive"});
}

TEST(HfConfigTest, RefusesBadRopeScaling) {
  ExpectError(
      Minimal("llama", R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"),
      {"rope_scaling.rope_type", "\"dynamic\"", "supported: default, linear, llama3, yarn"});
  ExpectError(Minimal("llama", R"("rope_scaling": {"factor": 2.0})"),
              {"\"rope_scaling\"", "rope_type"});
  ExpectError(Minimal("llama", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0})"),
              {"rope_scaling.original_max_position_embeddings", "missing"});
  ExpectError(Minimal("llama", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                   "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                                   "original_max_position_embeddings": 8192})"),
              {"rope_scaling.high_freq_factor", "greater than low_freq_factor"});
  ExpectError(Minimal("llama", R"("rope_scaling": {"rope_type": "linear"})"),
              {"rope_scaling.factor", "missing"});
  ExpectError(Minimal("llama", R"("rope_scaling": {"rope_type": "linear", "factor": 0.5})"),
              {"rope_scaling.factor", ">= 1"});
  ExpectError(Minimal("llama", R"("rope_scaling": {"rope_type": "yarn", "factor": "4"})"),
              {"rope_scaling.factor", "must be a number"});
  ExpectError(Minimal("llama", R"("rope_scaling": 4)"), {"\"rope_scaling\"", "null or an object"});
}

// P13 item 19: transformers 5 writes RoPE as "rope_parameters". It used to
// be ignored: the family's default theta and no scaling, silently.
TEST(HfConfigTest, RopeParametersOfTransformers5) {
  HfModelConfig c = MustParse(Minimal("llama", R"("rope_parameters": {"rope_type": "llama3",
      "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192})"));
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);

  c = MustParse(
      Minimal("qwen2", R"("rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0})"));
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kNone);

  // One object per layer type, the same for every type.
  c = MustParse(Minimal("llama", R"("rope_parameters": {
      "full_attention": {"rope_type": "default", "rope_theta": 20000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}})"));
  EXPECT_DOUBLE_EQ(c.rope_theta, 20000.0);
  // Both forms, agreeing.
  c = MustParse(Minimal("llama", R"("rope_theta": 30000.0,
      "rope_parameters": {"rope_type": "default", "rope_theta": 30000.0})"));
  EXPECT_DOUBLE_EQ(c.rope_theta, 30000.0);

  ExpectError(Minimal("llama", R"("rope_parameters": {
      "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})"),
              {"rope_parameters", "full_attention", "sliding_attention", "different RoPE"});
  ExpectError(Minimal("llama", R"("rope_parameters": {"rope_type": "default",
      "rope_theta": 10000.0, "partial_rotary_factor": 0.5})"),
              {"rope_parameters.partial_rotary_factor", "not supported"});
  ExpectError(Minimal("llama", R"("rope_theta": 10000.0,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})"),
              {"rope_parameters", "disagrees with rope_theta"});
  ExpectError(Minimal("llama", R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0})"),
              {"rope_parameters.rope_type", "\"dynamic\""});
  ExpectError(Minimal("llama", R"("rope_parameters": 7)"), {"rope_parameters", "an object"});
}

TEST(HfConfigTest, RefusesBadMoeFields) {
  ExpectError(Minimal("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 8)"),
              {"\"num_experts_per_tok\"", "8 exceeds num_experts 4"});
  ExpectError(Minimal("mixtral", R"("num_local_experts": 2, "num_experts_per_tok": 3)"),
              {"\"num_experts_per_tok\"", "exceeds num_local_experts 2"});
  ExpectError(Minimal("mixtral", R"("num_local_experts": 0)"),
              {"\"num_local_experts\"", "must be positive"});
  ExpectError(Minimal("qwen3_moe", R"("moe_intermediate_size": 0)"),
              {"\"moe_intermediate_size\"", "must be positive"});
  ExpectError(Minimal("qwen3_moe", R"("mlp_only_layers": [8])"),
              {"\"mlp_only_layers\"", "layer 8 out of range"});
  ExpectError(Minimal("qwen3_moe", R"("decoder_sparse_step": 0)"),
              {"\"decoder_sparse_step\"", "must be positive"});
}

// ---------------------------------------------------------------------------
// Writing config.json

void ExpectSameConfig(const HfModelConfig& a, const HfModelConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.architectures, b.architectures);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.kind, b.rope_scaling.kind);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.rope_scaling.mscale, b.rope_scaling.mscale);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.max_window_layers, b.max_window_layers);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.eos_token_id_is_list, b.eos_token_id_is_list);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.decoder_sparse_step, b.decoder_sparse_step);
  EXPECT_EQ(a.mlp_only_layers, b.mlp_only_layers);
  EXPECT_EQ(a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
  EXPECT_EQ(a.router_aux_loss_coef, b.router_aux_loss_coef);
}

TEST(HfConfigTest, RoundTripsThroughHfConfigToJson) {
  const std::vector<std::string> configs = {
      kLlama31_8B,
      kQwen25_7B,
      kQwen3_8B,
      kQwen3_06B,
      kMistral7B,
      kQwen3_30B_A3B,
      kMixtral8x7B,
      Minimal("qwen2", R"("use_sliding_window": true, "sliding_window": 2048,
                          "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 0.5})"),
      Minimal("llama", R"("attention_bias": true, "mlp_bias": true, "tie_word_embeddings": true,
                          "rope_scaling": {"rope_type": "linear", "factor": 3.0})"),
      Minimal("qwen3_moe", R"("mlp_only_layers": [0, 7], "decoder_sparse_step": 2,
                              "shared_expert_intermediate_size": 1024)"),
  };
  for (const std::string& text : configs) {
    HfModelConfig original = MustParse(text);
    SCOPED_TRACE(original.model_type);
    const std::string written = HfConfigToJson(original);
    HfModelConfig reparsed = MustParse(written);
    ExpectSameConfig(original, reparsed);
    EXPECT_EQ(HfConfigToJson(reparsed), written);  // Deterministic.
  }
}

// Found with hf_config_fuzz's round-trip oracle: a llama config.json's
// sliding_window was honoured (the teacher windowed its attention, which
// transformers' Llama never does), and HfConfigToJson, which writes no
// window for llama, lost it.
TEST(HfConfigTest, LlamaIgnoresSlidingWindowAsTransformersDoes) {
  const HfModelConfig llama = MustParse(Minimal("llama", R"("sliding_window": 4096)"));
  EXPECT_FALSE(llama.sliding_window.has_value());
  ExpectSameConfig(llama, MustParse(HfConfigToJson(llama)));
  EXPECT_EQ(MustParse(Minimal("mistral", R"("sliding_window": 1024)")).sliding_window, 1024);

  HfModelConfig windowed = llama;
  windowed.sliding_window = 4096;
  const absl::Status status = ValidateHfConfig(windowed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("sliding_window"), HasSubstr("llama")));
}

// Found with hf_config_fuzz: values nested 300k deep overflowed the stack in
// nlohmann's dump (the error message for a mistyped field) and == (the
// per-layer-type rope_parameters comparison). Nesting is bounded at parse.
TEST(HfConfigTest, DeeplyNestedValuesAreRefused) {
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  ExpectError(R"({"model_type": )" + deep + "}", {"nests values more than 64 levels deep"});
  ExpectError(Minimal("llama", R"("rope_parameters": {"full_attention": {"x": )" + deep +
                                   R"(}, "sliding_attention": {"x": )" + deep + "}}"),
              {"64 levels"});
  ExpectError(Minimal("llama", R"("unknown": )" + std::string(65, '[') + std::string(65, ']')),
              {"64 levels"});
  // Unknown keys nested within the limit are still ignored.
  MustParse(Minimal("llama", R"("unknown": )" + std::string(63, '[') + std::string(63, ']')));
}

TEST(HfConfigTest, RefusesIntegerListItemsPastInt64) {
  ExpectError(Minimal("llama", R"("eos_token_id": [2, 18446744073709551615])"),
              {"\"eos_token_id\"", "out of range", "18446744073709551615"});
}

TEST(HfConfigTest, WrittenJsonUsesModelTypeSpecificNames) {
  const Json mixtral = Json::parse(HfConfigToJson(MustParse(kMixtral8x7B)));
  EXPECT_EQ(mixtral["num_local_experts"], 8);
  EXPECT_FALSE(mixtral.contains("num_experts"));
  EXPECT_FALSE(mixtral.contains("moe_intermediate_size"));
  EXPECT_FALSE(mixtral.contains("mlp_bias"));

  const Json moe = Json::parse(HfConfigToJson(MustParse(kQwen3_30B_A3B)));
  EXPECT_EQ(moe["num_experts"], 128);
  EXPECT_EQ(moe["moe_intermediate_size"], 768);
  EXPECT_EQ(moe["norm_topk_prob"], true);
  EXPECT_EQ(moe["decoder_sparse_step"], 1);
  EXPECT_TRUE(moe["mlp_only_layers"].is_array());
  EXPECT_FALSE(moe.contains("num_local_experts"));
  EXPECT_EQ(moe["head_dim"], 128);
  EXPECT_EQ(moe["use_sliding_window"], false);

  const Json llama = Json::parse(HfConfigToJson(MustParse(kLlama31_8B)));
  EXPECT_EQ(llama["architectures"], Json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(llama["attention_bias"], false);
  EXPECT_EQ(llama["mlp_bias"], false);
  EXPECT_EQ(llama["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(llama["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(llama["eos_token_id"], Json::array({128001, 128008, 128009}));
  EXPECT_EQ(llama["torch_dtype"], "bfloat16");
  EXPECT_FALSE(llama.contains("num_experts"));
  EXPECT_FALSE(llama.contains("sliding_window"));

  const Json qwen2 = Json::parse(HfConfigToJson(MustParse(kQwen25_7B)));
  EXPECT_FALSE(qwen2.contains("attention_bias"));  // Implicit in Qwen2.
  EXPECT_TRUE(qwen2["rope_scaling"].is_null());
  EXPECT_EQ(qwen2["eos_token_id"], 151643);
}

TEST(HfConfigTest, LoadsFromFileOrDirectory) {
  specstream::testing::TempDir dir;
  specstream::testing::WriteFile(dir.Join("config.json"), kMistral7B);
  auto from_dir = LoadHfConfig(dir.path());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  EXPECT_EQ(from_dir->model_type, "mistral");
  auto from_file = LoadHfConfig(dir.Join("config.json"));
  ASSERT_TRUE(from_file.ok());
  EXPECT_EQ(from_file->sliding_window, 4096);

  specstream::testing::WriteFile(dir.Join("bad.json"), Minimal("gpt2"));
  auto bad = LoadHfConfig(dir.Join("bad.json"));
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("bad.json"), HasSubstr("\"gpt2\"")));
  auto missing = LoadHfConfig(dir.Join("nope"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace specstream
