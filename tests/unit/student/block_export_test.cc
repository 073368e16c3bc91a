// The DFlash / DSpark export (student/block_export.h): the exact tensor set,
// the config keys, refusals that write nothing, a round trip through
// ReadBlockExport, and a replay of the public loaders' name mapping over the
// file we write.
#include "student/block_export.h"

#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "common/torch/tensor_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "student/export.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::student {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

constexpr int64_t kH = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8, kI = 48, kV = 128;
constexpr int64_t kTargetLayers = 8, kRank = 6;

// Nothing but `allowed` in `parent`: no partial directory, no temporaries.
void ExpectOnly(const std::string& parent, const std::set<std::string>& allowed) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(parent)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, allowed);
}

// A copy whose tensors share no storage with `in`'s (edits stay local).
BlockExport Clone(const BlockExport& in) {
  BlockExport out = in;
  for (auto& [name, t] : out.tensors) t = t.clone();
  return out;
}

nlohmann::json ReadConfig(const std::string& dir) {
  return nlohmann::json::parse(testing::ReadFile(dir + "/config.json"));
}

// Tensor name -> shape as the file holds them.
std::map<std::string, Shape> FileShapes(const std::string& dir) {
  std::map<std::string, Shape> out;
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  for (const std::string& name : (*file)->names()) out[name] = (*file)->Get(name)->shape;
  return out;
}

class BlockExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_dir_ = tmp_.Join("target");
    testing::TinyModelOptions model;
    model.arch = "qwen3";
    model.layers = kTargetLayers;
    model.hidden = kH;
    model.heads = kHeads;
    model.kv_heads = kKvHeads;
    model.intermediate = 64;
    model.vocab = kV;
    model.edit_config = [](HfModelConfig& c) {
      c.bos_token_id = 1;
      c.eos_token_ids = {2, 3};
      c.eos_token_id_is_list = true;
      c.rope_theta = 1e6;
      c.rms_norm_eps = 1e-5;
      c.rope_scaling.kind = RopeScaling::Kind::kLinear;
      c.rope_scaling.factor = 2.0;
    };
    testing::WriteTinyModel(target_dir_, model);
    auto target = LoadHfConfig(target_dir_);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *target;
    shape_.hidden_size = shape_.target_hidden_size = kH;
    shape_.num_captures = 2;
    shape_.intermediate_size = kI;  // the draft's own MLP width
    shape_.num_attention_heads = kHeads;
    shape_.num_key_value_heads = kKvHeads;
    shape_.head_dim = kHeadDim;
    shape_.target_vocab_size = shape_.draft_vocab_size = kV;
    shape_.rms_norm_eps = target_.rms_norm_eps;
    shape_.rope_theta = target_.rope_theta;
    shape_.rope_scaling = target_.rope_scaling;
    shape_.max_position_embeddings = target_.max_position_embeddings;
  }

  static BlockDraftOptions Options(BlockDraftKind kind, bool confidence = true,
                                   bool with_markov = true) {
    BlockDraftOptions o;
    o.kind = kind;
    o.num_layers = 2;
    o.block_size = kind == BlockDraftKind::kDFlash ? 16 : 7;
    o.mask_token_id = 127;
    o.target_layer_ids = {1, 5};  // DefaultBlockTargetLayerIds(2, 8)
    o.markov_rank = kRank;
    o.confidence_head = confidence;
    o.confidence_with_markov = with_markov;
    return o;
  }

  std::unique_ptr<BlockDraft> Draft(const BlockDraftOptions& options) {
    auto draft = BlockDraft::Create(shape_, options, target_dir_, /*seed=*/5);
    EXPECT_TRUE(draft.ok()) << draft.status();
    // Non-trivial norms and Markov output (Create starts them at 1 and 0).
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : (*draft)->parameters()) {
      (*draft)->parameter(name).add_(torch::randn_like(p) * 0.1);
    }
    return std::move(draft).value();
  }

  BlockExport Export(const BlockDraftOptions& options) {
    auto in = BlockExportFromDraft(*Draft(options), target_);
    EXPECT_TRUE(in.ok()) << in.status();
    return std::move(in).value();
  }

  void ExpectRefused(const BlockExport& in, const std::string& needle) {
    testing::TempDir dir;
    absl::Status status = WriteBlockExport(in, dir.Join("draft"));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << needle << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(needle));
    ExpectOnly(dir.path(), {});  // Nothing written, not even a temporary.
  }

  testing::TempDir tmp_;
  std::string target_dir_;
  HfModelConfig target_;
  DraftShape shape_;
};

// The names and shapes listed in DESIGN §10, written out by hand.
std::map<std::string, Shape> ExpectedShapes(bool dspark, bool confidence, bool with_markov) {
  std::map<std::string, Shape> out = {
      {"fc.weight", {kH, 2 * kH}}, {"hidden_norm.weight", {kH}}, {"norm.weight", {kH}}};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = absl::StrCat("layers.", layer, ".");
    out[p + "self_attn.q_proj.weight"] = {kHeads * kHeadDim, kH};
    out[p + "self_attn.k_proj.weight"] = {kKvHeads * kHeadDim, kH};
    out[p + "self_attn.v_proj.weight"] = {kKvHeads * kHeadDim, kH};
    out[p + "self_attn.o_proj.weight"] = {kH, kHeads * kHeadDim};
    out[p + "self_attn.q_norm.weight"] = {kHeadDim};
    out[p + "self_attn.k_norm.weight"] = {kHeadDim};
    out[p + "mlp.gate_proj.weight"] = {kI, kH};
    out[p + "mlp.up_proj.weight"] = {kI, kH};
    out[p + "mlp.down_proj.weight"] = {kH, kI};
    out[p + "input_layernorm.weight"] = {kH};
    out[p + "post_attention_layernorm.weight"] = {kH};
  }
  if (dspark) {
    out["markov_head.markov_w1.weight"] = {kV, kRank};
    out["markov_head.markov_w2.weight"] = {kV, kRank};
    if (confidence) {
      out["confidence_head.proj.weight"] = {1, with_markov ? kH + kRank : kH};
      out["confidence_head.proj.bias"] = {1};
    }
  }
  return out;
}

