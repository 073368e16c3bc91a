#include "teacher/dump.h"

#include <filesystem>

#include "common/offline_store.h"
#include "common/safetensors.h"
#include "common/torch/tensor_util.h"
#include "gtest/gtest.h"
#include "teacher/hf_runtime.h"
#include "teacher/sglang_runtime.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"
#include "tests/testing/tiny_tokenizer.h"

namespace specstream::teacher {
namespace {

// Delegates to a real runtime and fails the Nth forward: an interrupted dump.
class FailingRuntime final : public TargetRuntime {
 public:
  FailingRuntime(TargetRuntime& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  const ModelDescription& Describe() const override { return inner_.Describe(); }
  absl::StatusOr<std::vector<SequenceCapture>> Forward(const ForwardRequest& r) override {
    if (++calls_ == fail_at_) return absl::AbortedError("killed");
    return inner_.Forward(r);
  }

 private:
  TargetRuntime& inner_;
  int fail_at_;
  int calls_ = 0;
};

class DumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    specstream::testing::TinyModelOptions model;
    model.vocab = 300;  // covers the tiny tokenizer's 265 ids
    specstream::testing::WriteTinyModel(dir_.Join("model"), model);
    HfRuntimeOptions options;
    options.model_dir = dir_.Join("model");
    options.dtype = "float32";
    auto runtime = HfRuntime::Create(options);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = std::move(*runtime);
    std::filesystem::create_directories(dir_.Join("tok"));
    specstream::testing::WriteFile(
        dir_.Join("tok/tokenizer.json"),
        specstream::testing::TinyTokenizerJson(specstream::testing::ChatSpecialTokens()));
    std::string data;
    for (int i = 0; i < 11; ++i) {
      if (i % 3 == 0) {
        data += "{\"input_ids\":[" + std::to_string(i + 1) + ",5,6,7],\"loss_mask\":[0,1,1,1]}\n";
      } else {
        data += "{\"conversations\":[{\"role\":\"user\",\"content\":\"question " +
                std::to_string(i) + "\"},{\"role\":\"assistant\",\"content\":\"answer " +
                std::string(i, 'x') + "\"}]}\n";
      }
    }
    specstream::testing::WriteFile(dir_.Join("data.jsonl"), data);
  }

  DumpOptions Options(const std::string& out) {
    DumpOptions options;
    options.data = dir_.Join("data.jsonl");
    options.tokenizer_dir = dir_.Join("tok");
    options.template_name = "chatml";
    options.out = dir_.Join(out);
    options.batch_tokens = 64;
    options.keep_target_ids = true;
    options.store.max_shard_samples = 3;
    options.progress_terminal = 0;
    return options;
  }

  specstream::testing::TempDir dir_;
  std::unique_ptr<HfRuntime> runtime_;
};

TEST_F(DumpTest, WritesEverySampleWithTheRuntimesCaptures) {
  auto summary = RunDump(*runtime_, Options("store"));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->samples_written, 11);
  auto reader = StoreReader::Open(dir_.Join("store"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->complete());
  EXPECT_EQ((*reader)->num_samples(), 11);
  EXPECT_EQ((*reader)->num_shards(), 4);
  EXPECT_EQ((*reader)->contract()["model"]["capture_layer_ids"], nlohmann::json::parse("[1,3,4]"));

  // Sample 3 is pre-tokenized: [4, 5, 6, 7].
  auto tensors = (*reader)->Get(3);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, TensorView> by_name;
  for (const TensorView& t : *tensors) by_name[t.name] = t;
  ASSERT_EQ(by_name.count("aux_hidden"), 1u);
  torch::Tensor ids = BorrowView(by_name["input_ids"]);
  EXPECT_TRUE(torch::equal(ids, torch::tensor({4, 5, 6, 7}, torch::kInt32)));
  EXPECT_TRUE(
      torch::equal(BorrowView(by_name["loss_mask"]), torch::tensor({0, 1, 1, 1}, torch::kUInt8)));
  ForwardRequest request;
  request.sequences = {{4, 5, 6, 7}};
  request.want_target_ids = true;
  auto direct = runtime_->Forward(request);
  ASSERT_TRUE(direct.ok());
  torch::Tensor stored_aux = BorrowView(by_name["aux_hidden"]);
  EXPECT_EQ(stored_aux.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(stored_aux, (*direct)[0].aux_hidden.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(BorrowView(by_name["target_ids"]), (*direct)[0].target_ids));
}

TEST_F(DumpTest, InterruptedAndRerunEqualsUninterrupted) {
  ASSERT_TRUE(RunDump(*runtime_, Options("clean")).ok());
  FailingRuntime failing(*runtime_, 4);
  auto interrupted = RunDump(failing, Options("resumed"));
  ASSERT_FALSE(interrupted.ok());
  auto partial = StoreReader::Open(dir_.Join("resumed"));
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_FALSE((*partial)->complete());
  EXPECT_GT((*partial)->num_samples(), 0);
  auto resumed = RunDump(*runtime_, Options("resumed"));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_GT(resumed->samples_skipped, 0);
  EXPECT_EQ(resumed->samples_skipped + resumed->samples_written, 11);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir_.Join("clean"))) {
    files.push_back(e.path().filename().string());
  }
  size_t resumed_files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.Join("resumed"))) {
    ++resumed_files;
  }
  EXPECT_EQ(resumed_files, files.size());
  for (const std::string& f : files) {
    EXPECT_EQ(specstream::testing::ReadFile(dir_.Join("clean/" + f)),
              specstream::testing::ReadFile(dir_.Join("resumed/" + f)))
        << f;
  }
}

