// The offline path end to end, as a user runs it: init-random a target, dump
// a store, train with two local DDP ranks from a job YAML, export, eval.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

class StudentCliTest : public ::testing::Test {
 protected:
  int Run(const std::string& binary, const std::string& args) {
    return testing::RunCommand(binary + " " + args, dir_.Join("stdout"), dir_.Join("stderr"));
  }
  int Teacher(const std::string& args) { return Run(SPECSTREAM_TEACHER_PATH, args); }
  int Student(const std::string& args) { return Run(SPECSTREAM_STUDENT_PATH, args); }
  std::string Stdout() { return testing::ReadFile(dir_.Join("stdout")); }
  std::string Stderr() { return testing::ReadFile(dir_.Join("stderr")); }

  void MakeStore() {
    ASSERT_EQ(Teacher("init-random --arch llama --layers 8 --hidden 32 --heads 4 --kv-heads 2 "
                      "--intermediate 64 --vocab 256 --dtype float32 --out " +
                      dir_.Join("target")),
              0)
        << Stderr();
    std::string data;
    for (int i = 0; i < 16; ++i) {
      std::string ids;
      for (int t = 0; t < 10 + i; ++t)
        ids += (t ? "," : "") + std::to_string((i * 31 + t * 17) % 256);
      data += "{\"input_ids\":[" + ids + "]}\n";
    }
    testing::WriteFile(dir_.Join("data.jsonl"), data);
    ASSERT_EQ(Teacher("dump --model " + dir_.Join("target") + " --data " + dir_.Join("data.jsonl") +
                      " --out " + dir_.Join("store") + " --keep-target-ids"),
              0)
        << Stderr();
  }

  std::string JobYaml(const std::string& extra = "") {
    return "name: cli-test\n"
           "data:\n  store: " +
           dir_.Join("store") +
           "\n"
           "model:\n  target: " +
           dir_.Join("target") +
           "\n  draft:\n    draft_vocab_size: 64\n"
           "optimizer:\n  lr: 3.0e-3\n  warmup_steps: 2\n"
           "training:\n  max_steps: 8\n  batch_size: 2\n  ttt_steps: 3\n  dtype: float32\n"
           "checkpoint:\n  dir: " +
           dir_.Join("ckpt") +
           "\n  every_steps: 4\n"
           "export:\n  dir: " +
           dir_.Join("export") +
           "\n"
           "metrics:\n  jsonl: " +
           dir_.Join("metrics.jsonl") + "\n" + extra;
  }

  // The job above for a block draft: `draft` lines replace the EAGLE-3
  // draft section (the mask token is set: the random target has no
  // tokenizer), and the store is `store`.
  std::string BlockJobYaml(const std::string& store, const std::string& draft) {
    std::string job = JobYaml();
    auto replace = [&](const std::string& from, const std::string& to) {
      job.replace(job.find(from), from.size(), to);
    };
    replace("  store: " + dir_.Join("store") + "\n", "  store: " + store + "\n");
    replace("    draft_vocab_size: 64\n", draft + "    mask_token_id: 255\n");
    replace("  ttt_steps: 3\n", "");
    return job;
  }

  testing::TempDir dir_;
};

TEST_F(StudentCliTest, TrainTwoRanksExportAndEval) {
  MakeStore();
  testing::WriteFile(dir_.Join("job.yaml"), JobYaml());
  ASSERT_EQ(Student("train --config " + dir_.Join("job.yaml") + " --nproc 2"), 0) << Stderr();
  EXPECT_NE(Stderr().find("step 8/8"), std::string::npos) << Stderr();
  EXPECT_NE(Stderr().find("[student:1]"), std::string::npos) << Stderr();

  // Metrics: one JSON line per step from rank 0.
  std::string metrics = testing::ReadFile(dir_.Join("metrics.jsonl"));
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 8);
  EXPECT_NE(metrics.find("\"acc_k\""), std::string::npos);

  // The export holds the serving layout and no embeddings.
  auto model = SafetensorsFile::Open(dir_.Join("export/model.safetensors"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->Contains("midlayer.self_attn.q_proj.weight"));
  EXPECT_FALSE((*model)->Contains("embed_tokens.weight"));
  auto config = nlohmann::json::parse(testing::ReadFile(dir_.Join("export/config.json")));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLMEagle3");
  EXPECT_EQ(config["draft_vocab_size"], 64);

  // export from the checkpoint gives the same tensors.
  ASSERT_EQ(Student("export --checkpoint " + dir_.Join("ckpt") + " --out " + dir_.Join("export2")),
            0)
      << Stderr();
  EXPECT_EQ(testing::ReadFile(dir_.Join("export/model.safetensors")),
            testing::ReadFile(dir_.Join("export2/model.safetensors")));

  ASSERT_EQ(Student("eval --checkpoint " + dir_.Join("ckpt") + " --data " + dir_.Join("store")), 0)
      << Stderr();
  auto line = nlohmann::json::parse(Stdout());
  EXPECT_EQ(line["acc"].size(), 3u);
  EXPECT_GT(line["positions"].get<int64_t>(), 0);
  EXPECT_TRUE(line.contains("sim_accept_len"));
  EXPECT_TRUE(line.contains("loss"));
}