TEST_F(BlockExportTest, WritesExactlyTheListedTensorsInBfloat16) {
  struct Case {
    BlockDraftKind kind;
    bool confidence, with_markov;
  };
  for (const Case& c :
       {Case{BlockDraftKind::kDFlash, false, false}, Case{BlockDraftKind::kDSpark, true, true},
        Case{BlockDraftKind::kDSpark, true, false}, Case{BlockDraftKind::kDSpark, false, false}}) {
    SCOPED_TRACE(absl::StrCat(BlockDraftKindName(c.kind), " confidence ", c.confidence,
                              " with_markov ", c.with_markov));
    testing::TempDir dir;
    const std::string out = dir.Join("draft");
    auto draft = Draft(Options(c.kind, c.confidence, c.with_markov));
    ASSERT_TRUE(ExportBlockDraft(*draft, target_, out).ok());
    ExpectOnly(dir.path(), {"draft"});
    ExpectOnly(out, {"config.json", "model.safetensors"});
    const bool dspark = c.kind == BlockDraftKind::kDSpark;
    EXPECT_EQ(FileShapes(out), ExpectedShapes(dspark, c.confidence, c.with_markov));
    auto file = SafetensorsFile::Open(out + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    EXPECT_EQ((*file)->metadata().at("format"), "pt");
    for (const std::string& name : (*file)->names()) {
      EXPECT_EQ((*file)->Get(name)->dtype, DType::kBF16) << name;
      EXPECT_FALSE(absl::StrContains(name, "embed_tokens")) << name;
      EXPECT_FALSE(absl::StrContains(name, "lm_head")) << name;
    }
  }
}

TEST_F(BlockExportTest, Float32AndFloat16AreSelectable) {
  auto draft = Draft(Options(BlockDraftKind::kDSpark));
  for (auto [name, dtype] :
       {std::pair<const char*, DType>{"float32", DType::kF32}, {"float16", DType::kF16}}) {
    testing::TempDir dir;
    const std::string out = dir.Join("draft");
    ASSERT_TRUE(ExportBlockDraft(*draft, target_, out, name).ok());
    EXPECT_EQ(ReadConfig(out)["torch_dtype"], name);
    auto file = SafetensorsFile::Open(out + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    for (const std::string& t : (*file)->names()) EXPECT_EQ((*file)->Get(t)->dtype, dtype) << t;
  }
  auto back = [&] {
    testing::TempDir dir;
    EXPECT_TRUE(ExportBlockDraft(*draft, target_, dir.Join("d"), "float32").ok());
    return ReadBlockExport(dir.Join("d"));
  }();
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& [name, p] : draft->parameters()) {
    EXPECT_TRUE(torch::equal(back->tensors.at(name), p.detach())) << name;  // float32: exact
  }
}

// The Qwen3 fields every kind carries.
void ExpectQwen3Fields(const nlohmann::json& c) {
  EXPECT_EQ(c["model_type"], "qwen3");
  EXPECT_EQ(c["hidden_size"], kH);
  EXPECT_EQ(c["intermediate_size"], kI);
  EXPECT_EQ(c["num_hidden_layers"], 2);  // the draft's layers
  EXPECT_EQ(c["num_attention_heads"], kHeads);
  EXPECT_EQ(c["num_key_value_heads"], kKvHeads);
  EXPECT_EQ(c["head_dim"], kHeadDim);
  // rms_norm_eps, rope and positions are the target's.
  EXPECT_DOUBLE_EQ(c["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(c["rope_theta"].get<double>(), 1e6);
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "linear");
  EXPECT_DOUBLE_EQ(c["rope_scaling"]["factor"].get<double>(), 2.0);
  EXPECT_GT(c["max_position_embeddings"].get<int64_t>(), 0);
  EXPECT_EQ(c["vocab_size"], kV);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(c["layer_types"], nlohmann::json::array({"full_attention", "full_attention"}));
  EXPECT_EQ(c["block_size"].is_number_integer(), true);
  EXPECT_EQ(c["num_target_layers"], kTargetLayers);
  EXPECT_FALSE(c.dump().find("embed_tokens") != std::string::npos);
}

TEST_F(BlockExportTest, DFlashConfigKeys) {
  testing::TempDir dir;
  ASSERT_TRUE(
      ExportBlockDraft(*Draft(Options(BlockDraftKind::kDFlash)), target_, dir.Join("d")).ok());
  nlohmann::json c = ReadConfig(dir.Join("d"));
  ExpectQwen3Fields(c);
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"DFlashDraftModel"}));
  EXPECT_EQ(
      c["dflash_config"],
      (nlohmann::json{{"target_layer_ids", {1, 5}}, {"mask_token_id", 127}, {"block_size", 16}}));
  EXPECT_EQ(c["block_size"], 16);
  for (const char* dspark_only :
       {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
        "mask_token_id", "target_layer_ids"}) {
    EXPECT_FALSE(c.contains(dspark_only)) << dspark_only;
  }
}

