// specstream-eval as a user runs it, on a tiny random target with a tiny
// tokenizer: generate the target's answers, dump and train an EAGLE-3 and a
// DFlash draft on them, then decode speculatively; and the refusals.

#include <string>
#include <vector>

#include "common/offline_store.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_tokenizer.h"

namespace specstream {
namespace {

class EvalCliTest : public ::testing::Test {
 protected:
  int Run(const std::string& binary, const std::string& args) {
    return testing::RunCommand(binary + " " + args, dir_.Join("stdout"), dir_.Join("stderr"));
  }
  int Eval(const std::string& args) { return Run(SPECSTREAM_EVAL_PATH, args); }
  std::string Stdout() { return testing::ReadFile(dir_.Join("stdout")); }
  std::string Stderr() { return testing::ReadFile(dir_.Join("stderr")); }
  std::vector<nlohmann::json> JsonLines(const std::string& name) {
    std::vector<nlohmann::json> lines;
    const std::string text = testing::ReadFile(dir_.Join(name));
    for (size_t at = 0; at < text.size();) {
      const size_t end = text.find('\n', at);
      lines.push_back(nlohmann::json::parse(text.substr(at, end - at)));
      at = end + 1;
    }
    return lines;
  }

  void SetUp() override {
    const std::vector<std::string> specials = testing::ChatSpecialTokens();
    ASSERT_EQ(Run(SPECSTREAM_TEACHER_PATH,
                  "init-random --arch llama --layers 8 --hidden 32 --heads 4 --kv-heads 2 "
                  "--intermediate 64 --dtype float32 --vocab " +
                      std::to_string(256 + specials.size()) + " --out " + dir_.Join("target")),
              0)
        << Stderr();
    testing::WriteFile(dir_.Join("target/tokenizer.json"), testing::TinyTokenizerJson(specials));
    std::string prompts;
    for (int i = 0; i < 20; ++i) {
      prompts += "{\"id\": " + std::to_string(i) + ", \"prompt\": \"question " + std::to_string(i) +
                 "?\"}\n";
    }
    testing::WriteFile(dir_.Join("prompts.jsonl"), prompts);
  }

  std::string Common() {
    return "--target " + dir_.Join("target") + " --prompts " + dir_.Join("prompts.jsonl") +
           " --max-new 6";
  }

