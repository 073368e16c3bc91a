// specstream-teacher as a user runs it: init-random, forward and dump, with
// tensor parallelism across worker processes (--devices cpu,cpu).
#include <sys/wait.h>

#include <cstdlib>
#include <map>
#include <sstream>

#include "common/offline_store.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

class TeacherCliTest : public ::testing::Test {
 protected:
  int Run(const std::string& args) {
    std::string command = std::string(SPECSTREAM_TEACHER_PATH) + " " + args + " >" +
                          dir_.Join("stdout") + " 2>" + dir_.Join("stderr");
    int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string Stdout() { return testing::ReadFile(dir_.Join("stdout")); }
  std::string Stderr() { return testing::ReadFile(dir_.Join("stderr")); }

  // "name dtype [shape] sum=S abs_sum=A" lines -> name -> (sum, abs_sum).
  std::map<std::string, std::pair<double, double>> Checksums() {
    std::map<std::string, std::pair<double, double>> out;
    std::istringstream lines(Stdout());
    std::string line;
    while (std::getline(lines, line)) {
      size_t sum = line.find(" sum="), abs = line.find(" abs_sum=");
      if (sum == std::string::npos || abs == std::string::npos) continue;
      out[line.substr(0, line.find(' '))] = {std::stod(line.substr(sum + 5)),
                                             std::stod(line.substr(abs + 9))};
    }
    return out;
  }
  std::string Line(const std::string& prefix) {
    std::istringstream lines(Stdout());
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind(prefix, 0) == 0) return line;
    }
    return "";
  }

  void InitModel(const std::string& extra = "") {
    ASSERT_EQ(Run("init-random --arch qwen2 --layers 8 --hidden 64 --heads 4 --kv-heads 2 "
                  "--intermediate 128 --vocab 512 --shards 2 --seed 3 --dtype float32 --out " +
                  dir_.Join("model") + " " + extra),
              0)
        << Stderr();
  }

  testing::TempDir dir_;
};

TEST_F(TeacherCliTest, ForwardWithTwoProcessTensorParallelismMatchesOneRank) {
  InitModel();
  const std::string ids = "--ids 1,5,9,200,17,33,2,511,8,8,8";
  ASSERT_EQ(Run("forward --model " + dir_.Join("model") + " --dtype float32 " + ids), 0)
      << Stderr();
  auto single = Checksums();
  std::string single_targets = Line("target_ids 1") + Line("target_ids ");
  ASSERT_EQ(
      Run("forward --model " + dir_.Join("model") + " --dtype float32 --devices cpu,cpu " + ids), 0)
      << Stderr();
  auto tp = Checksums();
  std::string tp_targets = Line("target_ids 1") + Line("target_ids ");
  ASSERT_EQ(single.size(), 3u) << Stdout();
  for (const char* name : {"aux_hidden", "last_hidden"}) {
    EXPECT_NEAR(tp[name].second, single[name].second, 1e-5 * single[name].second) << name;
    EXPECT_NEAR(tp[name].first, single[name].first, 1e-5 * single[name].second) << name;
  }
  EXPECT_EQ(tp_targets, single_targets);
  EXPECT_NE(Line("capture_layer_ids"), "");
}

TEST_F(TeacherCliTest, DumpWithTensorParallelismWritesTheStore) {
  InitModel();
  std::string data;
  for (int i = 0; i < 7; ++i) {
    data += "{\"input_ids\":[" + std::to_string(i + 1) + ",2,3,4,5],\"loss_mask\":[0,0,1,1,1]}\n";
  }
  testing::WriteFile(dir_.Join("data.jsonl"), data);
  ASSERT_EQ(Run("dump --model " + dir_.Join("model") + " --devices cpu,cpu --data " +
                dir_.Join("data.jsonl") + " --out " + dir_.Join("store") +
                " --keep-target-ids --shard-samples 3 --batch-tokens 16"),
            0)
      << Stderr();
  auto reader = StoreReader::Open(dir_.Join("store"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->complete());
  EXPECT_EQ((*reader)->num_samples(), 7);
  EXPECT_EQ((*reader)->num_shards(), 3);
  EXPECT_EQ((*reader)->num_tokens(), 35);
  EXPECT_NE(Stderr().find("dump: wrote 7 samples"), std::string::npos) << Stderr();
}

TEST_F(TeacherCliTest, ImpossibleLayoutsAndBadInputFailFastWithReasons) {
  InitModel();
  // 4 heads over 3 ranks: refused by every rank, reported by the leader.
  EXPECT_EQ(Run("forward --model " + dir_.Join("model") + " --devices cpu,cpu,cpu --ids 1,2"), 2);
  EXPECT_NE(Stderr().find("num_attention_heads 4 is not divisible"), std::string::npos) << Stderr();
  EXPECT_EQ(Run("forward --model " + dir_.Join("model") + " --ids 1,512"), 2);
  EXPECT_NE(Stderr().find("outside the vocab"), std::string::npos) << Stderr();
  EXPECT_EQ(Run("forward --model " + dir_.Join("model") + " --devices gpu0 --ids 1"), 2);
  EXPECT_NE(Stderr().find("unknown device \"gpu0\""), std::string::npos) << Stderr();
  EXPECT_EQ(Run("init-random --arch gpt2 --layers 2 --hidden 8 --heads 2 --kv-heads 2 "
                "--intermediate 8 --vocab 8 --out " +
                dir_.Join("x")),
            2);
  EXPECT_NE(Stderr().find("--arch"), std::string::npos) << Stderr();
}

}  // namespace
}  // namespace specstream