TEST_F(BlockExportTest, DSparkConfigKeys) {
  for (bool with_markov : {true, false}) {
    testing::TempDir dir;
    ASSERT_TRUE(ExportBlockDraft(*Draft(Options(BlockDraftKind::kDSpark, true, with_markov)),
                                 target_, dir.Join("d"))
                    .ok());
    nlohmann::json c = ReadConfig(dir.Join("d"));
    ExpectQwen3Fields(c);
    EXPECT_EQ(c["architectures"], nlohmann::json::array({"Qwen3DSparkModel"}));
    EXPECT_EQ(c["block_size"], 7);
    EXPECT_EQ(c["mask_token_id"], 127);
    EXPECT_EQ(c["target_layer_ids"], nlohmann::json::array({1, 5}));
    EXPECT_EQ(c["markov_rank"], kRank);
    EXPECT_EQ(c["markov_head_type"], "vanilla");
    EXPECT_EQ(c["enable_confidence_head"], true);
    EXPECT_EQ(c["confidence_head_with_markov"], with_markov);
    EXPECT_FALSE(c.contains("dflash_config"));
    // SGLang refuses speculators-convention DSpark checkpoints (another slot layout).
    EXPECT_FALSE(c.contains("speculators_model_type"));
  }
}

TEST_F(BlockExportTest, RefusesEachMissingAndEachMisShapedTensor) {
  for (BlockDraftKind kind : {BlockDraftKind::kDFlash, BlockDraftKind::kDSpark}) {
    const BlockExport good = Export(Options(kind));
    for (const auto& [name, t] : good.tensors) {
      BlockExport in = good;
      in.tensors.erase(name);
      ExpectRefused(in, "tensor " + name + ": missing");
      in = good;
      in.tensors[name] = torch::cat({t, t.narrow(0, 0, 1)}, 0);
      ExpectRefused(in, "tensor " + name + ": shape");
    }
  }
}

TEST_F(BlockExportTest, RefusesExtraTensors) {
  const BlockExport good = Export(Options(BlockDraftKind::kDSpark, /*confidence=*/false));
  for (const char* name :
       {"embed_tokens.weight", "lm_head.weight", "model.embed_tokens.weight",
        "layers.2.mlp.up_proj.weight", "rotary_emb.inv_freq", "confidence_head.proj.weight"}) {
    BlockExport in = good;
    in.tensors[name] = torch::zeros({2});
    ExpectRefused(in, absl::StrCat("tensor ", name, ": not "));
  }
  // The Markov head is DSpark's only.
  BlockExport in = Export(Options(BlockDraftKind::kDFlash));
  in.tensors["markov_head.markov_w1.weight"] = torch::zeros({kV, kRank});
  ExpectRefused(in, "tensor markov_head.markov_w1.weight: not part of a dflash export");
}

