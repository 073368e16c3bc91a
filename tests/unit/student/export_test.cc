#include "student/export.h"

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/safetensors.h"
#include "common/torch/tensor_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_env.h"
#include "tests/testing/testing.h"

namespace specstream::student {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A 12-layer toy target: H=8, vocab 20, 2 query heads / 1 KV head of dim 4,
// llama3 rope scaling, eos as a list.
constexpr char kTargetConfig[] = R"({
  "model_type": "llama", "architectures": ["LlamaForCausalLM"],
  "vocab_size": 20, "hidden_size": 8, "intermediate_size": 16,
  "num_hidden_layers": 12, "num_attention_heads": 2, "num_key_value_heads": 1,
  "head_dim": 4, "max_position_embeddings": 4096, "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
  "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": [2, 3],
  "torch_dtype": "bfloat16"
})";

const std::vector<int64_t> kUsed = {0, 2, 3, 7, 10, 19};  // draft id -> target id

ExportInput MakeInput(int64_t target_hidden = 0) {
  auto target = ParseHfConfig(kTargetConfig);
  EXPECT_TRUE(target.ok()) << target.status();
  auto config = ExportConfigFromTarget(*target);
  EXPECT_TRUE(config.ok()) << config.status();
  ExportInput in;
  in.config = *config;
  in.config.draft_vocab_size = static_cast<int64_t>(kUsed.size());
  in.config.target_hidden_size = target_hidden;
  const int64_t h = 8, th = target_hidden > 0 ? target_hidden : 8, i = 16, q = 8, kv = 4;
  const int64_t dv = in.config.draft_vocab_size;
  torch::manual_seed(0);
  auto w = [](std::vector<int64_t> shape) { return torch::randn(shape, torch::kFloat32); };
  in.tensors["fc.weight"] = w({h, 3 * th});
  in.tensors["midlayer.self_attn.q_proj.weight"] = w({q, 2 * h});
  in.tensors["midlayer.self_attn.k_proj.weight"] = w({kv, 2 * h});
  in.tensors["midlayer.self_attn.v_proj.weight"] = w({kv, 2 * h});
  in.tensors["midlayer.self_attn.o_proj.weight"] = w({h, q});
  in.tensors["midlayer.mlp.gate_proj.weight"] = w({i, h});
  in.tensors["midlayer.mlp.up_proj.weight"] = w({i, h});
  in.tensors["midlayer.mlp.down_proj.weight"] = w({h, i});
  in.tensors["midlayer.input_layernorm.weight"] = torch::ones({h});
  in.tensors["midlayer.hidden_norm.weight"] = torch::ones({h});
  in.tensors["midlayer.post_attention_layernorm.weight"] = torch::ones({h});
  in.tensors["norm.weight"] = torch::ones({h});
  in.tensors["lm_head.weight"] = w({dv, h});
  torch::Tensor d2t = torch::empty({dv}, torch::kInt64);
  torch::Tensor t2d = torch::zeros({20}, torch::kBool);
  for (int64_t k = 0; k < dv; ++k) {
    d2t[k] = kUsed[k] - k;
    t2d[kUsed[k]] = true;
  }
  in.tensors["d2t"] = d2t;
  in.tensors["t2d"] = t2d;
  return in;
}

nlohmann::json ReadConfig(const std::string& dir) {
  return nlohmann::json::parse(testing::ReadFile(dir + "/config.json"));
}

// Nothing but `allowed` beside the output: no partial dir, no temporaries.
void ExpectOnly(const std::string& parent, const std::set<std::string>& allowed) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(parent)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, allowed);
}

