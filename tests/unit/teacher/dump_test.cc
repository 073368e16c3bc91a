#include "teacher/dump.h"

#include <filesystem>

#include "common/offline_store.h"
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