TEST_F(BlockExportTest, RefusesNonFiniteAndNonFloatTensors) {
  const BlockExport good = Export(Options(BlockDraftKind::kDSpark));
  BlockExport in = Clone(good);
  in.tensors["layers.1.mlp.up_proj.weight"][3][1] = std::numeric_limits<float>::quiet_NaN();
  ExpectRefused(in, "tensor layers.1.mlp.up_proj.weight: contains NaN");
  in = Clone(good);
  in.tensors["confidence_head.proj.bias"][0] = std::numeric_limits<float>::infinity();
  ExpectRefused(in, "tensor confidence_head.proj.bias: contains NaN or infinity");
  in = good;
  in.tensors["norm.weight"] = torch::ones({kH}, torch::kInt64);
  ExpectRefused(in, "tensor norm.weight: dtype");
  // Straight from a draft whose parameter went bad.
  auto draft = Draft(Options(BlockDraftKind::kDFlash));
  {
    torch::NoGradGuard no_grad;
    draft->parameter("fc.weight")[0][0] = std::numeric_limits<float>::infinity();
  }
  testing::TempDir dir;
  absl::Status status = ExportBlockDraft(*draft, target_, dir.Join("d"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("tensor fc.weight: contains NaN"));
  ExpectOnly(dir.path(), {});
}

TEST_F(BlockExportTest, RefusesBadConfigFields) {
  const BlockExport good = Export(Options(BlockDraftKind::kDSpark));
  BlockExport in = good;
  in.options.target_layer_ids = {1, 8};  // the target has layers 0..7
  ExpectRefused(in, "config.target_layer_ids: id 8");
  in = good;
  in.options.target_layer_ids = {1, 2, 3};
  ExpectRefused(in, "config.target_layer_ids: 3 ids for 2");
  in = good;
  in.num_target_layers = 0;
  ExpectRefused(in, "config.num_target_layers");
  in = good;
  in.options.mask_token_id = kV;
  ExpectRefused(in, "config.mask_token_id");
  in = good;
  in.options.markov_rank = 0;
  ExpectRefused(in, "config.markov_rank");
  in = good;
  in.torch_dtype = "float64";
  ExpectRefused(in, "config.torch_dtype");
  in = good;
  in.shape.num_key_value_heads = 3;
  ExpectRefused(in, "num_key_value_heads");
  in = Export(Options(BlockDraftKind::kDFlash));
  in.options.block_size = 1;
  ExpectRefused(in, "config.block_size");
}

TEST_F(BlockExportTest, ReplacesAnExistingExportOnlyAfterSuccess) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  BlockExport first = Export(Options(BlockDraftKind::kDFlash));
  ASSERT_TRUE(WriteBlockExport(first, out).ok());
  const std::string before = testing::ReadFile(out + "/model.safetensors");
  BlockExport broken = first;
  broken.tensors.erase("norm.weight");
  EXPECT_FALSE(WriteBlockExport(broken, out).ok());
  EXPECT_EQ(testing::ReadFile(out + "/model.safetensors"), before);
  BlockExport second = Export(Options(BlockDraftKind::kDSpark));
  ASSERT_TRUE(WriteBlockExport(second, out).ok());
  EXPECT_EQ(ReadConfig(out)["architectures"], nlohmann::json::array({"Qwen3DSparkModel"}));
  ExpectOnly(dir.path(), {"draft"});
  // A directory that is not an export is never replaced.
  testing::WriteFile(out + "/notes.txt", "mine");
  EXPECT_EQ(WriteBlockExport(first, out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(testing::ReadFile(out + "/notes.txt"), "mine");
}

TEST_F(BlockExportTest, ReadBlockExportRoundTrip) {
  for (const BlockDraftOptions& options :
       {Options(BlockDraftKind::kDFlash), Options(BlockDraftKind::kDSpark, true, false),
        Options(BlockDraftKind::kDSpark, false, false)}) {
    SCOPED_TRACE(BlockDraftKindName(options.kind));
    auto draft = Draft(options);
    testing::TempDir dir;
    ASSERT_TRUE(ExportBlockDraft(*draft, target_, dir.Join("d")).ok());
    auto back = ReadBlockExport(dir.Join("d"));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->tensors.size(), draft->parameters().size());
    for (const auto& [name, p] : draft->parameters()) {
      ASSERT_EQ(back->tensors.count(name), 1u) << name;
      EXPECT_EQ(back->tensors.at(name).scalar_type(), torch::kBFloat16) << name;
      EXPECT_TRUE(torch::equal(back->tensors.at(name), p.detach().to(torch::kBFloat16))) << name;
    }
    const BlockDraftOptions& o = back->options;
    EXPECT_EQ(o.kind, options.kind);
    EXPECT_EQ(o.num_layers, options.num_layers);
    EXPECT_EQ(o.block_size, options.block_size);
    EXPECT_EQ(o.mask_token_id, options.mask_token_id);
    EXPECT_EQ(o.target_layer_ids, options.target_layer_ids);
    if (options.kind == BlockDraftKind::kDSpark) {
      EXPECT_EQ(o.markov_rank, options.markov_rank);
      EXPECT_EQ(o.confidence_head, options.confidence_head);
      EXPECT_EQ(o.confidence_with_markov, options.confidence_with_markov);
    }
    const DraftShape& s = back->shape;
    EXPECT_EQ(s.hidden_size, kH);
    EXPECT_EQ(s.target_hidden_size, kH);
    EXPECT_EQ(s.num_captures, 2);
    EXPECT_EQ(s.intermediate_size, kI);
    EXPECT_EQ(s.num_attention_heads, kHeads);
    EXPECT_EQ(s.num_key_value_heads, kKvHeads);
    EXPECT_EQ(s.head_dim, kHeadDim);
    EXPECT_EQ(s.target_vocab_size, kV);
    EXPECT_EQ(s.draft_vocab_size, kV);
    EXPECT_DOUBLE_EQ(s.rms_norm_eps, 1e-5);
    EXPECT_DOUBLE_EQ(s.rope_theta, 1e6);
    EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kLinear);
    EXPECT_DOUBLE_EQ(s.rope_scaling.factor, 2.0);
    EXPECT_EQ(s.max_position_embeddings, shape_.max_position_embeddings);
    EXPECT_EQ(back->num_target_layers, kTargetLayers);
    ASSERT_TRUE(back->bos_token_id.has_value());
    EXPECT_EQ(*back->bos_token_id, 1);
    EXPECT_EQ(back->eos_token_ids, (std::vector<int64_t>{2, 3}));
    // The restored export is a valid export, and a draft can be built from it.
    EXPECT_TRUE(ValidateBlockExport(*back).ok());
    auto rebuilt = BlockDraft::Create(back->shape, back->options, target_dir_, 1);
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
    EXPECT_EQ((*rebuilt)->parameters().size(), draft->parameters().size());
  }
}