  testing::TempDir dir_;
};

TEST_F(EvalCliTest, GenerateTrainAndSpeculate) {
  ASSERT_EQ(Eval("generate " + Common() + " --split all --out " + dir_.Join("answers.jsonl")), 0)
      << Stderr();
  const std::vector<nlohmann::json> answers = JsonLines("answers.jsonl");
  for (const nlohmann::json& r : answers) {
    const auto ids = r["input_ids"].get<std::vector<int>>();
    const auto mask = r["loss_mask"].get<std::vector<int>>();
    ASSERT_EQ(ids.size(), mask.size());
    // The prompt (masked out), then at most 6 answer tokens (trained).
    int answer = 0;
    for (size_t i = 0; i < mask.size(); ++i) {
      if (mask[i] == 1) ++answer;
      if (i > 0) {
        EXPECT_GE(mask[i], mask[i - 1]) << "the mask is not prompt-then-answer";
      }
    }
    EXPECT_GE(answer, 1);
    EXPECT_LE(answer, 6);
    EXPECT_EQ(r["temperature"].get<double>(), 0.0);
  }
  EXPECT_EQ(answers.size(), 20u);
  EXPECT_NE(Stdout().find("generate: 20 answers"), std::string::npos) << Stdout();

  ASSERT_EQ(Run(SPECSTREAM_TEACHER_PATH, "dump --model " + dir_.Join("target") + " --data " +
                                             dir_.Join("answers.jsonl") + " --out " +
                                             dir_.Join("store") + " --keep-target-ids"),
            0)
      << Stderr();
  for (const std::string kind : {"eagle3", "dflash"}) {
    const std::string draft = kind == "eagle3" ? "    draft_vocab_size: 64\n"
                                               : "    type: dflash\n    block_size: 4\n"
                                                 "    mask_token_id: 0\n"
                                                 "    target_layer_ids: [1, 3, 4]\n";
    testing::WriteFile(dir_.Join(kind + ".yaml"),
                       "name: eval-" + kind + "\ndata:\n  store: " + dir_.Join("store") +
                           "\nmodel:\n  target: " + dir_.Join("target") + "\n  draft:\n" + draft +
                           "optimizer:\n  lr: 3.0e-3\n"
                           "training:\n  max_steps: 4\n  batch_size: 2\n" +
                           (kind == "eagle3" ? "  ttt_steps: 3\n" : "") +
                           "  dtype: float32\ncheckpoint:\n  dir: " + dir_.Join("ckpt-" + kind) +
                           "\n  every_steps: 4\n");
    ASSERT_EQ(Run(SPECSTREAM_STUDENT_PATH, "train --config " + dir_.Join(kind + ".yaml")), 0)
        << Stderr();
  }

  ASSERT_EQ(
      Eval("speculate " + Common() + " --k 3 --temperatures 0,1 --draft " +
           dir_.Join("ckpt-eagle3") + " --draft " + dir_.Join("ckpt-dflash") +
           " --untrained-draft " + dir_.Join("ckpt-eagle3") + " --json " + dir_.Join("out.json")),
      0)
      << Stderr();
  EXPECT_NE(Stdout().find("lossless: 2 of 2 outputs equal target-only greedy"), std::string::npos)
      << Stdout();
  const std::vector<nlohmann::json> out = JsonLines("out.json");
  for (const nlohmann::json& r : out) {
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r["prompts"].get<int>(), 2);  // ids 9 and 19 are held out
    EXPECT_GE(r["tau"].get<double>(), 1.0);
    EXPECT_EQ(r["accept"].size(), 3u);  // EAGLE-3 K = 3; DFlash block 4 - 1
    EXPECT_EQ(r["target_only_forwards"].get<int>(), 12);
    EXPECT_EQ(r["forwards_saved"].get<int>(),
              r["new_tokens"].get<int>() - r["forwards"].get<int>());
    if (r["temperature"].get<double>() == 0) {
      EXPECT_EQ(r["lossless_equal"].get<int>(), 2);
      EXPECT_TRUE(r.contains("tau_teacher_forced") && r.contains("tau_position_mean"));
    }
  }
  EXPECT_EQ(out.size(), 6u);  // three drafts at two temperatures
}

// `specstream-teacher dump --regenerate` on the prompts writes, sample for
// sample, what `specstream-eval generate` writes: greedy, and sampled with
// the same seed (both seed a prompt's answer by seed + its id); and
// generate --batch writes the same.
TEST_F(EvalCliTest, DumpRegenerateWritesWhatGenerateWrites) {
  for (const std::string temperature : {"0", "1"}) {
    SCOPED_TRACE(temperature);
    const std::string sampling = " --max-new 6 --temperature " + temperature + " --seed 5";
    const std::string answers = "answers-" + temperature + ".jsonl";
    const std::string store = dir_.Join("regenerated-" + temperature);
    ASSERT_EQ(
        Eval("generate --target " + dir_.Join("target") + " --prompts " +
             dir_.Join("prompts.jsonl") + " --split all --out " + dir_.Join(answers) + sampling),
        0)
        << Stderr();
    ASSERT_EQ(Run(SPECSTREAM_TEACHER_PATH, "dump --model " + dir_.Join("target") + " --data " +
                                               dir_.Join("prompts.jsonl") + " --tokenizer " +
                                               dir_.Join("target") + " --template chatml --out " +
                                               store + " --regenerate" + sampling),
              0)
        << Stderr();
    const std::vector<nlohmann::json> generated = JsonLines(answers);
    auto reader = StoreReader::Open(store);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_EQ((*reader)->num_samples(), static_cast<int64_t>(generated.size()));
    int64_t sampled_differently = 0;
    for (size_t i = 0; i < generated.size(); ++i) {
      auto views = (*reader)->Get(static_cast<int64_t>(i));
      ASSERT_TRUE(views.ok()) << views.status();
      std::vector<int> ids, mask;
      for (const TensorView& view : *views) {
        if (view.name == "input_ids") {
          const auto* p = reinterpret_cast<const int32_t*>(view.data);
          ids.assign(p, p + view.nbytes / sizeof(int32_t));
        }
        if (view.name == "loss_mask") mask.assign(view.data, view.data + view.nbytes);
      }
      EXPECT_EQ(ids, generated[i]["input_ids"].get<std::vector<int>>()) << "sample " << i;
      EXPECT_EQ(mask, generated[i]["loss_mask"].get<std::vector<int>>()) << "sample " << i;
      if (temperature == "1") {
        const std::vector<nlohmann::json> greedy = JsonLines("answers-0.jsonl");
        sampled_differently += greedy[i]["input_ids"] != generated[i]["input_ids"];
      }
    }
    // At T = 1 the answers are samples, not the greedy ones again.
    if (temperature == "1") {
      EXPECT_GT(sampled_differently, 0);
    }
    // generate --batch 3 decodes three answers at a time in batched steps:
    // the same file, record for record, in the prompts' order.
    const std::string batched = "batched-" + temperature + ".jsonl";
    ASSERT_EQ(Eval("generate --target " + dir_.Join("target") + " --prompts " +
                   dir_.Join("prompts.jsonl") + " --split all --batch 3 --out " +
                   dir_.Join(batched) + sampling),
              0)
        << Stderr();
    EXPECT_EQ(JsonLines(batched), generated);
  }
}

TEST_F(EvalCliTest, DumpRegenerateRefusesRecordsThatHoldAnAnswer) {
  ASSERT_EQ(Eval("generate " + Common() + " --split all --out " + dir_.Join("answers.jsonl")), 0)
      << Stderr();
  const std::string dump = "dump --model " + dir_.Join("target") + " --out " + dir_.Join("store") +
                           " --tokenizer " + dir_.Join("target") +
                           " --template chatml --regenerate --data ";
  EXPECT_EQ(Run(SPECSTREAM_TEACHER_PATH, dump + dir_.Join("answers.jsonl")), 2);
  EXPECT_NE(Stderr().find("\"loss_mask\": a record to regenerate is a prompt"), std::string::npos)
      << Stderr();
  EXPECT_EQ(Run(SPECSTREAM_TEACHER_PATH, dump + dir_.Join("prompts.jsonl") + " --max-new 0"), 2);
  EXPECT_NE(Stderr().find("--max-new 0 must be >= 1"), std::string::npos) << Stderr();
  EXPECT_EQ(Run(SPECSTREAM_TEACHER_PATH, dump + dir_.Join("prompts.jsonl") + " --tp 2"), 2);
  EXPECT_NE(Stderr().find("--regenerate decodes on the hf runtime's KV cache"), std::string::npos)
      << Stderr();
}

TEST_F(EvalCliTest, RefusalsNameTheFlagOrTheLine) {
  EXPECT_NE(Eval("generate " + Common() + " --split bogus --out " + dir_.Join("a.jsonl")), 0);
  EXPECT_NE(Stderr().find("--split must be train, holdout or all"), std::string::npos) << Stderr();
  testing::WriteFile(dir_.Join("bad.jsonl"), "{\"id\": 0, \"prompt\": \"ok\"}\n{\"id\": 1}\n");
  EXPECT_NE(Eval("generate --target " + dir_.Join("target") + " --prompts " +
                 dir_.Join("bad.jsonl") + " --split all --out " + dir_.Join("a.jsonl")),
            0);
  EXPECT_NE(Stderr().find("bad.jsonl:2: expected {\"id\": integer, \"prompt\": string}"),
            std::string::npos)
      << Stderr();
  EXPECT_NE(Eval("speculate " + Common()), 0);
  EXPECT_NE(Stderr().find("speculate needs --draft or --untrained-draft"), std::string::npos)
      << Stderr();
  EXPECT_NE(Eval("speculate " + Common() + " --draft " + dir_.Join("nowhere")), 0);
  EXPECT_NE(Stderr().find("nowhere"), std::string::npos) << Stderr();
}

}  // namespace
}  // namespace specstream