TEST(ExportTest, WritesExactlyTheEagle3TensorsWithShapesAndDtypes) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  ExportInput in = MakeInput();
  ASSERT_TRUE(ExportDraft(in, out).ok());
  ExpectOnly(dir.path(), {"draft"});
  ExpectOnly(out, {"config.json", "model.safetensors"});

  auto file = SafetensorsFile::Open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::set<std::string> names((*file)->names().begin(), (*file)->names().end());
  EXPECT_EQ(names, (std::set<std::string>{
                       "fc.weight",
                       "midlayer.self_attn.q_proj.weight",
                       "midlayer.self_attn.k_proj.weight",
                       "midlayer.self_attn.v_proj.weight",
                       "midlayer.self_attn.o_proj.weight",
                       "midlayer.mlp.gate_proj.weight",
                       "midlayer.mlp.up_proj.weight",
                       "midlayer.mlp.down_proj.weight",
                       "midlayer.input_layernorm.weight",
                       "midlayer.hidden_norm.weight",
                       "midlayer.post_attention_layernorm.weight",
                       "norm.weight",
                       "lm_head.weight",
                       "d2t",
                       "t2d",
                   }));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  for (const std::string& name : names) {
    auto view = (*file)->Get(name);
    ASSERT_TRUE(view.ok());
    DType expected = name == "d2t" ? DType::kI64 : name == "t2d" ? DType::kBool : DType::kBF16;
    EXPECT_EQ(view->dtype, expected) << name;
    EXPECT_EQ(view->shape, ShapeOf(in.tensors.at(name))) << name;
  }
  EXPECT_EQ((*file)->Get("fc.weight")->shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ((*file)->Get("midlayer.self_attn.q_proj.weight")->shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ((*file)->Get("midlayer.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ((*file)->Get("lm_head.weight")->shape, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ((*file)->Get("t2d")->shape, (std::vector<int64_t>{20}));

  auto back = ReadExport(out);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& [name, t] : in.tensors) {
    torch::Tensor expected = t.is_floating_point() ? t.to(torch::kBFloat16) : t;
    EXPECT_TRUE(torch::equal(back->tensors.at(name), expected)) << name;
  }
  EXPECT_EQ(back->config.aux_layer_ids, (CaptureLayerIds{1, 5, 8}));
  EXPECT_EQ(back->config.draft_vocab_size, 6);
  EXPECT_TRUE(ValidateExport(*back).ok());
}

TEST(ExportTest, ConfigFieldsArePresentAndCorrect) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  ASSERT_TRUE(ExportDraft(MakeInput(), out).ok());
  nlohmann::json c = ReadConfig(out);
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"LlamaForCausalLMEagle3"}));
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["num_hidden_layers"], 1);
  EXPECT_EQ(c["hidden_size"], 8);
  EXPECT_EQ(c["intermediate_size"], 16);
  EXPECT_EQ(c["num_attention_heads"], 2);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["head_dim"], 4);
  EXPECT_DOUBLE_EQ(c["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(c["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "llama3");
  EXPECT_DOUBLE_EQ(c["rope_scaling"]["factor"].get<double>(), 8.0);
  EXPECT_EQ(c["rope_scaling"]["original_max_position_embeddings"], 1024);
  EXPECT_EQ(c["max_position_embeddings"], 4096);
  EXPECT_EQ(c["vocab_size"], 20);
  EXPECT_EQ(c["draft_vocab_size"], 6);
  EXPECT_FALSE(c.contains("target_hidden_size"));
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], nlohmann::json::array({2, 3}));
  // SGLang / SpecForge: output-of-layer ids (our capture ids, default
  // [1, L/2-1, L-4] for L = 12).
  EXPECT_EQ(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            nlohmann::json::array({1, 5, 8}));
  EXPECT_EQ(c["eagle_config"]["use_aux_hidden_state"], true);
  EXPECT_EQ(c["eagle_config"]["use_input_layernorm_in_first_layer"], true);
  EXPECT_EQ(c["eagle_config"]["use_last_layernorm"], true);
  // vLLM: input-of-layer ids = ours + 1, i.e. vLLM's own default
  // (2, L//2, L-3).
  EXPECT_EQ(c["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({2, 6, 9}));
  EXPECT_FALSE(c.dump().find("embed_tokens") != std::string::npos);
}

TEST(ExportTest, TargetHiddenSizeIsWrittenWhenItDiffers) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  ExportInput in = MakeInput(/*target_hidden=*/12);
  ASSERT_TRUE(ExportDraft(in, out).ok());
  EXPECT_EQ(ReadConfig(out)["target_hidden_size"], 12);
  auto back = ReadExport(out);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->tensors.at("fc.weight").sizes(), (std::vector<int64_t>{8, 36}));
}

TEST(ExportTest, Float32ExportKeepsFloat32AndIntegerMapsAreWidened) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  ExportInput in = MakeInput();
  in.config.torch_dtype = "float32";
  in.tensors["d2t"] = in.tensors["d2t"].to(torch::kInt32);
  in.tensors["t2d"] = in.tensors["t2d"].to(torch::kUInt8);
  ASSERT_TRUE(ExportDraft(in, out).ok());
  auto back = ReadExport(out);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->tensors.at("fc.weight").scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(back->tensors.at("fc.weight"), in.tensors.at("fc.weight")));
  EXPECT_EQ(back->tensors.at("d2t").scalar_type(), torch::kInt64);
  EXPECT_EQ(back->tensors.at("t2d").scalar_type(), torch::kBool);
  EXPECT_EQ(ReadConfig(out)["torch_dtype"], "float32");
}