// Online, as users run it: a `serve` daemon in the background and a job
// whose data section names it; two ranks stream, train, export and write the
// ledger.
TEST_F(StudentCliTest, TrainOnlineFromATeacherDaemon) {
  MakeStore();  // also writes the target and data.jsonl
  const std::string port_file = dir_.Join("teacher.port");
  const std::string serve = std::string(SPECSTREAM_TEACHER_PATH) + " serve --model " +
                            dir_.Join("target") + " --devices cpu --port 0 --port-file " +
                            port_file + " --keep-target-ids >" + dir_.Join("serve.log") +
                            " 2>&1 & echo $! >" + dir_.Join("serve.pid");
  ASSERT_EQ(std::system(serve.c_str()), 0);
  const int port_number = testing::WaitForPortFile(port_file);
  ASSERT_GT(port_number, 0) << testing::ReadFile(dir_.Join("serve.log"));
  const std::string port = std::to_string(port_number);
  std::string job = JobYaml();
  job.replace(job.find("  store: "), job.find("\n", job.find("  store: ")) - job.find("  store: "),
              "  tokenized: " + dir_.Join("data.jsonl") + "\n  teachers: [\"127.0.0.1:" + port +
                  "\"]\n  ledger_dir: " + dir_.Join("ledger"));
  testing::WriteFile(dir_.Join("online.yaml"), job);
  const int rc = Student("train --config " + dir_.Join("online.yaml") + " --nproc 2");
  const std::string pid = testing::ReadFile(dir_.Join("serve.pid"));
  std::system(("kill -TERM " + pid).c_str());
  ASSERT_EQ(rc, 0) << Stderr();
  EXPECT_NE(Stderr().find("step 8/8"), std::string::npos) << Stderr();
  EXPECT_TRUE(std::filesystem::exists(dir_.Join("export/model.safetensors")));
  // Each rank's ledger: one line per step, two samples per line.
  for (int rank = 0; rank < 2; ++rank) {
    const std::string ledger =
        testing::ReadFile(dir_.Join("ledger/ledger-rank" + std::to_string(rank) + ".jsonl"));
    EXPECT_EQ(std::count(ledger.begin(), ledger.end(), '\n'), 8) << ledger;
  }
}

