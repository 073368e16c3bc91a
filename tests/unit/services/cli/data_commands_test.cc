#include "services/cli/data_commands.h"

#include <filesystem>
#include <sstream>

#include "common/safetensors.h"
#include "common/vocab_map.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_tokenizer.h"

namespace specstream::services {
namespace {

class DataCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.Join("tok"));
    testing::WriteFile(dir_.Join("tok/tokenizer.json"),
                       testing::TinyTokenizerJson(testing::ChatSpecialTokens()));
  }

  // Runs the real binary; returns its exit code. stdout/stderr go to files.
  int RunCli(const std::string& args) {
    return testing::RunCommand(std::string(SPECSTREAM_CLI_PATH) + " " + args, dir_.Join("stdout"),
                               dir_.Join("stderr"));
  }

  std::vector<std::string> DirectoryEntries() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  testing::TempDir dir_;
};

TEST_F(DataCommandsTest, TokenizeWritesOneIdsLinePerInputLine) {
  testing::WriteFile(dir_.Join("in.jsonl"), "{\"text\":\"ab\"}\n\n{\"text\":\"<|im_start|>a\"}\n");
  std::ostringstream out;
  TokenizeOptions options{dir_.Join("tok"), dir_.Join("in.jsonl"), ""};
  ASSERT_TRUE(RunTokenize(options, out).ok());
  // Byte ids: 'a' = 97, 'b' = 98; <|im_start|> is the 5th special token.
  EXPECT_EQ(out.str(), "{\"ids\":[97,98]}\n{\"ids\":[260,97]}\n");
}

TEST_F(DataCommandsTest, MalformedLineFailsWithLineNumberAndLeavesNoOutput) {
  testing::WriteFile(dir_.Join("in.jsonl"), "{\"text\":\"ok\"}\n{\"text\":\"ok\"}\n{\"txt\":1}\n");
  std::ostringstream out;
  TokenizeOptions options{dir_.Join("tok"), dir_.Join("in.jsonl"), ""};
  absl::Status s = RunTokenize(options, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("in.jsonl:3:"), std::string::npos) << s;
  EXPECT_EQ(out.str(), "");  // nothing reached stdout

  // The binary: exit code 2, the reason on stderr, no output file at all.
  EXPECT_EQ(RunCli("data tokenize --tokenizer " + dir_.Join("tok") + " --input " +
                   dir_.Join("in.jsonl") + " --out " + dir_.Join("out.jsonl")),
            2);
  EXPECT_NE(testing::ReadFile(dir_.Join("stderr")).find("in.jsonl:3:"), std::string::npos);
  EXPECT_EQ(DirectoryEntries(), (std::vector<std::string>{"in.jsonl", "stderr", "stdout", "tok"}));
}

TEST_F(DataCommandsTest, RenderThenVocabMapThroughTheBinary) {
  testing::WriteFile(dir_.Join("conv.jsonl"),
                     "{\"conversations\":[{\"from\":\"human\",\"value\":\"hi\"},{\"from\":\"gpt\","
                     "\"value\":\"yo\"}]}\n"
                     "{\"input_ids\":[1,2,3],\"loss_mask\":[0,1,1]}\n");
  ASSERT_EQ(RunCli("data render --tokenizer " + dir_.Join("tok") + " --template chatml --input " +
                   dir_.Join("conv.jsonl") + " --out " + dir_.Join("rendered.jsonl")),
            0)
      << testing::ReadFile(dir_.Join("stderr"));
  std::istringstream lines(testing::ReadFile(dir_.Join("rendered.jsonl")));
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(lines, line)) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 2u);
  // "yo<|im_end|>" is trained: 'y', 'o' and the im_end id (261).
  std::vector<int> trained;
  for (size_t i = 0; i < records[0]["input_ids"].size(); ++i) {
    if (records[0]["loss_mask"][i] == 1) trained.push_back(records[0]["input_ids"][i]);
  }
  EXPECT_EQ(trained, (std::vector<int>{'y', 'o', 261}));
  EXPECT_EQ(records[1]["input_ids"], nlohmann::json::parse("[1,2,3]"));

  ASSERT_EQ(RunCli("data vocab-map --input " + dir_.Join("rendered.jsonl") +
                   " --draft-vocab 4 --target-vocab 300 --out " + dir_.Join("map.safetensors")),
            0)
      << testing::ReadFile(dir_.Join("stderr"));
  auto map = LoadVocabMap(dir_.Join("map.safetensors"));
  ASSERT_TRUE(map.ok()) << map.status();
  // Trained tokens: y, o, <|im_end|>, 2, 3 -> the four most frequent
  // (all once; smallest ids win ties): 2, 3, 'o' (111), 'y' (121).
  EXPECT_EQ(map->used, (std::vector<int64_t>{2, 3, 111, 121}));
  EXPECT_EQ(map->target_vocab(), 300);
}

TEST_F(DataCommandsTest, UsageErrorsExitTwo) {
  EXPECT_EQ(RunCli("data tokenize --input x.jsonl"), 2);  // --tokenizer missing
  EXPECT_EQ(RunCli("data render --tokenizer " + dir_.Join("tok") + " --template vicuna --input " +
                   dir_.Join("nothing.jsonl")),
            2);  // unknown template: bad input
  EXPECT_EQ(RunCli("--help"), 0);
  EXPECT_EQ(RunCli("data vocab-map --input " + dir_.Join("missing.jsonl") +
                   " --draft-vocab 4 --out " + dir_.Join("m.safetensors")),
            4);
}

}  // namespace
}  // namespace specstream::services