void ExpectRefused(const ExportInput& in, const std::string& needle) {
  testing::TempDir dir;
  absl::Status status = ExportDraft(in, dir.Join("draft"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << needle << ": " << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(needle));
  ExpectOnly(dir.path(), {});  // Nothing written, not even a temporary.
}

TEST(ExportTest, RefusesEachMissingTensor) {
  for (const auto& [name, unused] : MakeInput().tensors) {
    ExportInput in = MakeInput();
    in.tensors.erase(name);
    ExpectRefused(in, "tensor " + name + ": missing");
  }
}

TEST(ExportTest, RefusesEachWrongShape) {
  for (const auto& [name, t] : MakeInput().tensors) {
    ExportInput in = MakeInput();
    in.tensors[name] = torch::cat({t, t.narrow(0, 0, 1)}, 0);
    ExpectRefused(in, "tensor " + name + ": shape");
  }
}

TEST(ExportTest, RefusesExtraTensors) {
  ExportInput in = MakeInput();
  in.tensors["embed_tokens.weight"] = torch::zeros({20, 8});
  ExpectRefused(in, "tensor embed_tokens.weight");
  in = MakeInput();
  in.tensors["midlayer.self_attn.rotary.inv_freq"] = torch::zeros({2});
  ExpectRefused(in, "tensor midlayer.self_attn.rotary.inv_freq: not part");
}

TEST(ExportTest, RefusesBadDtypesAndNonFiniteWeights) {
  ExportInput in = MakeInput();
  in.tensors["norm.weight"] = torch::ones({8}, torch::kInt64);
  ExpectRefused(in, "tensor norm.weight: dtype");
  in = MakeInput();
  in.tensors["d2t"] = in.tensors["d2t"].to(torch::kFloat32);
  ExpectRefused(in, "tensor d2t: dtype");
  in = MakeInput();
  in.tensors["t2d"] = in.tensors["t2d"].to(torch::kFloat32);
  ExpectRefused(in, "tensor t2d: dtype");
  in = MakeInput();
  in.tensors["midlayer.mlp.up_proj.weight"][3][1] = std::numeric_limits<float>::quiet_NaN();
  ExpectRefused(in, "tensor midlayer.mlp.up_proj.weight: contains NaN");
}

TEST(ExportTest, RefusesInconsistentVocabularies) {
  // Draft vocab in the config disagrees with d2t / lm_head.
  ExportInput in = MakeInput();
  in.config.draft_vocab_size = 7;
  ExpectRefused(in, "shape");
  // Target vocab disagrees with t2d's length.
  in = MakeInput();
  in.config.vocab_size = 21;
  ExpectRefused(in, "tensor t2d: shape [20], expected [21]");
  // t2d marks more ids than the draft vocab.
  in = MakeInput();
  in.tensors["t2d"][5] = true;
  ExpectRefused(in, "tensor t2d: 7 ids marked, expected draft_vocab_size 6");
  // d2t maps to an id t2d does not mark (same count).
  in = MakeInput();
  in.tensors["t2d"][19] = false;
  in.tensors["t2d"][18] = true;
  ExpectRefused(in, "tensor d2t: draft id 5 maps to target id 19");
  // d2t maps outside the vocab.
  in = MakeInput();
  in.tensors["d2t"][5] = 100;
  ExpectRefused(in, "tensor d2t: draft id 5 maps to target id 105");
  // Draft vocab larger than the target's.
  in = MakeInput();
  in.config.draft_vocab_size = 21;
  ExpectRefused(in, "config.draft_vocab_size");
}

TEST(ExportTest, RefusesBadConfigFields) {
  ExportInput in = MakeInput();
  in.config.aux_layer_ids = {1, 5};
  ExpectRefused(in, "config.eagle_aux_hidden_state_layer_ids: need exactly 3");
  in = MakeInput();
  in.config.aux_layer_ids = {1, 5, 5};
  ExpectRefused(in, "config.eagle_aux_hidden_state_layer_ids");
  in = MakeInput();
  in.config.aux_layer_ids = {1, 5, 11};  // the last layer's output has no next layer
  ExpectRefused(in, "config.eagle_aux_hidden_state_layer_ids: id 11");
  in = MakeInput();
  in.config.torch_dtype = "float64";
  ExpectRefused(in, "config.torch_dtype");
  in = MakeInput();
  in.config.max_position_embeddings = 0;
  ExpectRefused(in, "config.max_position_embeddings");
  in = MakeInput();
  in.config.num_key_value_heads = 3;
  ExpectRefused(in, "config.num_key_value_heads");
  in = MakeInput();
  in.config.rope_scaling = "yarn";
  ExpectRefused(in, "config.rope_scaling");
}

TEST(ExportTest, ReplacesAnExistingExportOnlyAfterSuccess) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  ExportInput first = MakeInput();
  ASSERT_TRUE(ExportDraft(first, out).ok());
  const std::string before = testing::ReadFile(out + "/model.safetensors");

  ExportInput broken = MakeInput();
  broken.tensors.erase("norm.weight");
  EXPECT_FALSE(ExportDraft(broken, out).ok());
  EXPECT_EQ(testing::ReadFile(out + "/model.safetensors"), before);

  ExportInput second = MakeInput();
  second.tensors["norm.weight"] = torch::full({8}, 2.0);
  ASSERT_TRUE(ExportDraft(second, out + "/").ok());
  auto back = ReadExport(out);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(
      torch::equal(back->tensors.at("norm.weight"), torch::full({8}, 2.0, torch::kBFloat16)));
  ExpectOnly(dir.path(), {"draft"});
}

