#include "student/trainer.h"

#include <filesystem>
#include <iostream>
#include <limits>
#include <set>

#include "common/torch/process_group.h"
#include "gtest/gtest.h"
#include "student/export.h"
#include "student/eagle3_plugin.h"
#include "student/student_commands.h"
#include "teacher/dump.h"
#include "teacher/hf_runtime.h"
#include "tests/testing/rank_threads.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::student {
namespace {

// A tiny random teacher and a store of 24 pre-tokenized samples dumped from it
// (shared by every test in the suite: dumping is the slow part).
class TrainerTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new specstream::testing::TempDir();
    specstream::testing::TinyModelOptions model;
    model.layers = 8;
    model.hidden = 32;
    model.heads = 4;
    model.kv_heads = 2;
    model.intermediate = 64;
    model.vocab = 256;
    specstream::testing::WriteTinyModel(dir_->Join("target"), model);
    specstream::testing::WriteTokenizedSamples(dir_->Join("data.jsonl"), 24, 7, 5, 256);
    teacher::HfRuntimeOptions options;
    options.model_dir = dir_->Join("target");
    options.dtype = "float32";
    auto runtime = teacher::HfRuntime::Create(options);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    teacher::DumpOptions dump;
    dump.data = dir_->Join("data.jsonl");
    dump.out = dir_->Join("store");
    dump.store_dtype = "float32";
    dump.keep_target_ids = true;
    dump.progress_terminal = 0;
    auto summary = teacher::RunDump(**runtime, dump);
    ASSERT_TRUE(summary.ok()) << summary.status();
  }
  static void TearDownTestSuite() { delete dir_; }

  static TrainerConfig Config() {
    TrainerConfig c;
    c.store = dir_->Join("store");
    c.target_dir = dir_->Join("target");
    c.draft_vocab_size = 128;
    c.lr = 3e-3;
    c.max_steps = 20;
    c.batch_size = 4;
    c.ttt_steps = 3;
    c.seed = 5;
    c.dtype = torch::kFloat32;
    c.grad_clip = 1.0;
    c.progress_terminal = 0;
    c.log_every = 0;
    return c;
  }

  // P-EAGLE over `c`: the same EAGLE-3 draft proposing its depths in
  // parallel, with COD sampling (a low floor, so that deep depths thin out).
  static TrainerConfig Peagle(TrainerConfig c) {
    c.draft_type = "peagle";
    c.eagle3.parallel_drafting = true;
    c.mask_token_id = 3;
    c.ttt_steps = 4;
    c.down_sample_ratio = 0.6;
    c.down_sample_ratio_min = 0.1;
    return c;
  }

  static double MaxParameterDifference(Trainer& a, Trainer& b) {
    EXPECT_EQ(a.draft().parameters().size(), b.draft().parameters().size());
    double diff = 0;
    for (size_t i = 0; i < a.draft().parameters().size(); ++i) {
      diff = std::max(diff, (a.draft().parameters()[i].second - b.draft().parameters()[i].second)
                                .abs()
                                .max()
                                .item<double>());
    }
    return diff;
  }

  static specstream::testing::TempDir* dir_;
};

specstream::testing::TempDir* TrainerTest::dir_ = nullptr;

class TrainerDdpTest : public TrainerTest, public ::testing::WithParamInterface<int64_t> {};

// Bucket sizes: one bucket for everything, and small buckets (several
// all-reduces launched from backward hooks while backward still runs).
INSTANTIATE_TEST_SUITE_P(Buckets, TrainerDdpTest, ::testing::Values(int64_t{4} << 20, 2048));