TEST_F(BlockExportTest, ReadBlockExportRefusesWhatIsNotABlockExport) {
  testing::TempDir dir;
  const std::string out = dir.Join("d");
  ASSERT_TRUE(ExportBlockDraft(*Draft(Options(BlockDraftKind::kDSpark)), target_, out).ok());
  nlohmann::json c = ReadConfig(out);
  c["markov_head_type"] = "rnn";
  ASSERT_TRUE(WriteFileAtomically(out + "/config.json", c.dump()).ok());
  EXPECT_THAT(std::string(ReadBlockExport(out).status().message()),
              HasSubstr("config.markov_head_type"));
  c["markov_head_type"] = "vanilla";
  c.erase("markov_rank");
  ASSERT_TRUE(WriteFileAtomically(out + "/config.json", c.dump()).ok());
  EXPECT_THAT(std::string(ReadBlockExport(out).status().message()),
              HasSubstr("config.markov_rank"));
  c["markov_rank"] = kRank + 1;  // disagrees with the tensors
  ASSERT_TRUE(WriteFileAtomically(out + "/config.json", c.dump()).ok());
  EXPECT_THAT(std::string(ReadBlockExport(out).status().message()),
              HasSubstr("tensor markov_head.markov_w1.weight: shape"));
  c["architectures"] = {"LlamaForCausalLMEagle3"};
  ASSERT_TRUE(WriteFileAtomically(out + "/config.json", c.dump()).ok());
  EXPECT_THAT(std::string(ReadBlockExport(out).status().message()),
              HasSubstr("config.architectures"));
  EXPECT_EQ(ReadBlockExport(dir.Join("nothing")).status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// The public loaders, replayed. What follows is our own description of their
// rules, read from (never copied out of):
//   * SGLang python/sglang/srt/models/dflash.py @ 003b23d7388eabdfbfecd2610c7e228f9f6a2734
//     (DFlashDraftModel: module tree, load_weights with stacked_params_mapping
//     and resolve_param_name), python/sglang/srt/speculative/dflash_utils.py
//     @ 00731f0bc9fa81c39802754fb4b62e9cce967582 (parse_dflash_draft_config,
//     DFlashDraftConfig.resolve_target_layer_ids);
//   * SGLang python/sglang/srt/models/dspark.py @ 01f476234ab4ee99c7fb7cb31b68d31b6a7c54a8
//     (Qwen3DSparkModel = DSparkDraftMixin over DFlashDraftModel: VanillaMarkov,
//     DSparkConfidenceHead, build_confidence_head, load_weights) and
//     speculative/dspark_components/dspark_config.py at the same commit
//     (parse_dspark_draft_config);
//   * z-lab dflash/model.py @ 44947fbf71114e241c96de194f4b382b5dd330d0
//     (DFlashDraftModel, a transformers Qwen3PreTrainedModel loaded by
//     from_pretrained: checkpoint keys must equal its state_dict keys).
// ---------------------------------------------------------------------------

// A loader's parameter slot: (parameter name, shard id; "" when unsharded).
using Slot = std::pair<std::string, std::string>;
using Slots = std::map<Slot, Shape>;

struct Qwen3Sizes {
  int64_t h, a, b, d, i, layers, contexts;
};

// The sizes their modules take from our config.json (getattr defaults as
// they have them: num_key_value_heads -> heads, head_dim -> H / heads).
Qwen3Sizes SizesFromConfig(const nlohmann::json& c, size_t contexts) {
  Qwen3Sizes s;
  s.h = c.at("hidden_size").get<int64_t>();
  s.a = c.at("num_attention_heads").get<int64_t>();
  s.b = c.value("num_key_value_heads", s.a);
  s.d = c.value("head_dim", s.h / s.a);
  s.i = c.at("intermediate_size").get<int64_t>();
  s.layers = c.at("num_hidden_layers").get<int64_t>();
  s.contexts = static_cast<int64_t>(contexts);
  return s;
}

// SGLang's DFlash config resolution (parse_dflash_draft_config): each key
// from dflash_config first, then the top level; target ids default to
// build_target_layer_ids and are bounded by num_target_layers, which
// defaults to the draft's own layer count.
struct SglangDFlashConfig {
  std::vector<int64_t> target_layer_ids;
  std::optional<int64_t> block_size, mask_token_id, num_target_layers;
};

std::optional<nlohmann::json> NestedFirst(const nlohmann::json& c, const char* key) {
  if (c.contains("dflash_config") && c["dflash_config"].contains(key)) {
    return c["dflash_config"][key];
  }
  if (c.contains(key)) return c[key];
  return std::nullopt;
}

SglangDFlashConfig SglangResolve(const nlohmann::json& c) {
  SglangDFlashConfig r;
  if (auto v = NestedFirst(c, "block_size")) r.block_size = v->get<int64_t>();
  if (auto v = NestedFirst(c, "mask_token_id")) r.mask_token_id = v->get<int64_t>();
  if (auto v = NestedFirst(c, "num_target_layers")) r.num_target_layers = v->get<int64_t>();
  const int64_t bound = r.num_target_layers.value_or(c.at("num_hidden_layers").get<int64_t>());
  auto ids = NestedFirst(c, "target_layer_ids");
  EXPECT_TRUE(ids.has_value()) << "SGLang would fall back to build_target_layer_ids";
  if (ids) r.target_layer_ids = ids->get<std::vector<int64_t>>();
  for (int64_t id : r.target_layer_ids) {
    EXPECT_TRUE(id >= 0 && id < bound)
        << "SGLang refuses target layer id " << id << " out of range for " << bound;
  }
  return r;
}

// SGLang DFlashDraftModel.named_parameters() for n layers: fused qkv_proj
// (QKVParallelLinear, shards q/k/v, no bias) and gate_up_proj
// (MergedColumnParallelLinear, shards 0/1), RMSNorm weights, fc
// (ReplicatedLinear, no bias) over C·H inputs. The rotary embedding and
// RadixAttention hold no parameters.
Slots SglangDFlashSlots(const Qwen3Sizes& s) {
  Slots out = {{{"fc.weight", ""}, {s.h, s.contexts * s.h}},
               {{"hidden_norm.weight", ""}, {s.h}},
               {{"norm.weight", ""}, {s.h}}};
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    const std::string p = absl::StrCat("layers.", layer, ".");
    out[{p + "self_attn.qkv_proj.weight", "q"}] = {s.a * s.d, s.h};
    out[{p + "self_attn.qkv_proj.weight", "k"}] = {s.b * s.d, s.h};
    out[{p + "self_attn.qkv_proj.weight", "v"}] = {s.b * s.d, s.h};
    out[{p + "self_attn.o_proj.weight", ""}] = {s.h, s.a * s.d};
    out[{p + "self_attn.q_norm.weight", ""}] = {s.d};
    out[{p + "self_attn.k_norm.weight", ""}] = {s.d};
    out[{p + "mlp.gate_up_proj.weight", "0"}] = {s.i, s.h};
    out[{p + "mlp.gate_up_proj.weight", "1"}] = {s.i, s.h};
    out[{p + "mlp.down_proj.weight", ""}] = {s.h, s.i};
    out[{p + "input_layernorm.weight", ""}] = {s.h};
    out[{p + "post_attention_layernorm.weight", ""}] = {s.h};
  }
  return out;
}

// What one replayed load did.
struct Replay {
  std::map<Slot, int> hits;
  std::vector<std::string> ignored;  // names the loader silently drops
  std::vector<std::string> errors;   // what the loader would raise or mis-size
};

void Hit(const Slots& slots, const Slot& slot, const Shape& shape, const std::string& name,
         Replay& r) {
  ++r.hits[slot];
  auto it = slots.find(slot);
  if (it == slots.end()) {
    r.errors.push_back(absl::StrCat(name, " -> ", slot.first, "[", slot.second, "]: no such slot"));
  } else if (it->second != shape) {
    r.errors.push_back(
        absl::StrCat(name, " -> ", slot.first, "[", slot.second, "]: shape mismatch"));
  }
}

// SGLang DFlashDraftModel.load_weights: for each checkpoint name, the first
// stacked entry whose ".<weight>." occurs in it and whose renamed form
// (every <weight> replaced by <param>) resolves loads that shard; otherwise
// the name itself is resolved and loaded whole, or ignored when it does not
// resolve. Resolution: the name itself, else without a leading "model.",
// else with one added.
void SglangDFlashLoad(const Slots& slots, const std::map<std::string, Shape>& tensors, Replay& r) {
  static const std::vector<std::tuple<std::string, std::string, std::string>> kStacked = {
      {"qkv_proj", "q_proj", "q"},      {"qkv_proj", "k_proj", "k"},
      {"qkv_proj", "v_proj", "v"},      {"gate_up_proj", "gate_proj", "0"},
      {"gate_up_proj", "up_proj", "1"},
  };
  std::set<std::string> params;
  for (const auto& [slot, shape] : slots) params.insert(slot.first);
  auto resolve = [&](const std::string& name) -> std::optional<std::string> {
    if (params.count(name)) return name;
    if (absl::StartsWith(name, "model.")) {
      if (params.count(name.substr(6))) return name.substr(6);
    } else if (params.count("model." + name)) {
      return "model." + name;
    }
    return std::nullopt;
  };
  for (const auto& [name, shape] : tensors) {
    bool stacked = false;
    for (const auto& [param, weight, shard] : kStacked) {
      if (!absl::StrContains(name, "." + weight + ".")) continue;
      auto resolved = resolve(absl::StrReplaceAll(name, {{weight, param}}));
      if (!resolved) continue;
      Hit(slots, {*resolved, shard}, shape, name, r);
      stacked = true;
      break;
    }
    if (stacked) continue;
    auto resolved = resolve(name);
    if (!resolved) {
      r.ignored.push_back(name);
      continue;
    }
    Hit(slots, {*resolved, ""}, shape, name, r);
  }
}

// SGLang Qwen3DSparkModel: the DFlash backbone plus VanillaMarkov
// (markov_w1 = Embedding(V, r), markov_w2 = Linear(r, V, bias=False)) and,
// unless SGLANG_RAGGED_VERIFY_MODE is "static", a DSparkConfidenceHead
// (Linear(H + r·with_markov, 1, bias=True)) whatever enable_confidence_head
// says at this commit; with_markov = confidence_head_with_markov, default
// markov_rank > 0.
Slots SglangDSparkSlots(const nlohmann::json& c, const Qwen3Sizes& s, bool ragged_static) {
  Slots out = SglangDFlashSlots(s);
  const int64_t v = c.at("vocab_size").get<int64_t>(), rank = c.value("markov_rank", int64_t{0});
  EXPECT_EQ(c.value("markov_head_type", std::string("vanilla")), "vanilla");
  out[{"markov_head.markov_w1.weight", ""}] = {v, rank};
  out[{"markov_head.markov_w2.weight", ""}] = {v, rank};
  if (!ragged_static) {
    const bool with_markov = c.value("confidence_head_with_markov", rank > 0);
    out[{"confidence_head.proj.weight", ""}] = {1, s.h + (with_markov ? rank : 0)};
    out[{"confidence_head.proj.bias", ""}] = {1};
  }
  return out;
}

// Qwen3DSparkModel.load_weights: names under embed_tokens. / lm_head. /
// rotary_emb. are skipped; confidence_head.* load by exact name when the
// head exists (dropped otherwise; an unknown one raises), and every head
// parameter must have arrived; markov_head.* load by exact name (unknown
// raises); the rest go to the DFlash loader above.
Replay SglangDSparkLoad(const Slots& slots, const std::map<std::string, Shape>& tensors) {
  Replay r;
  const bool has_confidence = slots.count({"confidence_head.proj.weight", ""}) > 0;
  std::map<std::string, Shape> backbone;
  for (const auto& [name, shape] : tensors) {
    if (absl::StartsWith(name, "embed_tokens.") || absl::StartsWith(name, "lm_head.") ||
        absl::StartsWith(name, "rotary_emb.")) {
      r.ignored.push_back(name);
    } else if (absl::StartsWith(name, "confidence_head.")) {
      if (!has_confidence) {
        r.ignored.push_back(name);
      } else if (slots.count({name, ""}) == 0) {
        r.errors.push_back("unexpected confidence weight " + name);
      } else {
        Hit(slots, {name, ""}, shape, name, r);
      }
    } else if (absl::StartsWith(name, "markov_head.")) {
      if (slots.count({name, ""}) == 0) {
        r.errors.push_back("unexpected markov weight " + name);
      } else {
        Hit(slots, {name, ""}, shape, name, r);
      }
    } else {
      backbone[name] = shape;
    }
  }
  SglangDFlashLoad(slots, backbone, r);
  for (const auto& [slot, shape] : slots) {
    if (absl::StartsWith(slot.first, "confidence_head.") && r.hits.count(slot) == 0) {
      r.errors.push_back("confidence head enabled but missing " + slot.first);
    }
  }
  return r;
}

// z-lab DFlashDraftModel's state_dict for the config (transformers Qwen3
// modules, attention_bias false: unfused, bias-free projections; the
// rotary inv_freq buffer is not persistent). from_pretrained matches
// checkpoint keys to these names as they are (the checkpoint has no
// "model." prefix and neither does the module).
Slots ZlabDFlashSlots(const Qwen3Sizes& s) {
  Slots out = {{{"fc.weight", ""}, {s.h, s.contexts * s.h}},
               {{"hidden_norm.weight", ""}, {s.h}},
               {{"norm.weight", ""}, {s.h}}};
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    const std::string p = absl::StrCat("layers.", layer, ".");
    out[{p + "self_attn.q_proj.weight", ""}] = {s.a * s.d, s.h};
    out[{p + "self_attn.k_proj.weight", ""}] = {s.b * s.d, s.h};
    out[{p + "self_attn.v_proj.weight", ""}] = {s.b * s.d, s.h};
    out[{p + "self_attn.o_proj.weight", ""}] = {s.h, s.a * s.d};
    out[{p + "self_attn.q_norm.weight", ""}] = {s.d};
    out[{p + "self_attn.k_norm.weight", ""}] = {s.d};
    out[{p + "mlp.gate_proj.weight", ""}] = {s.i, s.h};
    out[{p + "mlp.up_proj.weight", ""}] = {s.i, s.h};
    out[{p + "mlp.down_proj.weight", ""}] = {s.h, s.i};
    out[{p + "input_layernorm.weight", ""}] = {s.h};
    out[{p + "post_attention_layernorm.weight", ""}] = {s.h};
  }
  return out;
}