// Filesystem faults at each durability step of replacing an export
// (tests/testing/fake_env.h): the error names the export and the fault, the
// previous export stays whole where it was, and no temporary is left.
TEST(ExportTest, FilesystemFaultsAtEachStepKeepThePreviousExport) {
  using Op = testing::FakeEnv::Op;
  struct Case {
    Op op;
    std::string path_part;
  };
  const std::vector<Case> cases = {
      {Op::kMakeTempDirectory, "draft.tmp-"},
      {Op::kWriteFileAtomically, "/model.safetensors"},
      {Op::kWriteFileAtomically, "/config.json"},
      {Op::kFsyncDirectory, "draft.tmp-"},
      {Op::kMakeTempDirectory, "draft.old-"},
      {Op::kRename, "/draft"},      // the old export moved aside
      {Op::kRename, "draft.tmp-"},  // the new one moved in: the old goes back
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path_part);
    testing::TempDir dir;
    const std::string out = dir.Join("draft");
    testing::FakeEnv env;
    ASSERT_TRUE(ExportDraft(MakeInput(), out, &env).ok());
    const std::string before = testing::ReadFile(out + "/model.safetensors");
    ExportInput second = MakeInput();
    second.tensors["norm.weight"] = torch::full({8}, 2.0);
    env.FailOn(c.op, c.path_part, absl::InternalError("injected: disk on fire"));
    absl::Status status = ExportDraft(second, out, &env);
    EXPECT_EQ(env.pending_faults(), 0) << "the fault never fired";
    ASSERT_FALSE(status.ok());
    EXPECT_THAT(std::string(status.message()), HasSubstr("export to " + out));
    EXPECT_THAT(std::string(status.message()), HasSubstr("disk on fire"));
    EXPECT_EQ(testing::ReadFile(out + "/model.safetensors"), before);
    ExpectOnly(dir.path(), {"draft"});
  }
}

TEST(ExportTest, NeverReplacesADirectoryHoldingOtherFiles) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  fs::create_directories(out);
  testing::WriteFile(out + "/notes.txt", "mine");
  absl::Status status = ExportDraft(MakeInput(), out);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("notes.txt"));
  EXPECT_EQ(testing::ReadFile(out + "/notes.txt"), "mine");
  ExpectOnly(dir.path(), {"draft"});
}

TEST(ExportTest, CreatesMissingParents) {
  testing::TempDir dir;
  const std::string out = dir.Join("a/b/draft");
  ASSERT_TRUE(ExportDraft(MakeInput(), out).ok());
  EXPECT_TRUE(testing::FileExists(out + "/config.json"));
}

TEST(ExportTest, ReadExportAcceptsVllmOnlyIdsAndRefusesDisagreement) {
  testing::TempDir dir;
  const std::string out = dir.Join("draft");
  ASSERT_TRUE(ExportDraft(MakeInput(), out).ok());
  nlohmann::json c = ReadConfig(out);
  c.erase("eagle_config");
  ASSERT_TRUE(WriteFileAtomically(out + "/config.json", c.dump()).ok());
  auto back = ReadExport(out);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->config.aux_layer_ids, (CaptureLayerIds{1, 5, 8}));

  c["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", {2, 6, 9}}};  // same numbers: wrong
  ASSERT_TRUE(WriteFileAtomically(out + "/config.json", c.dump()).ok());
  EXPECT_EQ(ReadExport(out).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadExport(dir.Join("nothing")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace specstream::student