// Two DP ranks of batch 2 against one rank of batch 4, 20 steps of `base`.
void ExpectTwoRanksEqualOneRank(const TrainerConfig& base, int64_t bucket_elements) {
  auto single = Trainer::Create(base, 0, 1, {});
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE((*single)->RunSteps(20).ok());

  TrainerConfig ddp_config = base;
  ddp_config.batch_size = 2;
  ddp_config.ddp_bucket_elements = bucket_elements;
  std::unique_ptr<Trainer> ranks[2];
  absl::Status status = specstream::testing::RunOnRankThreads(
      2, [&](int rank, c10::intrusive_ptr<CommGroup> group) -> absl::Status {
        auto trainer = Trainer::Create(ddp_config, rank, 2, group);
        if (!trainer.ok()) return trainer.status();
        absl::Status run = (*trainer)->RunSteps(20);
        ranks[rank] = std::move(*trainer);
        return run;
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(ranks[0]->step(), 20);
  EXPECT_LE(TrainerTest::MaxParameterDifference(*ranks[0], **single), 1e-5);
  EXPECT_EQ(TrainerTest::MaxParameterDifference(*ranks[0], *ranks[1]), 0.0);  // replicas stay identical
  // Metrics are global: the same on both layouts.
  EXPECT_NEAR(ranks[0]->history().back().loss, (*single)->history().back().loss, 1e-5);
  EXPECT_EQ(ranks[0]->history().back().positions, (*single)->history().back().positions);
}

TEST_P(TrainerDdpTest, TwoRanksWithBatchBEqualOneRankWithBatch2B) {
  ExpectTwoRanksEqualOneRank(Config(), GetParam());
}

// EAGLE 3.1's flags (their norms are parameters too, reduced like the rest).
TEST_F(TrainerTest, TwoRanksEqualOneRankWithEagle31Flags) {
  for (const Eagle3Options& flags : {Eagle3Options{true, true, false}, Eagle3Options{false, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "fc_norm " << flags.fc_norm << ", norm_before_fc "
                                      << flags.norm_before_fc);
    TrainerConfig config = Config();
    config.eagle3 = flags;
    ExpectTwoRanksEqualOneRank(config, int64_t{4} << 20);
  }
}

// P-EAGLE: COD plans are keyed by sample, so two ranks draw what one rank
// with their samples draws, and the count-normalised loss is global.
TEST_F(TrainerTest, TwoRanksEqualOneRankWithPeagle) {
  ExpectTwoRanksEqualOneRank(Peagle(Config()), int64_t{4} << 20);
}

// ---------------------------------------------------------------------------
// Context parallelism: world = DP x CP trainer ranks (threads) against one
// rank with the DP groups' batches together. The draft gets 8 query / 4
// key-value heads so that Ulysses can split them four ways.

struct CpCase {
  int world, cp, ulysses;
  int64_t max_length;  // 0: the samples' own lengths (12-31, odd maxima)
  const char* name;
  Eagle3Options eagle3 = {};  // EAGLE 3.1's flags
  bool peagle = false;
};

std::ostream& operator<<(std::ostream& os, const CpCase& c) { return os << c.name; }

class TrainerCpTest : public TrainerTest, public ::testing::WithParamInterface<CpCase> {
 public:
  // The configuration of one rank of the case's world, or of the single
  // reference rank that takes all DP groups' samples at once.
  static TrainerConfig CpConfig(const CpCase& c, bool reference) {
    TrainerConfig config = Config();
    config.num_attention_heads = 8;
    config.num_key_value_heads = 4;
    config.head_dim = 8;
    config.max_length = c.max_length;
    config.batch_size = reference ? 4 : 4 / (c.world / c.cp);
    config.cp_size = reference ? 1 : c.cp;
    config.ulysses_degree = reference ? 1 : c.ulysses;
    config.eagle3 = c.eagle3;
    return c.peagle ? Peagle(config) : config;
  }

  // Runs `steps` on every rank of a DP x CP world; returns the trainers.
  static absl::Status RunWorld(const CpCase& c, const TrainerConfig& config, int64_t steps,
                               std::vector<std::unique_ptr<Trainer>>& ranks) {
    ranks.resize(c.world);
    return specstream::testing::RunOnRankHandles(
        c.world, [&](int rank, const ProcessGroupHandle& handle) -> absl::Status {
          auto trainer = Trainer::Create(config, rank, c.world, handle.group, handle.store);
          if (!trainer.ok()) return trainer.status();
          absl::Status run = (*trainer)->RunSteps(steps);
          ranks[rank] = std::move(*trainer);
          return run;
        });
  }
};

INSTANTIATE_TEST_SUITE_P(
    Modes, TrainerCpTest,
    ::testing::Values(CpCase{2, 2, 1, 0, "ring_cp2"}, CpCase{2, 2, 2, 0, "ulysses_cp2"},
                      CpCase{4, 4, 1, 0, "ring_cp4"}, CpCase{4, 4, 4, 0, "ulysses_cp4"},
                      CpCase{4, 4, 2, 0, "usp_cp4_ulysses2"}, CpCase{4, 2, 1, 0, "dp2_ring_cp2"},
                      CpCase{4, 4, 2, 6, "usp_cp4_T6_empty_last_shard"},
                      CpCase{4, 4, 1, 6, "ring_cp4_T6_empty_last_shard"},
                      CpCase{2, 2, 1, 0, "ring_cp2_eagle31", {true, true, false}},
                      CpCase{2, 2, 2, 0, "ulysses_cp2_eagle31", {true, true, false}},
                      CpCase{4, 4, 2, 0, "usp_cp4_norm_before_fc", {false, true, true}},
                      CpCase{2, 2, 1, 0, "ring_cp2_peagle", {}, true},
                      CpCase{4, 4, 2, 0, "usp_cp4_peagle", {true, false, false}, true}),
    [](const ::testing::TestParamInfo<CpCase>& info) { return std::string(info.param.name); });

// One step on the same batch: loss, acc_k and every parameter gradient (the
// all-reduced gradient each rank holds after the step) within 1e-5 relative
// of CP = 1.
TEST_P(TrainerCpTest, OneStepMatchesCp1) {
  const CpCase c = GetParam();
  TrainerConfig reference_config = CpConfig(c, true);
  reference_config.grad_clip = 0;  // keep the raw gradients for comparison
  auto reference = Trainer::Create(reference_config, 0, 1, {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE((*reference)->RunSteps(1).ok());

  TrainerConfig config = CpConfig(c, false);
  config.grad_clip = 0;
  std::vector<std::unique_ptr<Trainer>> ranks;
  const absl::Status status = RunWorld(c, config, 1, ranks);
  ASSERT_TRUE(status.ok()) << status;

  const StepMetrics& want = (*reference)->history().back();
  ASSERT_GT(want.positions, 0);
  double worst = 0;
  for (const auto& trainer : ranks) {
    const StepMetrics& got = trainer->history().back();
    EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::abs(want.loss)) << c;
    EXPECT_EQ(got.positions, want.positions) << c;
    EXPECT_EQ(got.tokens, want.tokens) << c;
    for (size_t k = 0; k < want.acc_k.size(); ++k) {
      EXPECT_NEAR(got.acc_k[k], want.acc_k[k], 1e-9) << c << " acc_" << k;
      EXPECT_NEAR(got.loss_k[k], want.loss_k[k], 1e-5 * std::abs(want.loss_k[k]) + 1e-9)
          << c << " loss_" << k;
    }
    const auto& params = trainer->draft().parameters();
    const auto& ref_params = (*reference)->draft().parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = params[i].second.grad();
      const torch::Tensor& ref_g = ref_params[i].second.grad();
      const double scale = std::max(ref_g.abs().max().item<double>(), 1e-12);
      const double relative = (g - ref_g).abs().max().item<double>() / scale;
      worst = std::max(worst, relative);
      EXPECT_LE(relative, 1e-5) << c << " gradient of " << params[i].first;
    }
  }
  std::cout << c << ": loss " << want.loss << ", worst relative gradient difference " << worst
            << "\n";
}

// 50 training steps (clipping, AdamW, the cosine schedule) at CP = 2 track
// CP = 1.
TEST_F(TrainerTest, FiftyStepsAtCp2TrackCp1) {
  for (const CpCase& c : {CpCase{2, 2, 1, 0, "ring_cp2"}, CpCase{2, 2, 2, 0, "ulysses_cp2"}}) {
    TrainerConfig reference_config = TrainerCpTest::CpConfig(c, true);
    reference_config.max_steps = 50;
    auto reference = Trainer::Create(reference_config, 0, 1, {});
    ASSERT_TRUE(reference.ok()) << reference.status();
    ASSERT_TRUE((*reference)->RunSteps(50).ok());
    TrainerConfig config = TrainerCpTest::CpConfig(c, false);
    config.max_steps = 50;
    std::vector<std::unique_ptr<Trainer>> ranks;
    const absl::Status status = TrainerCpTest::RunWorld(c, config, 50, ranks);
    ASSERT_TRUE(status.ok()) << status;
    const double diff = MaxParameterDifference(*ranks[0], **reference);
    std::cout << c << ": after 50 steps max |parameter difference| " << diff << ", loss "
              << ranks[0]->history().back().loss << " vs " << (*reference)->history().back().loss
              << "\n";
    EXPECT_LE(diff, 1e-4) << c;
    EXPECT_EQ(MaxParameterDifference(*ranks[0], *ranks[1]), 0.0) << c;
  }
}

TEST_F(TrainerTest, ImpossibleCpLayoutsAreRefusedBeforeStart) {
  TrainerConfig c = Config();
  c.cp_size = 2;
  // World 3 is not DP x 2.
  absl::Status world =
      specstream::testing::RunOnRankHandles(3, [&](int rank, const ProcessGroupHandle& handle) {
        return Trainer::Create(c, rank, 3, handle.group, handle.store).status();
      });
  EXPECT_EQ(world.code(), absl::StatusCode::kInvalidArgument) << world;
  EXPECT_NE(std::string(world.message()).find("parallel.cp_size 2 does not divide the world of 3"),
            std::string::npos)
      << world;
  // The tiny target's 4 query / 2 key-value heads cannot be split 4 ways.
  c.cp_size = 4;
  c.ulysses_degree = 4;
  absl::Status heads =
      specstream::testing::RunOnRankHandles(4, [&](int rank, const ProcessGroupHandle& handle) {
        return Trainer::Create(c, rank, 4, handle.group, handle.store).status();
      });
  EXPECT_EQ(heads.code(), absl::StatusCode::kInvalidArgument) << heads;
  EXPECT_NE(std::string(heads.message()).find("parallel.ulysses_degree 4 must divide"),
            std::string::npos)
      << heads;
}

TEST_F(TrainerTest, TokenBudgetBatchesKeepEveryRankAndEpochInStep) {
  TrainerConfig config = Config();
  config.batch_size = 0;
  config.batch_tokens = 64;  // samples of 12-31 tokens: 2-5 per batch
  config.max_steps = 0;
  config.epochs = 3;
  std::unique_ptr<Trainer> ranks[2];
  absl::Status status = specstream::testing::RunOnRankThreads(
      2, [&](int rank, c10::intrusive_ptr<CommGroup> group) -> absl::Status {
        auto trainer = Trainer::Create(config, rank, 2, group);
        if (!trainer.ok()) return trainer.status();
        absl::Status run = (*trainer)->Run();
        ranks[rank] = std::move(*trainer);
        return run;
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_GT(ranks[0]->total_steps(), 3);
  EXPECT_EQ(ranks[0]->step(), ranks[0]->total_steps());
  EXPECT_EQ(ranks[0]->total_steps() % 3, 0);  // the same number of steps every epoch
  EXPECT_EQ(MaxParameterDifference(*ranks[0], *ranks[1]), 0.0);
}

TEST_F(TrainerTest, LossFallsAndAcceptanceRisesOnATinyTeacher) {
  TrainerConfig config = Config();
  config.max_steps = 240;
  config.warmup_steps = 10;
  auto trainer = Trainer::Create(config, 0, 1, {});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Run().ok());
  const auto& h = (*trainer)->history();
  auto mean = [&](size_t from, size_t to, auto field) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += field(h[i]);
    return s / (to - from);
  };
  auto loss = [](const StepMetrics& m) { return m.loss; };
  auto acc0 = [](const StepMetrics& m) { return m.acc_k[0]; };
  const double first_loss = mean(0, 10, loss), last_loss = mean(230, 240, loss);
  const double first_acc = mean(0, 10, acc0), last_acc = mean(230, 240, acc0);
  std::cout << "loss " << first_loss << " -> " << last_loss << ", acc_0 " << first_acc << " -> "
            << last_acc << ", accept_len " << h.front().sim_accept_len << " -> "
            << h.back().sim_accept_len << "\n";
  // The soft cross-entropy includes the teacher's own entropy, so it cannot
  // approach 0; the drop is what the draft learned.
  EXPECT_LT(last_loss, first_loss - 1.0);
  EXPECT_GT(last_acc, first_acc + 0.1);
}

TEST_F(TrainerTest, InterruptedAndResumedEqualsUninterruptedBitwise) {
  specstream::testing::TempDir dir;
  TrainerConfig config = Config();
  config.max_steps = 12;
  config.checkpoint_every = 5;
  config.checkpoint_dir = dir.Join("straight");
  auto straight = Trainer::Create(config, 0, 1, {});
  ASSERT_TRUE(straight.ok()) << straight.status();
  ASSERT_TRUE((*straight)->Run().ok());

  config.checkpoint_dir = dir.Join("interrupted");
  {
    auto first = Trainer::Create(config, 0, 1, {});
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->RunSteps(7).ok());  // checkpoint at 5; steps 6-7 are lost
  }
  config.resume = true;
  auto resumed = Trainer::Create(config, 0, 1, {});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->step(), 5);
  ASSERT_TRUE((*resumed)->Run().ok());
  EXPECT_EQ((*resumed)->step(), 12);
  for (size_t i = 0; i < (*straight)->draft().parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal((*straight)->draft().parameters()[i].second,
                             (*resumed)->draft().parameters()[i].second))
        << (*straight)->draft().parameters()[i].first;
  }
  EXPECT_EQ((*resumed)->history().back().loss, (*straight)->history().back().loss);
}

