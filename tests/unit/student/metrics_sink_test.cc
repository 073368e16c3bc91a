// What a step reports (student/metrics_sink.h): the TTT means against hand
// computation, the metrics.jsonl lines, and refusals; and the ledger of
// trained samples (student/ledger.h), written and read back.
#include "student/metrics_sink.h"

#include <filesystem>

#include "common/jsonl.h"
#include "gtest/gtest.h"
#include "student/ledger.h"
#include "tests/testing/testing.h"

namespace specstream::student {
namespace {

TEST(MetricsSinkTest, TttMeansWeighStepsByPointEightAndGuardEmptySteps) {
  // Three steps: 4, 2 and 0 valid positions.
  const double loss_sum[] = {8.0, 3.0, 5.0};
  const double correct[] = {3.0, 1.0, 0.0};
  const double valid[] = {4.0, 2.0, 0.0};
  const TttMeans means = TttMeansFromSums(loss_sum, correct, valid, 3);
  EXPECT_EQ(means.loss_k, (std::vector<double>{2.0, 1.5, 5.0}));  // max(1, 0) for step 2
  EXPECT_EQ(means.acc_k, (std::vector<double>{0.75, 0.5, 0.0}));
  EXPECT_DOUBLE_EQ(means.loss, 2.0 + 0.8 * 1.5 + 0.64 * 5.0);
  EXPECT_DOUBLE_EQ(means.sim_accept_len, 0.75 + 0.75 * 0.5 + 0.0);
  EXPECT_DOUBLE_EQ(SimulatedAcceptLength({1.0, 1.0}), 2.0);
  EXPECT_DOUBLE_EQ(SimulatedAcceptLength({}), 0.0);
}

TEST(MetricsSinkTest, JsonlGetsOneLinePerRecordWithEveryField) {
  testing::TempDir dir;
  MetricsSinkOptions options;
  options.total_steps = 10;
  options.log_lines = false;
  options.jsonl = dir.Join("metrics.jsonl");
  auto sink = MetricsSink::Create(options);
  ASSERT_TRUE(sink.ok()) << sink.status();
  StepMetrics m;
  m.step = 4;
  m.loss = 1.25;
  m.loss_k = {1.0, 0.3125};
  m.acc_k = {0.5, 0.25};
  m.sim_accept_len = 0.625;
  m.positions = 17;
  ASSERT_TRUE((*sink)->Write(m).ok());
  m.step = 8;
  ASSERT_TRUE((*sink)->Write(m).ok());
  std::vector<nlohmann::json> lines;
  ASSERT_TRUE(ForEachJsonLine(options.jsonl, [&](int64_t, const nlohmann::json& line) {
                lines.push_back(line);
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["step"], 4);
  EXPECT_EQ(lines[1]["step"], 8);
  EXPECT_EQ(lines[0]["total_steps"], 10);
  EXPECT_EQ(lines[0]["loss_k"], nlohmann::json({1.0, 0.3125}));
  EXPECT_EQ(lines[0]["acc_k"], nlohmann::json({0.5, 0.25}));
  EXPECT_EQ(lines[0]["positions"], 17);
  for (const char* field : {"loss", "sim_accept_len", "lr", "grad_norm", "tokens_per_s"}) {
    EXPECT_TRUE(lines[0].contains(field)) << field;
  }
}

// A block draft's record: per-slot acc, no per-step losses, tau and the
// confidence head's calibration error, in metrics.jsonl and TensorBoard.
TEST(MetricsSinkTest, BlockDraftRecordsCarryTauAndCalibration) {
  testing::TempDir dir;
  MetricsSinkOptions options;
  options.total_steps = 10;
  options.log_lines = true;
  options.jsonl = dir.Join("metrics.jsonl");
  options.tensorboard_dir = dir.Join("tb");
  auto sink = MetricsSink::Create(options);
  ASSERT_TRUE(sink.ok()) << sink.status();
  StepMetrics m;
  m.step = 3;
  m.acc_k = {0.0, 0.75, 0.5};
  m.tau = 2.125;
  m.calibration_error = 0.0625;
  ASSERT_TRUE((*sink)->Write(m).ok());
  m.calibration_error.reset();
  m.tau.reset();
  m.step = 4;
  ASSERT_TRUE((*sink)->Write(m).ok());
  std::vector<nlohmann::json> lines;
  ASSERT_TRUE(ForEachJsonLine(options.jsonl, [&](int64_t, const nlohmann::json& line) {
                lines.push_back(line);
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["tau"], 2.125);
  EXPECT_EQ(lines[0]["conf_ece"], 0.0625);
  EXPECT_EQ(lines[0]["acc_k"], nlohmann::json({0.0, 0.75, 0.5}));
  EXPECT_FALSE(lines[1].contains("tau"));
  EXPECT_FALSE(lines[1].contains("conf_ece"));
  EXPECT_FALSE(std::filesystem::is_empty(dir.Join("tb")));
}

TEST(MetricsSinkTest, AnUnwritableJsonlIsRefusedAtCreateNamingIt) {
  testing::TempDir dir;
  MetricsSinkOptions options;
  options.jsonl = dir.Join("no-such-dir/metrics.jsonl");
  auto sink = MetricsSink::Create(options);
  ASSERT_FALSE(sink.ok());
  EXPECT_NE(sink.status().message().find("metrics.jsonl"), std::string::npos) << sink.status();
  EXPECT_NE(sink.status().message().find("no-such-dir"), std::string::npos) << sink.status();
}

TEST(LedgerTest, RecordsReadBackInOrderAndAppendAcrossOpens) {
  testing::TempDir dir;
  const std::string path = LedgerPath(dir.path(), 3);
  EXPECT_EQ(std::filesystem::path(path).filename(), "ledger-rank3.jsonl");
  {
    auto ledger = Ledger::Open(path, 3);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    ASSERT_TRUE((*ledger)->Record(1, {4, 0}).ok());
    ASSERT_TRUE((*ledger)->Record(2, {}).ok());
  }
  {
    auto ledger = Ledger::Open(path, 3);  // a resumed run appends
    ASSERT_TRUE(ledger.ok());
    ASSERT_TRUE((*ledger)->Record(3, {7}).ok());
  }
  auto entries = ReadLedger(path);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].step, 1);
  EXPECT_EQ((*entries)[0].rank, 3);
  EXPECT_EQ((*entries)[0].sample_ids, (std::vector<int64_t>{4, 0}));
  EXPECT_TRUE((*entries)[1].sample_ids.empty());
  EXPECT_EQ((*entries)[2].sample_ids, (std::vector<int64_t>{7}));
}

TEST(LedgerTest, BadLinesAndUnwritablePathsAreNamed) {
  testing::TempDir dir;
  auto missing = Ledger::Open(dir.Join("absent/ledger.jsonl"), 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("ledger"), std::string::npos) << missing.status();
  testing::WriteFile(dir.Join("bad.jsonl"),
                     "{\"step\": 1, \"rank\": 0, \"sample_ids\": [1]}\n"
                     "{\"step\": 2, \"sample_ids\": [2]}\n");
  auto bad = ReadLedger(dir.Join("bad.jsonl"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl:2"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace specstream::student
