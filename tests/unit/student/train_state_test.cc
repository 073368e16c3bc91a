// A run's state across restarts (student/train_state.h): a resume restores
// the draft, the optimizer and the RNG exactly, and refuses, naming what
// differs, a run it cannot continue exactly.
#include "student/train_state.h"

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/rank_threads.h"
#include "tests/testing/testing.h"

namespace specstream::student {
namespace {

using ::testing::HasSubstr;

TrainRun RunIn(const std::string& dir) {
  TrainRun run;
  run.checkpoint_dir = dir;
  run.seed = 7;
  run.steps_per_epoch = 4;
  run.total_steps = 12;
  run.schedule.total_steps = 12;
  return run;
}

c10::intrusive_ptr<CommGroup> NoGroup() { return c10::intrusive_ptr<CommGroup>(); }

TrainState::NamedParams DraftParams(float base) {
  return {{"fc.weight", torch::full({3, 2}, base).requires_grad_(true)},
          {"norm.weight", torch::full({2}, base + 1).requires_grad_(true)}};
}

DraftRecord Record(const std::string& type = "eagle3") {
  DraftRecord record;
  record.fixed["d2t"] = torch::arange(4, torch::kInt64);
  record.state = {{"draft_type", type}};
  record.resume_keys = {"draft_type"};
  return record;
}

// One optimizer step from a fixed gradient, so exp_avg and step are set.
void Step(TrainState::NamedParams& params, AdamW& optimizer) {
  for (auto& [name, p] : params) p.mutable_grad() = torch::ones_like(p) * 0.5;
  optimizer.Step(0.1);
}

TEST(TrainStateTest, ResumeRestoresTheDraftTheOptimizerAndTheRng) {
  testing::TempDir dir;
  TrainState::NamedParams params = DraftParams(1);
  AdamW optimizer(params, AdamWOptions{});
  Step(params, optimizer);
  TrainState saver(RunIn(dir.path()), params, Record(), optimizer, NoGroup());
  ASSERT_TRUE(saver.Save(3).ok());
  const torch::Tensor next_draws = torch::rand({4});  // what follows the saved RNG state
  const std::map<std::string, torch::Tensor> optimizer_state = optimizer.State();

  TrainState::NamedParams fresh = DraftParams(-5);
  AdamW fresh_optimizer(fresh, AdamWOptions{});
  TrainState resumer(RunIn(dir.path()), fresh, Record(), fresh_optimizer, NoGroup());
  torch::rand({9});  // the RNG moves on before the resume
  absl::StatusOr<int64_t> step = resumer.Resume();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 3);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(fresh[i].second, params[i].second)) << params[i].first;
  }
  EXPECT_EQ(fresh_optimizer.steps(), 1);
  for (const auto& [name, t] : fresh_optimizer.State()) {
    EXPECT_TRUE(torch::equal(t, optimizer_state.at(name))) << name;
  }
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_draws));
}

TEST(TrainStateTest, WithoutACheckpointResumeStartsAtStepZero) {
  testing::TempDir dir;
  TrainState::NamedParams params = DraftParams(1);
  AdamW optimizer(params, AdamWOptions{});
  TrainState state(RunIn(dir.Join("none")), params, Record(), optimizer, NoGroup());
  absl::StatusOr<int64_t> step = state.Resume();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  EXPECT_TRUE(torch::equal(params[0].second, torch::full({3, 2}, 1.0f)));
}

// Each change a resume cannot continue exactly is refused, naming it, and
// leaves the draft as it was.
TEST(TrainStateTest, ResumeRefusesARunItCannotContinueExactly) {
  testing::TempDir dir;
  {
    TrainState::NamedParams params = DraftParams(1);
    AdamW optimizer(params, AdamWOptions{});
    Step(params, optimizer);
    ASSERT_TRUE(TrainState(RunIn(dir.path()), params, Record(), optimizer, NoGroup()).Save(4).ok());
  }
  struct Case {
    std::string what;
    std::function<void(TrainRun&, DraftRecord&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"world", [](TrainRun& run, DraftRecord&) { run.world_size = 2; }, "same world size"},
      {"cp", [](TrainRun& run, DraftRecord&) { run.cp_size = 2; }, "cp_size"},
      {"plan", [](TrainRun& run, DraftRecord&) { run.steps_per_epoch = 5; }, "data plan"},
      {"vocab map",
       [](TrainRun&, DraftRecord& record) { record.fixed["d2t"] = torch::arange(1, 5); },
       "d2t differs"},
      {"draft type", [](TrainRun&, DraftRecord& record) { record.state["draft_type"] = "dflash"; },
       "draft_type \"eagle3\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TrainRun run = RunIn(dir.path());
    DraftRecord record = Record();
    c.change(run, record);
    TrainState::NamedParams params = DraftParams(-5);
    AdamW optimizer(params, AdamWOptions{});
    absl::StatusOr<int64_t> step =
        TrainState(run, params, std::move(record), optimizer, NoGroup()).Resume();
    ASSERT_FALSE(step.ok());
    EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(step.status().message()), HasSubstr(c.message));
    EXPECT_TRUE(torch::equal(params[0].second, torch::full({3, 2}, -5.0f)));
  }
  // A draft of another shape.
  TrainState::NamedParams wider = {{"fc.weight", torch::zeros({3, 3}).requires_grad_(true)},
                                   {"norm.weight", torch::zeros({2}).requires_grad_(true)}};
  AdamW optimizer(wider, AdamWOptions{});
  absl::StatusOr<int64_t> step =
      TrainState(RunIn(dir.path()), wider, Record(), optimizer, NoGroup()).Resume();
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(step.status().message()), HasSubstr("fc.weight"));
}

// Two ranks: rank 0 writes once every rank's RNG is gathered, and both
// resume the same step.
TEST(TrainStateTest, RanksSaveTogetherAndResumeTheSameStep) {
  testing::TempDir dir;
  std::vector<int64_t> resumed(2, -1);
  absl::Status status = testing::RunOnRankThreads(
      2, [&](int rank, c10::intrusive_ptr<CommGroup> group) -> absl::Status {
        TrainRun run = RunIn(dir.path());
        run.rank = rank;
        run.world_size = 2;
        TrainState::NamedParams params = DraftParams(2);
        AdamW optimizer(params, AdamWOptions{});
        Step(params, optimizer);
        RETURN_IF_ERROR(TrainState(run, params, Record(), optimizer, group).Save(8));
        TrainState::NamedParams fresh = DraftParams(0);
        AdamW fresh_optimizer(fresh, AdamWOptions{});
        ASSIGN_OR_RETURN(resumed[rank],
                         TrainState(run, fresh, Record(), fresh_optimizer, group).Resume());
        if (!torch::equal(fresh[1].second, params[1].second)) {
          return absl::InternalError("the resumed draft differs");
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(resumed, std::vector<int64_t>({8, 8}));
  EXPECT_TRUE(std::filesystem::exists(dir.Join("step-00000008/rng-rank-1.bin")));
}

}  // namespace
}  // namespace specstream::student