// Runs `config` for 8 steps (checkpoints every 4) straight, and again
// interrupted after 6 and resumed from step 4: the two end bitwise equal.
// Returns the config of the resumed run.
TrainerConfig ExpectResumesBitwise(TrainerConfig config, specstream::testing::TempDir& dir) {
  config.max_steps = 8;
  config.checkpoint_every = 4;
  config.checkpoint_dir = dir.Join("straight");
  auto straight = Trainer::Create(config, 0, 1, {});
  EXPECT_TRUE(straight.ok()) << straight.status();
  if (!straight.ok()) return config;
  EXPECT_TRUE((*straight)->Run().ok());
  config.checkpoint_dir = dir.Join("interrupted");
  {
    auto first = Trainer::Create(config, 0, 1, {});
    EXPECT_TRUE(first.ok());
    if (first.ok()) EXPECT_TRUE((*first)->RunSteps(6).ok());
  }
  config.resume = true;
  auto resumed = Trainer::Create(config, 0, 1, {});
  EXPECT_TRUE(resumed.ok()) << resumed.status();
  if (!resumed.ok()) return config;
  EXPECT_EQ((*resumed)->step(), 4);
  EXPECT_TRUE((*resumed)->Run().ok());
  EXPECT_EQ((*resumed)->draft().type(), (*straight)->draft().type());
  EXPECT_EQ(TrainerTest::MaxParameterDifference(**straight, **resumed), 0.0);
  EXPECT_EQ((*resumed)->history().back().loss, (*straight)->history().back().loss);
  return config;
}