Replay ZlabLoad(const Slots& slots, const std::map<std::string, Shape>& tensors) {
  Replay r;
  for (const auto& [name, shape] : tensors) {
    if (slots.count({name, ""}) == 0) {
      r.ignored.push_back(name);  // transformers: "unexpected key", dropped
    } else {
      Hit(slots, {name, ""}, shape, name, r);
    }
  }
  return r;
}

// Every slot filled exactly once with the right shape; no tensor dropped;
// nothing the loader would raise.
void ExpectExactCover(const Slots& slots, const Replay& r) {
  EXPECT_THAT(r.errors, ::testing::IsEmpty());
  EXPECT_THAT(r.ignored, ::testing::IsEmpty());
  for (const auto& [slot, shape] : slots) {
    auto it = r.hits.find(slot);
    EXPECT_TRUE(it != r.hits.end() && it->second == 1)
        << slot.first << "[" << slot.second << "] hit " << (it == r.hits.end() ? 0 : it->second)
        << " times";
  }
  for (const auto& [slot, count] : r.hits) {
    EXPECT_EQ(slots.count(slot), 1u) << slot.first << "[" << slot.second << "]";
  }
}

TEST_F(BlockExportTest, PublicDFlashLoadersMapEveryTensorOntoEveryParameter) {
  testing::TempDir dir;
  const std::string out = dir.Join("d");
  ASSERT_TRUE(ExportBlockDraft(*Draft(Options(BlockDraftKind::kDFlash)), target_, out).ok());
  const nlohmann::json c = ReadConfig(out);
  const std::map<std::string, Shape> tensors = FileShapes(out);
  {
    SCOPED_TRACE("SGLang DFlashDraftModel");
    SglangDFlashConfig resolved = SglangResolve(c);
    EXPECT_EQ(resolved.target_layer_ids, (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(resolved.block_size, std::optional<int64_t>(16));
    EXPECT_EQ(resolved.mask_token_id, std::optional<int64_t>(127));
    EXPECT_EQ(resolved.num_target_layers, std::optional<int64_t>(kTargetLayers));
    const Slots slots = SglangDFlashSlots(SizesFromConfig(c, resolved.target_layer_ids.size()));
    EXPECT_EQ(slots.size(), 3u + 2 * 11);
    Replay r;
    SglangDFlashLoad(slots, tensors, r);
    ExpectExactCover(slots, r);
  }
  {
    SCOPED_TRACE("z-lab DFlashDraftModel");
    // It reads block_size and num_target_layers (the latter eagerly, as the
    // default argument of dflash_config.get) at the top level, the ids and
    // the mask token from dflash_config.
    EXPECT_EQ(c.at("block_size"), 16);
    EXPECT_EQ(c.at("num_target_layers"), kTargetLayers);
    const auto ids = c.at("dflash_config").at("target_layer_ids").get<std::vector<int64_t>>();
    EXPECT_EQ(ids, (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(c.at("dflash_config").at("mask_token_id"), 127);
    EXPECT_EQ(c.at("layer_types").size(), 2u);  // indexed per layer
    const Slots slots = ZlabDFlashSlots(SizesFromConfig(c, ids.size()));
    ExpectExactCover(slots, ZlabLoad(slots, tensors));
  }
}

TEST_F(BlockExportTest, PublicDSparkLoaderMapsEveryTensorOntoEveryParameter) {
  for (bool with_markov : {true, false}) {
    SCOPED_TRACE(absl::StrCat("confidence head, with_markov ", with_markov));
    testing::TempDir dir;
    const std::string out = dir.Join("d");
    ASSERT_TRUE(
        ExportBlockDraft(*Draft(Options(BlockDraftKind::kDSpark, true, with_markov)), target_, out)
            .ok());
    const nlohmann::json c = ReadConfig(out);
    // parse_dspark_draft_config: no dspark_config / dspark_* keys, so the
    // top-level keys (via the DFlash parser) decide; gamma = block_size.
    SglangDFlashConfig resolved = SglangResolve(c);
    EXPECT_EQ(resolved.target_layer_ids, (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(resolved.block_size, std::optional<int64_t>(7));
    EXPECT_EQ(resolved.mask_token_id, std::optional<int64_t>(127));
    EXPECT_EQ(c.at("markov_rank"), kRank);
    const Qwen3Sizes sizes = SizesFromConfig(c, resolved.target_layer_ids.size());
    for (bool ragged_static : {false, true}) {
      SCOPED_TRACE(absl::StrCat("SGLANG_RAGGED_VERIFY_MODE static: ", ragged_static));
      const Slots slots = SglangDSparkSlots(c, sizes, ragged_static);
      Replay r = SglangDSparkLoad(slots, FileShapes(out));
      if (!ragged_static) {
        ExpectExactCover(slots, r);
      } else {
        // Without the head SGLang drops the two confidence tensors, by rule.
        EXPECT_THAT(r.ignored, ::testing::UnorderedElementsAre("confidence_head.proj.weight",
                                                               "confidence_head.proj.bias"));
        r.ignored.clear();
        ExpectExactCover(slots, r);
      }
    }
  }
  // Without a confidence head: exact under the static verify mode; in the
  // other modes SGLang (at this commit) builds the head anyway and refuses
  // the checkpoint, naming the missing tensors.
  testing::TempDir dir;
  const std::string out = dir.Join("d");
  ASSERT_TRUE(ExportBlockDraft(*Draft(Options(BlockDraftKind::kDSpark, false)), target_, out).ok());
  const nlohmann::json c = ReadConfig(out);
  const Qwen3Sizes sizes = SizesFromConfig(c, 2);
  const Slots static_slots = SglangDSparkSlots(c, sizes, /*ragged_static=*/true);
  ExpectExactCover(static_slots, SglangDSparkLoad(static_slots, FileShapes(out)));
  const Replay ragged = SglangDSparkLoad(SglangDSparkSlots(c, sizes, false), FileShapes(out));
  EXPECT_THAT(ragged.errors, ::testing::UnorderedElementsAre(
                                 "confidence head enabled but missing confidence_head.proj.weight",
                                 "confidence head enabled but missing confidence_head.proj.bias"));
}

// The replay itself can fail: a tensor named in the unfused HF style under
// "model." still maps, a stray one is dropped, a missing one leaves a hole.
TEST_F(BlockExportTest, TheReplayNoticesHolesAndStrays) {
  const Qwen3Sizes sizes{kH, kHeads, kKvHeads, kHeadDim, kI, 1, 2};
  const Slots slots = SglangDFlashSlots(sizes);
  std::map<std::string, Shape> tensors;
  for (const auto& [name, shape] :
       BlockExportTensorShapes(Options(BlockDraftKind::kDFlash), shape_)) {
    if (absl::StartsWith(name, "layers.1.")) continue;  // one layer only
    tensors["model." + name] = shape;
  }
  Replay r;
  SglangDFlashLoad(slots, tensors, r);
  EXPECT_THAT(r.errors, ::testing::IsEmpty());
  EXPECT_THAT(r.ignored, ::testing::IsEmpty());
  EXPECT_EQ(r.hits.size(), slots.size());
  tensors.erase("model.layers.0.self_attn.k_proj.weight");
  tensors["lm_head.weight"] = {kV, kH};
  Replay holes;
  SglangDFlashLoad(slots, tensors, holes);
  EXPECT_THAT(holes.ignored, ::testing::ElementsAre("lm_head.weight"));
  EXPECT_EQ(holes.hits.count({"layers.0.self_attn.qkv_proj.weight", "k"}), 0u);
}

}  // namespace
}  // namespace specstream::student