// index.json says which runtime computed the features, and a store one
// runtime began is not finished by the other.
TEST_F(DumpTest, IndexRecordsTheRuntime) {
  ASSERT_TRUE(RunDump(*runtime_, Options("hf-store")).ok());
  auto hf = StoreReader::Open(dir_.Join("hf-store"));
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->contract()["model"]["runtime"], "hf");

  SglangRuntimeOptions options;
  options.model_dir = dir_.Join("model");
  options.dtype = "float32";
  auto sglang = SglangRuntime::Create(options);
  ASSERT_TRUE(sglang.ok()) << sglang.status();
  ASSERT_TRUE(RunDump(**sglang, Options("sglang-store")).ok());
  auto packed = StoreReader::Open(dir_.Join("sglang-store"));
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ((*packed)->contract()["model"]["runtime"], "sglang");

  auto mixed = RunDump(**sglang, Options("hf-store"));
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mixed.status().message().find("\"contract.model.runtime\" is \"hf\""),
            std::string::npos)
      << mixed.status();
}

// P14 item 2: `dump --capture-layers ... --capture-for any` stores any
// ascending set (DFlash / DSpark drafts: 1 to n layers): the index names the
// ids, aux_hidden is [T, n*H] with layer k's output (HF hidden_states[k + 1])
// in its n-th block, and last_hidden is the final *post-norm* state, checked
// against an RMSNorm computed here from the last layer's output (the check
// hf_families_test makes of the runtime itself).
TEST_F(DumpTest, AnyAscendingCaptureSetIsStoredWithItsWidthAndIds) {
  auto checkpoint = CheckpointTensors::Open(dir_.Join("model"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto norm_view = (*checkpoint)->Get("model.norm.weight");
  ASSERT_TRUE(norm_view.ok()) << norm_view.status();
  auto norm = TensorFromView(*norm_view, torch::kFloat64);
  ASSERT_TRUE(norm.ok()) << norm.status();
  for (const std::vector<int>& layers : {std::vector<int>{4}, std::vector<int>{0, 2, 4, 5, 7}}) {
    const std::string name = "store-" + std::to_string(layers.size());
    HfRuntimeOptions runtime_options;
    runtime_options.model_dir = dir_.Join("model");
    runtime_options.dtype = "float32";
    runtime_options.capture_layer_ids = layers;
    auto runtime = HfRuntime::Create(runtime_options);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    DumpOptions options = Options(name);
    options.store_dtype = "float32";
    auto summary = RunDump(**runtime, options);
    ASSERT_TRUE(summary.ok()) << summary.status();
    auto reader = StoreReader::Open(dir_.Join(name));
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->contract()["model"]["capture_layer_ids"], nlohmann::json(layers));
    const int64_t hidden = (*runtime)->Describe().hidden_size;
    for (int64_t id : {int64_t{3}, int64_t{4}}) {  // pre-tokenized, and a chat sample
      auto tensors = (*reader)->Get(id);
      ASSERT_TRUE(tensors.ok()) << tensors.status();
      std::map<std::string, TensorView> by_name;
      for (const TensorView& t : *tensors) by_name[t.name] = t;
      const TensorView& aux_view = by_name["aux_hidden"];
      const int64_t t = aux_view.shape[0];
      EXPECT_EQ(aux_view.shape,
                (std::vector<int64_t>{t, static_cast<int64_t>(layers.size()) * hidden}));
      torch::Tensor ids = BorrowView(by_name["input_ids"]);
      auto states = (*runtime)->HiddenStates(
          std::vector<int32_t>(ids.data_ptr<int32_t>(), ids.data_ptr<int32_t>() + t));
      ASSERT_TRUE(states.ok()) << states.status();
      torch::Tensor aux = BorrowView(aux_view);
      for (size_t n = 0; n < layers.size(); ++n) {
        EXPECT_TRUE(torch::allclose(aux.narrow(1, static_cast<int64_t>(n) * hidden, hidden),
                                    (*states)[layers[n] + 1], 1e-6, 1e-6))
            << "sample " << id << ", layer " << layers[n];
      }
      const torch::Tensor x = states->back().to(torch::kFloat64);
      const torch::Tensor post_norm =
          x * torch::rsqrt(x.pow(2).mean(-1, true) + (*runtime)->config().rms_norm_eps) * *norm;
      torch::Tensor last = BorrowView(by_name["last_hidden"]).to(torch::kFloat64);
      EXPECT_EQ(last.sizes().vec(), (std::vector<int64_t>{t, hidden}));
      EXPECT_TRUE(torch::allclose(last, post_norm, 1e-5, 1e-5)) << "sample " << id;
      EXPECT_FALSE(torch::allclose(last, x, 1e-2, 1e-2)) << "last_hidden is the pre-norm state";
    }
  }
}

TEST_F(DumpTest, BadRecordNamesTheLine) {
  specstream::testing::WriteFile(dir_.Join("bad.jsonl"),
                                 "{\"input_ids\":[1,2]}\n{\"input_ids\":[1,999]}\n");
  DumpOptions options = Options("bad-store");
  options.data = dir_.Join("bad.jsonl");
  auto summary = RunDump(*runtime_, options);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(summary.status().message().find("bad.jsonl:2:"), std::string::npos) << summary.status();
  EXPECT_NE(summary.status().message().find("\"input_ids\"[1] = 999"), std::string::npos)
      << summary.status();
}

}  // namespace
}  // namespace specstream::teacher