// P-EAGLE's mask_hidden and COD plans resume bitwise (the plans are keyed
// by step), and a resume with other COD shares is refused, naming them.
TEST_F(TrainerTest, PeagleResumesBitwiseAndRefusesOtherShares) {
  specstream::testing::TempDir dir;
  TrainerConfig config = ExpectResumesBitwise(Peagle(Config()), dir);
  config.down_sample_ratio = 0.7;
  auto other = Trainer::Create(config, 0, 1, {});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("peagle"), std::string::npos) << other.status();
  EXPECT_NE(other.status().message().find("down_sample_ratio"), std::string::npos)
      << other.status();
}

// EAGLE 3.1's norms are checkpointed and restored like every parameter, and
// a resume with other flags is refused, naming them.
TEST_F(TrainerTest, Eagle31ResumesBitwiseAndRefusesOtherFlags) {
  specstream::testing::TempDir dir;
  TrainerConfig eagle31 = Config();
  eagle31.eagle3 = {true, true, false};
  TrainerConfig config = ExpectResumesBitwise(eagle31, dir);
  config.eagle3.norm_output = false;
  auto other = Trainer::Create(config, 0, 1, {});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("eagle3"), std::string::npos) << other.status();
  EXPECT_NE(other.status().message().find("norm_output"), std::string::npos) << other.status();
}