// A DFlash draft as users run it: a store dumped with the layer the draft
// reads (one draft layer: [L/2] = [4]), two DDP ranks from a job YAML, the
// SGLang export, export from the checkpoint, eval.
TEST_F(StudentCliTest, TrainADFlashDraftExportAndEval) {
  MakeStore();
  ASSERT_EQ(Teacher("dump --model " + dir_.Join("target") + " --data " + dir_.Join("data.jsonl") +
                    " --out " + dir_.Join("store4") + " --capture-layers 4 --capture-for any"),
            0)
      << Stderr();
  testing::WriteFile(dir_.Join("dflash.yaml"), BlockJobYaml(dir_.Join("store4"),
                                                            "    type: dflash\n    block_size: 4\n"
                                                            "    num_anchors: 4\n"));
  ASSERT_EQ(Student("train --config " + dir_.Join("dflash.yaml") + " --nproc 2"), 0) << Stderr();
  EXPECT_NE(Stderr().find("dflash draft, 1 layer(s) over target layers [4]"), std::string::npos)
      << Stderr();
  EXPECT_NE(Stderr().find("step 8/8"), std::string::npos) << Stderr();
  EXPECT_NE(Stderr().find(" tau "), std::string::npos) << Stderr();
  std::string metrics = testing::ReadFile(dir_.Join("metrics.jsonl"));
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 8);
  EXPECT_NE(metrics.find("\"tau\""), std::string::npos);

  auto config = nlohmann::json::parse(testing::ReadFile(dir_.Join("export/config.json")));
  EXPECT_EQ(config["architectures"][0], "DFlashDraftModel");
  EXPECT_EQ(config["dflash_config"]["target_layer_ids"], nlohmann::json({4}));
  EXPECT_EQ(config["dflash_config"]["mask_token_id"], 255);
  auto model = SafetensorsFile::Open(dir_.Join("export/model.safetensors"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->Contains("layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE((*model)->Contains("lm_head.weight"));
  ASSERT_EQ(Student("export --checkpoint " + dir_.Join("ckpt") + " --out " + dir_.Join("export2")),
            0)
      << Stderr();
  EXPECT_EQ(testing::ReadFile(dir_.Join("export/model.safetensors")),
            testing::ReadFile(dir_.Join("export2/model.safetensors")));
  ASSERT_EQ(Student("eval --checkpoint " + dir_.Join("ckpt") + " --data " + dir_.Join("store4")), 0)
      << Stderr();
  auto line = nlohmann::json::parse(Stdout());
  EXPECT_EQ(line["type"], "dflash");
  EXPECT_EQ(line["acc"].size(), 4u);
  EXPECT_GE(line["tau"].get<double>(), 1.0);

  // The default store captures EAGLE-3's layers: refused, naming the field.
  testing::WriteFile(dir_.Join("wrong.yaml"),
                     BlockJobYaml(dir_.Join("store"), "    type: dflash\n"));
  EXPECT_NE(Student("train --config " + dir_.Join("wrong.yaml")), 0);
  EXPECT_NE(Stderr().find("model.draft.target_layer_ids"), std::string::npos) << Stderr();
}

// A DSpark draft trained online from a teacher daemon serving its defaults
// (EAGLE-3's layers): two draft layers read [1, 5] of the 8-layer target,
// which each stream asks for; two ranks.
TEST_F(StudentCliTest, TrainADSparkDraftOnline) {
  MakeStore();
  const std::string port_file = dir_.Join("teacher.port");
  const std::string serve = std::string(SPECSTREAM_TEACHER_PATH) + " serve --model " +
                            dir_.Join("target") + " --devices cpu --port 0 --port-file " +
                            port_file + " >" + dir_.Join("serve.log") + " 2>&1 & echo $! >" +
                            dir_.Join("serve.pid");
  ASSERT_EQ(std::system(serve.c_str()), 0);
  const int port_number = testing::WaitForPortFile(port_file);
  ASSERT_GT(port_number, 0) << testing::ReadFile(dir_.Join("serve.log"));
  std::string job = BlockJobYaml(dir_.Join("store"),
                                 "    type: dspark\n    num_layers: 2\n"
                                 "    num_anchors: 4\n    markov_rank: 8\n");
  const std::string store_line = "  store: " + dir_.Join("store") + "\n";
  job.replace(job.find(store_line), store_line.size(),
              "  tokenized: " + dir_.Join("data.jsonl") +
                  "\n  teachers: [\"127.0.0.1:" + std::to_string(port_number) + "\"]\n");
  testing::WriteFile(dir_.Join("dspark.yaml"), job);
  const int rc = Student("train --config " + dir_.Join("dspark.yaml") + " --nproc 2");
  std::system(("kill -TERM " + testing::ReadFile(dir_.Join("serve.pid"))).c_str());
  ASSERT_EQ(rc, 0) << Stderr();
  EXPECT_NE(Stderr().find("dspark draft, 2 layer(s) over target layers [1, 5]"), std::string::npos)
      << Stderr();
  EXPECT_NE(Stderr().find("step 8/8"), std::string::npos) << Stderr();
  EXPECT_NE(Stderr().find(" conf_ece "), std::string::npos) << Stderr();
  auto config = nlohmann::json::parse(testing::ReadFile(dir_.Join("export/config.json")));
  EXPECT_EQ(config["architectures"][0], "Qwen3DSparkModel");
  EXPECT_EQ(config["target_layer_ids"], nlohmann::json({1, 5}));
  auto model = SafetensorsFile::Open(dir_.Join("export/model.safetensors"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->Contains("markov_head.markov_w1.weight"));
  EXPECT_TRUE((*model)->Contains("confidence_head.proj.bias"));
}

// World 4 = DP 2 x CP 2 (ring) from the job's parallel section; a world that
// is not a multiple of cp_size is refused before any rank waits for others.
TEST_F(StudentCliTest, TrainDataTimesContextParallel) {
  MakeStore();
  testing::WriteFile(dir_.Join("job.yaml"), JobYaml("parallel:\n  cp_size: 2\n  cp_mode: ring\n"));
  ASSERT_EQ(Student("train --config " + dir_.Join("job.yaml") + " --nproc 4"), 0) << Stderr();
  EXPECT_NE(Stderr().find("(dp 1/2, cp 1/2, ulysses 1)"), std::string::npos) << Stderr();
  EXPECT_NE(Stderr().find("step 8/8"), std::string::npos) << Stderr();
  EXPECT_TRUE(std::filesystem::exists(dir_.Join("export/model.safetensors")));

  testing::WriteFile(dir_.Join("odd.yaml"), JobYaml("parallel:\n  cp_size: 2\n"));
  EXPECT_NE(Student("train --config " + dir_.Join("odd.yaml") + " --nproc 3"), 0);
  EXPECT_NE(Stderr().find("parallel.cp_size 2 does not divide the world of 3"), std::string::npos)
      << Stderr();
}

TEST_F(StudentCliTest, BadJobsAreRefusedNamingTheField) {
  MakeStore();
  testing::WriteFile(dir_.Join("bad.yaml"), JobYaml("bogus_section: 1\n"));
  EXPECT_EQ(Student("train --config " + dir_.Join("bad.yaml")), 2);
  EXPECT_NE(Stderr().find("bogus_section"), std::string::npos) << Stderr();
  std::string lr = JobYaml();
  lr.replace(lr.find("lr: 3.0e-3"), 10, "lr: -1");
  testing::WriteFile(dir_.Join("lr.yaml"), lr);
  EXPECT_EQ(Student("train --config " + dir_.Join("lr.yaml")), 2);
  EXPECT_NE(Stderr().find("optimizer.lr"), std::string::npos) << Stderr();
}

}  // namespace
}  // namespace specstream