TEST_F(TrainerTest, ExportAtTheEndHasTheServingLayout) {
  specstream::testing::TempDir dir;
  TrainerConfig config = Config();
  config.max_steps = 3;
  config.export_dir = dir.Join("export");
  auto trainer = Trainer::Create(config, 0, 1, {});
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Run().ok());
  auto exported = ReadExport(dir.Join("export"));
  ASSERT_TRUE(exported.ok()) << exported.status();
  std::set<std::string> names;
  for (const auto& [name, t] : exported->tensors) names.insert(name);
  EXPECT_EQ(names.count("fc.weight"), 1u);
  EXPECT_EQ(names.count("d2t"), 1u);
  EXPECT_EQ(names.count("embed_tokens.weight"), 0u);
  EXPECT_EQ(exported->tensors["fc.weight"].sizes(), (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(exported->tensors["lm_head.weight"].sizes(), (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(exported->config.draft_vocab_size, 128);
  EXPECT_EQ(exported->config.aux_layer_ids, (CaptureLayerIds{1, 3, 4}));

  // P13 item 21: `eval` takes the export (what users ship). It used to
  // answer "no checkpoint in ...". An export does not name its target.
  auto no_target = EvaluateCheckpoint(dir.Join("export"), config.store, 3, 0);
  ASSERT_FALSE(no_target.ok());
  EXPECT_NE(no_target.status().message().find("--target"), std::string::npos) << no_target.status();
  auto line = EvaluateCheckpoint(dir.Join("export"), config.store, 3, 0, config.target_dir);
  ASSERT_TRUE(line.ok()) << line.status();
  const nlohmann::json eval = nlohmann::json::parse(*line);
  auto own = Evaluate((*trainer)->draft(), (*trainer)->source());
  ASSERT_TRUE(own.ok()) << own.status();
  // The export holds bf16 weights: the same draft up to that rounding.
  EXPECT_NEAR(eval["loss"].get<double>(), own->loss, 0.05 * own->loss);
  EXPECT_EQ(eval["positions"].get<int64_t>(), own->positions);

  // In float32 the export evaluates exactly as the checkpoint of the same
  // step does (and as the draft in memory).
  auto in = DraftExportInput(*AsEagle3Draft((*trainer)->draft()), config.target_dir, {1, 3, 4});
  ASSERT_TRUE(in.ok()) << in.status();
  in->config.torch_dtype = "float32";
  ASSERT_TRUE(ExportDraft(*in, dir.Join("f32")).ok());
  auto f32 = EvaluateCheckpoint(dir.Join("f32"), config.store, 3, 0, config.target_dir);
  ASSERT_TRUE(f32.ok()) << f32.status();
  const nlohmann::json from_f32 = nlohmann::json::parse(*f32);
  EXPECT_NEAR(from_f32["loss"].get<double>(), own->loss, 1e-6 * own->loss);
  EXPECT_EQ(from_f32["acc"].get<std::vector<double>>(), own->acc_k);
}

TEST_F(TrainerTest, BadConfigsAreRefusedClearly) {
  TrainerConfig c = Config();
  c.epochs = 1;  // and max_steps
  EXPECT_NE(Trainer::Create(c, 0, 1, {}).status().message().find("exactly one of training.epochs"),
            std::string::npos);
  c = Config();
  c.draft_vocab_size = 100000;
  auto r = Trainer::Create(c, 0, 1, {});
  EXPECT_NE(r.status().message().find("draft_vocab_size"), std::string::npos) << r.status();

  // A store dumped from another target (different hidden size).
  specstream::testing::TempDir other;
  specstream::testing::TinyModelOptions model;
  model.hidden = 64;
  model.vocab = 256;
  specstream::testing::WriteTinyModel(other.Join("target"), model);
  c = Config();
  c.target_dir = other.Join("target");
  r = Trainer::Create(c, 0, 1, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("contract.model.hidden_size"), std::string::npos)
      << r.status();

  // A vocab map for the wrong target vocab.
  TokenCounter counter(1000);
  auto map = BuildVocabMap(counter, 10);
  ASSERT_TRUE(map.ok());
  ASSERT_TRUE(SaveVocabMap(*map, other.Join("map.safetensors")).ok());
  c = Config();
  c.draft_vocab_size = 0;
  c.vocab_map = other.Join("map.safetensors");
  r = Trainer::Create(c, 0, 1, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("covers 1000 target ids"), std::string::npos) << r.status();
}

// A source in front of the store that breaks on cue: at one sample it
// returns an error, hands out a tensor of the wrong shape or NaN hidden
// states; or it claims other capture layers than the store's.
class BreakingSource final : public SampleSource {
 public:
  enum class Break { kNone, kError, kBadShape, kNaN };
  BreakingSource(std::unique_ptr<SampleSource> inner, int64_t at, Break how)
      : inner_(std::move(inner)), at_(at), how_(how), model_(inner_->model()) {}
  BreakingSource(std::unique_ptr<SampleSource> inner, std::vector<int> capture_layer_ids)
      : BreakingSource(std::move(inner), -1, Break::kNone) {
    model_.capture_layer_ids = std::move(capture_layer_ids);
  }
  int64_t size() const override { return inner_->size(); }
  absl::StatusOr<TrainingSample> Get(int64_t index) override {
    absl::StatusOr<TrainingSample> s = inner_->Get(index);
    if (index != at_ || !s.ok()) return s;
    switch (how_) {
      case Break::kNone:
        break;
      case Break::kError:
        return absl::UnavailableError("teacher went away at sample");
      case Break::kBadShape:
        s->aux_hidden = s->aux_hidden.narrow(1, 0, 5);  // not C·H wide
        break;
      case Break::kNaN:
        s->aux_hidden = torch::full_like(s->aux_hidden, std::numeric_limits<float>::quiet_NaN());
        break;
    }
    return s;
  }
  absl::StatusOr<TrainingSample> GetRows(int64_t index, const RowRange& rows) override {
    return inner_->GetRows(index, rows);
  }
  const ModelContract& model() const override { return model_; }
  int64_t Length(int64_t index) const override { return inner_->Length(index); }
  bool has_target_ids() const override { return inner_->has_target_ids(); }
  absl::Status TokenIds(int64_t index, std::vector<int32_t>* ids,
                        std::vector<uint8_t>* mask) override {
    return inner_->TokenIds(index, ids, mask);
  }

 private:
  std::unique_ptr<SampleSource> inner_;
  int64_t at_;
  Break how_;
  ModelContract model_;
};

TEST_F(TrainerTest, AnInjectedSourcesFailuresEndTheStepWithAStatus) {
  for (BreakingSource::Break how :
       {BreakingSource::Break::kError, BreakingSource::Break::kBadShape}) {
    TrainerConfig c = Config();
    auto store = StoreSource::Open(c.store);
    ASSERT_TRUE(store.ok()) << store.status();
    // Every sample is read in the first epoch (24 samples, batches of 4).
    auto trainer =
        Trainer::Create(c, std::make_unique<BreakingSource>(*std::move(store), 11, how), 0, 1, {});
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    absl::Status run = (*trainer)->RunSteps(6);
    ASSERT_FALSE(run.ok());
    if (how == BreakingSource::Break::kError) {
      EXPECT_EQ(run.code(), absl::StatusCode::kUnavailable) << run;
    } else {
      // A LibTorch shape error inside the step, caught and named.
      EXPECT_NE(run.message().find("training step"), std::string::npos) << run;
    }
    EXPECT_LT((*trainer)->step(), 6);
  }
  TrainerConfig c = Config();
  EXPECT_EQ(Trainer::Create(c, nullptr, 0, 1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// P13 item 20: capture ids an EAGLE-3 server cannot use were refused only at
// export, after the whole run. The trainer now refuses them at Create.
TEST_F(TrainerTest, CaptureIdsTheServersCannotUseAreRefusedAtStart) {
  // The 8-layer target: ids must be three, ascending, and below 7.
  for (const std::vector<int>& ids :
       {std::vector<int>{1, 3, 7}, std::vector<int>{1, 3}, std::vector<int>{4, 3, 1}}) {
    TrainerConfig c = Config();
    auto store = StoreSource::Open(c.store);
    ASSERT_TRUE(store.ok()) << store.status();
    auto trainer =
        Trainer::Create(c, std::make_unique<BreakingSource>(*std::move(store), ids), 0, 1, {});
    ASSERT_FALSE(trainer.ok()) << "accepted capture ids of size " << ids.size();
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(trainer.status().message().find("EAGLE-3"), std::string::npos) << trainer.status();
  }
}

// P13 item 11: a NaN in the data used to train on (every weight NaN from
// that step on). Now the step is skipped, and past training.max_bad_steps
// the run fails naming the step.
TEST_F(TrainerTest, NonFiniteStepsAreSkippedAndPastTheLimitFailTheRun) {
  auto all_finite = [](Trainer& trainer) {
    for (const auto& [name, p] : trainer.draft().parameters()) {
      if (!torch::isfinite(p).all().item<bool>()) return false;
    }
    return true;
  };
  for (int64_t max_bad : {0, 1}) {
    TrainerConfig c = Config();
    c.max_bad_steps = max_bad;
    auto store = StoreSource::Open(c.store);
    ASSERT_TRUE(store.ok()) << store.status();
    auto trainer = Trainer::Create(
        c, std::make_unique<BreakingSource>(*std::move(store), 11, BreakingSource::Break::kNaN), 0,
        1, {});
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    absl::Status run = (*trainer)->RunSteps(6);  // the epoch, sample 11 included
    if (max_bad == 0) {
      ASSERT_FALSE(run.ok());
      EXPECT_NE(run.message().find("training step"), std::string::npos) << run;
      EXPECT_NE(run.message().find("training.max_bad_steps is 0"), std::string::npos) << run;
    } else {
      ASSERT_TRUE(run.ok()) << run;
      EXPECT_EQ((*trainer)->step(), 6);
    }
    EXPECT_TRUE(all_finite(**trainer)) << "max_bad_steps " << max_bad;
  }
}

}  // namespace
}  // namespace specstream::student
