// Online training end to end (issue 6): trainers fed live by real
// TeacherService servers on loopback, against offline training on a store
// dumped from the same tiny teacher. Teachers run in-process (TeacherServer)
// or as `specstream-teacher serve` processes where a test kills one.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/offline_store.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/student/grpc_teacher_connection.h"
#include "services/teacher/teacher_service.h"
#include "student/online_source.h"
#include "student/trainer.h"
#include "teacher/decode_target.h"
#include "teacher/dump.h"
#include "teacher/hf_runtime.h"
#include "tests/testing/loopback_channel.h"
#include "tests/testing/rank_threads.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"
#if SPECSTREAM_WITH_NCCL
#include "common/transport/nccl_util.h"
#include "tests/testing/nccl_peer.h"
#endif

extern char** environ;

namespace specstream::student {
namespace {

constexpr int kSamples = 24;
// data.regenerate: prompt ids kept of each sample, answer tokens, seed.
constexpr int kPromptTokens = 5;
constexpr int kAnswerTokens = 12;
constexpr uint64_t kAnswerSeed = 7;

class OnlineTest : public ::testing::Test {
 protected:
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
    specstream::testing::WriteTokenizedSamples(dir_->Join("data.jsonl"), kSamples, 11, 7, 256);
    auto runtime = Runtime();
    teacher::DumpOptions dump;
    dump.data = dir_->Join("data.jsonl");
    dump.out = dir_->Join("store");
    dump.store_dtype = "float32";
    dump.keep_target_ids = true;
    dump.batch_tokens = 1;  // one sequence per forward, as the servers below run them
    dump.progress_terminal = 0;
    auto summary = teacher::RunDump(*runtime, dump);
    ASSERT_TRUE(summary.ok()) << summary.status();
    // The layers two-layer block drafts read by default ([1, 5] of 8).
    teacher::HfRuntimeOptions block_options;
    block_options.model_dir = dir_->Join("target");
    block_options.dtype = "float32";
    block_options.capture_layer_ids = {1, 5};
    auto block_runtime = teacher::HfRuntime::Create(block_options);
    ASSERT_TRUE(block_runtime.ok()) << block_runtime.status();
    dump.out = dir_->Join("store-1-5");
    dump.keep_target_ids = false;
    summary = teacher::RunDump(**block_runtime, dump);
    ASSERT_TRUE(summary.ok()) << summary.status();
    WriteRegeneratedStores(*runtime);
  }
  static void TearDownTestSuite() { delete dir_; }

  // data.regenerate: prompts (each sample's first kPromptTokens ids) and the
  // stores `dump --regenerate` writes from them with this target, greedy
  // and sampled.
  static void WriteRegeneratedStores(teacher::HfRuntime& runtime) {
    std::ifstream in(dir_->Join("data.jsonl"));
    std::ofstream prompts(dir_->Join("prompts.jsonl"));
    for (std::string line; std::getline(in, line);) {
      std::vector<int32_t> ids = nlohmann::json::parse(line)["input_ids"];
      ids.resize(kPromptTokens);
      prompts << nlohmann::json{{"input_ids", ids}}.dump() << "\n";
    }
    prompts.close();
    for (double temperature : {0.0, 1.0}) {
      spec::DecodeOptions decode;
      decode.max_new_tokens = kAnswerTokens;
      decode.temperature = temperature;
      decode.seed = kAnswerSeed;
      decode.stop_ids = teacher::StopIds(runtime.config(), nullptr);
      teacher::TargetAnswers answers(runtime, decode);
      teacher::DumpOptions dump;
      dump.data = dir_->Join("prompts.jsonl");
      dump.out = RegeneratedStore(temperature);
      dump.store_dtype = "float32";
      dump.keep_target_ids = true;
      dump.batch_tokens = 1;
      dump.progress_terminal = 0;
      dump.answers = &answers;
      auto summary = teacher::RunDump(runtime, dump);
      ASSERT_TRUE(summary.ok()) << summary.status();
    }
  }
  static std::string RegeneratedStore(double temperature) {
    return dir_->Join(absl::StrCat("store-regenerated-t", temperature));
  }

  static std::unique_ptr<teacher::HfRuntime> Runtime() {
    teacher::HfRuntimeOptions options;
    options.model_dir = dir_->Join("target");
    options.dtype = "float32";
    auto runtime = teacher::HfRuntime::Create(options);
    EXPECT_TRUE(runtime.ok()) << runtime.status();
    return runtime.ok() ? std::move(*runtime) : nullptr;
  }

  // An in-process teacher serving float32 payloads with target_ids, one
  // sequence per forward (like the store's dump).
  struct Teacher {
    std::unique_ptr<teacher::HfRuntime> runtime;
    std::unique_ptr<services::TeacherServer> server;
  };
  // `nccl_device` >= 0 offers NCCL on that device; `test_channel` offers it
  // over an in-process channel instead (tests/testing/loopback_channel.h).
  static Teacher StartTeacher(std::function<void(int64_t, std::string&)> corrupt = nullptr,
                              int nccl_device = -1, PayloadChannelJoin test_channel = nullptr) {
    Teacher t;
    t.runtime = Runtime();
    services::TeacherServerOptions options;
    options.service.nccl_device = nccl_device;
    options.service.nccl_channel_for_testing = std::move(test_channel);
    options.service.payload_dtype = "float32";
    options.service.keep_target_ids = true;
    options.service.max_batch_tokens = 1;
    options.service.corrupt_payload_for_testing = std::move(corrupt);
    auto server = services::TeacherServer::Start(*t.runtime, options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) t.server = std::move(*server);
    return t;
  }

  static TrainerConfig Config() {
    TrainerConfig c;
    c.target_dir = dir_->Join("target");
    c.draft_vocab_size = 128;
    c.lr = 3e-3;
    c.max_steps = 12;
    c.batch_size = 4;
    c.ttt_steps = 3;
    c.seed = 5;
    c.dtype = torch::kFloat32;
    c.grad_clip = 1.0;
    c.progress_terminal = 0;
    c.log_every = 0;
    return c;
  }
  static TrainerConfig Offline() {
    TrainerConfig c = Config();
    c.store = dir_->Join("store");
    return c;
  }
  static TrainerConfig Online(const std::vector<std::string>& teachers,
                              const std::string& transport = "inline") {
    TrainerConfig c = Config();
    c.tokenized = dir_->Join("data.jsonl");
    c.teachers = teachers;
    c.teacher_connector = std::make_shared<services::GrpcTeacherConnector>();
    c.in_flight = 8;
    c.transport = transport;
    return c;
  }

  // Online on the prompts, the teachers writing the answers (data.regenerate).
  static TrainerConfig Regenerated(const std::vector<std::string>& teachers, double temperature) {
    TrainerConfig c = Online(teachers);
    c.tokenized = dir_->Join("prompts.jsonl");
    c.regenerate.on = true;
    c.regenerate.max_new_tokens = kAnswerTokens;
    c.regenerate.temperature = temperature;
    c.regenerate.seed = kAnswerSeed;
    return c;
  }
  // Offline on the store `dump --regenerate` wrote with the same settings.
  static TrainerConfig OfflineRegenerated(double temperature) {
    TrainerConfig c = Config();
    c.store = RegeneratedStore(temperature);
    return c;
  }

  // Config `c` trained 4 steps on two ranks (threads over one process
  // group); `ranks` gets both trainers.
  static absl::Status TrainTwoRanks(TrainerConfig c, std::vector<std::unique_ptr<Trainer>>& ranks) {
    c.max_steps = 4;
    ranks.resize(2);
    const absl::Status status = specstream::testing::RunOnRankHandles(
        2, [&](int rank, const ProcessGroupHandle& handle) -> absl::Status {
          auto trainer = Trainer::Create(c, rank, 2, handle.group, handle.store);
          if (!trainer.ok()) return trainer.status();
          absl::Status run = (*trainer)->RunSteps(4);
          ranks[rank] = std::move(*trainer);
          return run;
        });
    EXPECT_TRUE(status.ok()) << status;
    return status;
  }

  static void ExpectSameTraining(Trainer& a, Trainer& b) {
    ASSERT_EQ(a.history().size(), b.history().size());
    for (size_t i = 0; i < a.history().size(); ++i) {
      EXPECT_EQ(a.history()[i].loss, b.history()[i].loss) << "step " << i + 1;
      EXPECT_EQ(a.history()[i].acc_k, b.history()[i].acc_k) << "step " << i + 1;
    }
    ASSERT_EQ(a.parameters().size(), b.parameters().size());
    for (size_t i = 0; i < a.parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(a.parameters()[i].second, b.parameters()[i].second))
          << a.parameters()[i].first;
    }
  }

  // After a run of `online` (config `c`, one epoch, 6 steps) through a
  // teacher fault: its ledger shows every sample trained exactly once, and
  // it trained exactly as an uninterrupted offline run (bitwise).
  void ExpectEverySampleOnceAndLikeOffline(const TrainerConfig& c, Trainer& online,
                                           TrainerConfig o = Offline()) {
    std::map<int64_t, int> trained;
    std::ifstream ledger(c.ledger_dir + "/ledger-rank0.jsonl");
    int steps = 0;
    for (std::string line; std::getline(ledger, line);) {
      ++steps;
      const nlohmann::json record = nlohmann::json::parse(line);
      for (int64_t id : record["sample_ids"]) ++trained[id];
    }
    EXPECT_EQ(steps, 6);
    EXPECT_EQ(static_cast<int>(trained.size()), kSamples);
    for (const auto& [id, count] : trained) EXPECT_EQ(count, 1) << "sample " << id;

    o.max_steps = 0;
    o.epochs = 1;
    auto offline = Trainer::Create(o, 0, 1, {});
    ASSERT_TRUE(offline.ok());
    ASSERT_TRUE((*offline)->Run().ok());
    ExpectSameTraining(online, **offline);
  }

  static specstream::testing::TempDir* dir_;
};

specstream::testing::TempDir* OnlineTest::dir_ = nullptr;

// The same data and seed online (inline and shared-memory payloads) and
// offline: the same loss curve, bit for bit (fp32 on CPU), and the same
// weights.
TEST_F(OnlineTest, OnlineAndOfflineTrainTheSameBitwise) {
  auto offline = Trainer::Create(Offline(), 0, 1, {});
  ASSERT_TRUE(offline.ok()) << offline.status();
  ASSERT_TRUE((*offline)->RunSteps(12).ok());
  for (const char* transport : {"inline", "shm"}) {
    Teacher teacher = StartTeacher();
    ASSERT_NE(teacher.server, nullptr);
    auto online = Trainer::Create(Online({teacher.server->address()}, transport), 0, 1, {});
    ASSERT_TRUE(online.ok()) << online.status();
    ASSERT_TRUE((*online)->RunSteps(12).ok());
    ExpectSameTraining(**online, **offline);
    // Rings are unlinked once the teacher has attached (P13 item 13): the
    // live trainer has none left in /dev/shm.
    const std::string prefix = "specstream-" + std::to_string(getpid()) + "-";
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      EXPECT_NE(entry.path().filename().string().rfind(prefix, 0), 0u)
          << transport << ": " << entry.path();
    }
    std::cout << transport << ": online == offline over 12 steps; final loss "
              << (*online)->history().back().loss << "\n";
  }
}

// EAGLE 3.1's flags and P-EAGLE (whose COD plans are keyed by sample and
// step) change nothing in the stream: online trains exactly as offline.
TEST_F(OnlineTest, Eagle31AndPeagleOnlineAndOfflineTrainTheSameBitwise) {
  auto eagle31 = [](TrainerConfig c) {
    c.eagle3 = {true, true, false};
    return c;
  };
  auto peagle = [](TrainerConfig c) {
    c.draft_type = "peagle";
    c.eagle3.parallel_drafting = true;
    c.mask_token_id = 255;
    c.ttt_steps = 4;
    return c;
  };
  for (bool parallel : {false, true}) {
    SCOPED_TRACE(parallel ? "peagle" : "eagle 3.1");
    auto with = [&](TrainerConfig c) { return parallel ? peagle(c) : eagle31(c); };
    auto offline = Trainer::Create(with(Offline()), 0, 1, {});
    ASSERT_TRUE(offline.ok()) << offline.status();
    ASSERT_TRUE((*offline)->RunSteps(8).ok());
    Teacher teacher = StartTeacher();
    ASSERT_NE(teacher.server, nullptr);
    auto online = Trainer::Create(with(Online({teacher.server->address()}, "inline")), 0, 1, {});
    ASSERT_TRUE(online.ok()) << online.status();
    ASSERT_TRUE((*online)->RunSteps(8).ok());
    ExpectSameTraining(**online, **offline);
    // The three fc_norm weights; P-EAGLE's mask_hidden.
    EXPECT_EQ((*online)->draft().parameters().size(), parallel ? 14u : 16u);
  }
}

// P-EAGLE under CP 2 online: each rank streams its shard's rows plus the
// TTT halo, plans COD on the whole loss mask, and trains exactly as the
// offline CP run.
TEST_F(OnlineTest, PeagleUnderContextParallelismOnlineEqualsOffline) {
  Teacher teacher = StartTeacher();
  ASSERT_NE(teacher.server, nullptr);
  std::vector<std::unique_ptr<Trainer>> offline(2), online(2);
  for (bool use_teacher : {false, true}) {
    auto& ranks = use_teacher ? online : offline;
    TrainerConfig c = use_teacher ? Online({teacher.server->address()}) : Offline();
    c.draft_type = "peagle";
    c.eagle3.parallel_drafting = true;
    c.mask_token_id = 255;
    c.ttt_steps = 4;
    c.cp_size = 2;
    ASSERT_TRUE(TrainTwoRanks(c, ranks).ok());
  }
  ExpectSameTraining(*online[0], *offline[0]);
  ExpectSameTraining(*online[1], *offline[1]);
}

// Block drafts online ask the teacher (which captures EAGLE-3's layers by
// default) for the layers they read, per stream, and train exactly as from
// a store dumped with those layers: loss, per-slot acc and weights, bit for
// bit.
TEST_F(OnlineTest, BlockDraftsOnlineAndOfflineTrainTheSameBitwise) {
  for (const char* type : {"dflash", "dspark"}) {
    auto block = [&](TrainerConfig c) {
      c.draft_type = type;
      c.block.num_layers = 2;
      c.block.block_size = 4;
      c.block.num_anchors = 6;
      c.block.markov_rank = 8;
      c.mask_token_id = 255;
      return c;
    };
    TrainerConfig offline_config = block(Offline());
    offline_config.store = dir_->Join("store-1-5");
    auto offline = Trainer::Create(offline_config, 0, 1, {});
    ASSERT_TRUE(offline.ok()) << offline.status();
    ASSERT_TRUE((*offline)->RunSteps(12).ok());
    Teacher teacher = StartTeacher();
    ASSERT_NE(teacher.server, nullptr);
    auto online = Trainer::Create(block(Online({teacher.server->address()}, "shm")), 0, 1, {});
    ASSERT_TRUE(online.ok()) << online.status();
    EXPECT_EQ((*online)->source().model().capture_layer_ids, (std::vector<int>{1, 5}));
    ASSERT_TRUE((*online)->RunSteps(12).ok());
    ExpectSameTraining(**online, **offline);
    ASSERT_TRUE((*online)->history().back().tau.has_value());
    EXPECT_EQ(*(*online)->history().back().tau, *(*offline)->history().back().tau);
    std::cout << type << ": online == offline over 12 steps; final loss "
              << (*online)->history().back().loss << ", tau " << *(*online)->history().back().tau
              << "\n";
  }
}

// A DSpark draft under CP 2 online: each rank streams only its shard's rows
// of the layers the draft reads (no halo: the context and teacher states
// are gathered over the CP group) and trains exactly as the offline CP run.
TEST_F(OnlineTest, BlockDraftUnderContextParallelismOnlineEqualsOffline) {
  Teacher teacher = StartTeacher();
  ASSERT_NE(teacher.server, nullptr);
  std::vector<std::unique_ptr<Trainer>> offline(2), online(2);
  for (bool use_teacher : {false, true}) {
    auto& ranks = use_teacher ? online : offline;
    TrainerConfig c = use_teacher ? Online({teacher.server->address()}) : Offline();
    if (!use_teacher) c.store = dir_->Join("store-1-5");
    c.draft_type = "dspark";
    c.block.num_layers = 2;
    c.block.block_size = 4;
    c.block.num_anchors = 6;
    c.block.markov_rank = 8;
    c.mask_token_id = 255;
    c.cp_size = 2;
    ASSERT_TRUE(TrainTwoRanks(c, ranks).ok());
  }
  ExpectSameTraining(*online[0], *offline[0]);
  ExpectSameTraining(*online[1], *offline[1]);
}

// Context parallelism online: each CP rank receives only its slice (plus
// the TTT halo) and trains exactly as from the store.
TEST_F(OnlineTest, ContextParallelRanksReceiveTheirSlices) {
  Teacher teacher = StartTeacher();
  ASSERT_NE(teacher.server, nullptr);
  std::vector<std::unique_ptr<Trainer>> offline(2), online(2);
  for (bool use_teacher : {false, true}) {
    auto& ranks = use_teacher ? online : offline;
    TrainerConfig c = use_teacher ? Online({teacher.server->address()}) : Offline();
    c.cp_size = 2;
    ASSERT_TRUE(TrainTwoRanks(c, ranks).ok());
  }
  ExpectSameTraining(*online[0], *offline[0]);
  // Slices: a rank's source hands back rows [begin, end + halo) only.
  OnlineSourceOptions options;
  options.data = dir_->Join("data.jsonl");
  options.teachers = {teacher.server->address()};
  options.connector = std::make_shared<services::GrpcTeacherConnector>();
  auto source = OnlineSource::Open(options);
  ASSERT_TRUE(source.ok()) << source.status();
  const int64_t length = (*source)->Length(3);  // 13 tokens
  auto slice = (*source)->GetRows(3, RowRange{4, 8, 11});
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->offset, 4);
  EXPECT_EQ(slice->length, length);
  EXPECT_EQ(slice->aux_hidden.size(0), 4);
  EXPECT_EQ(slice->input_ids.size(0), 7);
  EXPECT_EQ(slice->last_hidden.size(0), 7);
  auto whole = (*source)->Get(3);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(torch::equal(slice->aux_hidden, whole->aux_hidden.narrow(0, 4, 4)));
  EXPECT_TRUE(torch::equal(slice->last_hidden, whole->last_hidden.narrow(0, 4, 7)));
  // A slice reaching past the end is clipped to the sample.
  auto tail = (*source)->GetRows(3, RowRange{8, 16, 19});
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->aux_hidden.size(0), length - 8);
  EXPECT_TRUE(torch::equal(tail->input_ids, whole->input_ids.narrow(0, 8, length - 8)));
}

// data.regenerate (P19): the students send prompts, the teachers write the
// answers, and training equals training on the store `dump --regenerate`
// wrote, bit for bit, greedy and sampled. The prompts alternate between
// the two teachers, each decoding its half once; each sample is its prompt
// (no loss) and its answer (loss).
TEST_F(OnlineTest, RegeneratedOnlineTrainsLikeADumpRegeneratedStore) {
  for (double temperature : {0.0, 1.0}) {
    Teacher a = StartTeacher(), b = StartTeacher();
    ASSERT_TRUE(a.server != nullptr && b.server != nullptr);
    TrainerConfig c = Regenerated({a.server->address(), b.server->address()}, temperature);
    c.max_steps = 0;
    c.epochs = 1;
    auto online = Trainer::Create(c, 0, 1, {});
    ASSERT_TRUE(online.ok()) << online.status();
    auto* source = dynamic_cast<OnlineSource*>(&(*online)->source());
    ASSERT_NE(source, nullptr);
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    ASSERT_TRUE(source->TokenIds(0, &ids, &mask).ok());
    ASSERT_EQ(ids.size(), static_cast<size_t>(kPromptTokens + kAnswerTokens));
    EXPECT_EQ(std::vector<uint8_t>(mask.begin(), mask.begin() + kPromptTokens),
              std::vector<uint8_t>(kPromptTokens, 0));
    EXPECT_EQ(std::vector<uint8_t>(mask.begin() + kPromptTokens, mask.end()),
              std::vector<uint8_t>(kAnswerTokens, 1));
    ASSERT_TRUE((*online)->Run().ok());
    TrainerConfig o = OfflineRegenerated(temperature);
    o.max_steps = 0;
    o.epochs = 1;
    auto offline = Trainer::Create(o, 0, 1, {});
    ASSERT_TRUE(offline.ok()) << offline.status();
    ASSERT_TRUE((*offline)->Run().ok());
    ExpectSameTraining(**online, **offline);
    EXPECT_EQ(a.server->core().stats().answers_decoded, kSamples / 2);
    EXPECT_EQ(b.server->core().stats().answers_decoded, kSamples / 2);
    std::cout << "temperature " << temperature << ": online regeneration == dump --regenerate over "
              << (*online)->step() << " steps; final loss " << (*online)->history().back().loss
              << "\n";
  }
}

// data.regenerate under CP 2: both ranks ask the teacher for every answer,
// which decodes each once (the other rank's request waits for it or finds
// it kept); each rank then streams its slices and trains exactly as the
// offline CP run on the regenerated store.
TEST_F(OnlineTest, RegeneratedUnderContextParallelismDecodesEachAnswerOnce) {
  Teacher teacher = StartTeacher();
  ASSERT_NE(teacher.server, nullptr);
  std::vector<std::unique_ptr<Trainer>> offline(2), online(2);
  for (bool use_teacher : {false, true}) {
    auto& ranks = use_teacher ? online : offline;
    TrainerConfig c =
        use_teacher ? Regenerated({teacher.server->address()}, 0) : OfflineRegenerated(0);
    c.cp_size = 2;
    ASSERT_TRUE(TrainTwoRanks(c, ranks).ok());
  }
  ExpectSameTraining(*online[0], *offline[0]);
  ExpectSameTraining(*online[1], *offline[1]);
  const teacher::TeacherCore::Stats stats = teacher.server->core().stats();
  EXPECT_EQ(stats.answers_decoded, kSamples);
  EXPECT_EQ(stats.answers_reused, kSamples);
}

// P14 item 2 over gRPC: a source naming its capture layers sends them in
// Open (inline and shared-memory streams alike) and gets, per sample, what a
// runtime capturing exactly those layers computes, bit for bit; model()
// reports them. A set the target cannot have is refused before any stream.
TEST_F(OnlineTest, SourceGetsTheCaptureLayersItAsksFor) {
  Teacher teacher = StartTeacher();
  ASSERT_NE(teacher.server, nullptr);
  teacher::HfRuntimeOptions runtime_options;
  runtime_options.model_dir = dir_->Join("target");
  runtime_options.dtype = "float32";
  runtime_options.capture_layer_ids = {2, 5};
  auto reference = teacher::HfRuntime::Create(runtime_options);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const std::string transport : {"inline", "shm"}) {
    OnlineSourceOptions options;
    options.data = dir_->Join("data.jsonl");
    options.teachers = {teacher.server->address()};
    options.connector = std::make_shared<services::GrpcTeacherConnector>();
    options.stream.transport = transport;
    options.capture_layer_ids = {2, 5};
    auto source = OnlineSource::Open(options);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_EQ((*source)->model().capture_layer_ids, (std::vector<int>{2, 5}));
    for (int64_t i : {0, 3, 7}) {
      auto sample = (*source)->Get(i);
      ASSERT_TRUE(sample.ok()) << sample.status();
      std::vector<int32_t> ids;
      std::vector<uint8_t> mask;
      ASSERT_TRUE((*source)->TokenIds(i, &ids, &mask).ok());
      teacher::ForwardRequest request;
      request.sequences = {ids};
      auto expected = (*reference)->Forward(request);
      ASSERT_TRUE(expected.ok()) << expected.status();
      EXPECT_EQ(sample->aux_hidden.sizes().vec(),
                (std::vector<int64_t>{static_cast<int64_t>(ids.size()), 2 * 32}));
      EXPECT_TRUE(torch::equal(sample->aux_hidden, (*expected)[0].aux_hidden))
          << transport << " sample " << i;
      EXPECT_TRUE(torch::equal(sample->last_hidden, (*expected)[0].last_hidden))
          << transport << " sample " << i;
    }
  }
  OnlineSourceOptions options;
  options.data = dir_->Join("data.jsonl");
  options.teachers = {teacher.server->address()};
  options.connector = std::make_shared<services::GrpcTeacherConnector>();
  options.capture_layer_ids = {5, 2};
  auto refused = OnlineSource::Open(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("capture_layer_ids[1]: 2 follows 5"), std::string::npos)
      << refused.status();
}

// A payload corrupted on the wire fails its checksum (DATA_LOSS), is fetched
// again, and training is unaffected.
TEST_F(OnlineTest, CorruptedPayloadIsDetectedAndRefetched) {
  std::atomic<int> corrupted{0};
  Teacher teacher = StartTeacher([&](int64_t sample_id, std::string& payload) {
    if (sample_id == 5 && corrupted.fetch_add(1) == 0) payload[payload.size() / 2] ^= 0x5a;
  });
  ASSERT_NE(teacher.server, nullptr);
  TrainerConfig c = Online({teacher.server->address()});
  c.max_steps = 6;  // one epoch: every sample once
  auto online = Trainer::Create(c, 0, 1, {});
  ASSERT_TRUE(online.ok()) << online.status();
  ASSERT_TRUE((*online)->RunSteps(6).ok());
  EXPECT_EQ(corrupted.load(), 2);  // the bad copy and the good one
  TrainerConfig o = Offline();
  o.max_steps = 6;
  auto offline = Trainer::Create(o, 0, 1, {});
  ASSERT_TRUE(offline.ok());
  ASSERT_TRUE((*offline)->RunSteps(6).ok());
  ExpectSameTraining(**online, **offline);
}

// A student that insists on NCCL with a teacher that cannot serve it is
// refused at Create, naming data.transport and why; "auto" takes what the
// pair shares.
TEST_F(OnlineTest, NcclWithoutADeviceIsRefusedNamingTheField) {
  Teacher teacher = StartTeacher();
  ASSERT_NE(teacher.server, nullptr);
  auto nccl = Trainer::Create(Online({teacher.server->address()}, "nccl"), 0, 1, {});
  ASSERT_FALSE(nccl.ok());
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kFailedPrecondition) << nccl.status();
  EXPECT_NE(nccl.status().message().find("data.transport nccl: "), std::string::npos)
      << nccl.status();
#if SPECSTREAM_WITH_NCCL
  EXPECT_NE(nccl.status().message().find("does not offer NCCL"), std::string::npos)
      << nccl.status();
#else
  EXPECT_NE(nccl.status().message().find("built without NCCL"), std::string::npos) << nccl.status();
#endif
  auto bogus = Trainer::Create(Online({teacher.server->address()}, "rdma"), 0, 1, {});
  ASSERT_FALSE(bogus.ok());
  EXPECT_NE(bogus.status().message().find("is not auto, inline, shm or nccl"), std::string::npos)
      << bogus.status();
}

// The TRANSPORT_NCCL stream protocol on any machine, over the in-process
// test channel instead of NCCL: the teacher answers Opened only after both
// ranks joined, headers come on the stream and payloads out of band, and
// online training equals offline bit for bit. A payload corrupted before the
// send fails its CRC32C on the student and is fetched again.
TEST_F(OnlineTest, NcclStreamProtocolTrainsLikeOfflineOverATestChannel) {
  auto offline = Trainer::Create(Offline(), 0, 1, {});
  ASSERT_TRUE(offline.ok()) << offline.status();
  ASSERT_TRUE((*offline)->RunSteps(12).ok());
  const PayloadChannelFactory channel = specstream::testing::LoopbackChannelFactory();
  std::atomic<int> corrupted{0};
  Teacher teacher = StartTeacher(
      [&](int64_t sample_id, std::string& payload) {
        if (sample_id == 5 && corrupted.fetch_add(1) == 0) payload[payload.size() / 2] ^= 0x5a;
      },
      /*nccl_device=*/-1, channel.join);
  ASSERT_NE(teacher.server, nullptr);
  TrainerConfig c = Online({teacher.server->address()}, "nccl");
  c.nccl_channel_for_testing = channel;
  auto online = Trainer::Create(c, 0, 1, {});
  ASSERT_TRUE(online.ok()) << online.status();
  ASSERT_TRUE((*online)->RunSteps(12).ok());
  ExpectSameTraining(**online, **offline);
  EXPECT_GE(corrupted.load(), 2);  // the bad copy and at least one good one
  auto* source = dynamic_cast<OnlineSource*>(&(*online)->source());
  ASSERT_NE(source, nullptr);
  EXPECT_GE(source->refetches(), 1);
  std::cout << "nccl protocol (test channel): online == offline over 12 steps, "
            << source->refetches() << " refetch(es)\n";
}

// A channel that breaks mid-payload ends that teacher's stream; its samples
// fail over to the other teacher and training is unaffected.
TEST_F(OnlineTest, BrokenNcclChannelFailsOverToTheOtherTeacher) {
  TrainerConfig o = Offline();
  o.max_steps = 6;
  auto offline = Trainer::Create(o, 0, 1, {});
  ASSERT_TRUE(offline.ok()) << offline.status();
  ASSERT_TRUE((*offline)->RunSteps(6).ok());
  auto faults = std::make_shared<specstream::testing::LoopbackFaults>();
  faults->break_after_pieces = 5;  // a few samples in, mid-payload
  const PayloadChannelFactory breaking = specstream::testing::LoopbackChannelFactory(faults);
  const PayloadChannelFactory healthy = specstream::testing::LoopbackChannelFactory();
  Teacher a = StartTeacher(nullptr, -1, breaking.join);
  Teacher b = StartTeacher(nullptr, -1, healthy.join);
  ASSERT_NE(a.server, nullptr);
  ASSERT_NE(b.server, nullptr);
  TrainerConfig c = Online({a.server->address(), b.server->address()}, "nccl");
  c.max_steps = 6;                       // one epoch
  c.nccl_channel_for_testing = healthy;  // the student's side never breaks by itself
  c.ledger_dir = dir_->Join("ledger-nccl-failover");
  auto online = Trainer::Create(c, 0, 1, {});
  ASSERT_TRUE(online.ok()) << online.status();
  ASSERT_TRUE((*online)->RunSteps(6).ok());
  ExpectSameTraining(**online, **offline);
  auto* source = dynamic_cast<OnlineSource*>(&(*online)->source());
  ASSERT_NE(source, nullptr);
  EXPECT_GE(source->refetches(), 1);
  EXPECT_GT(faults->pieces_sent.load(), 5);
  // Every sample of the epoch trained exactly once.
  std::map<int64_t, int> trained;
  std::ifstream ledger(c.ledger_dir + "/ledger-rank0.jsonl");
  for (std::string line; std::getline(ledger, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    for (int64_t id : record["sample_ids"]) ++trained[id];
  }
  EXPECT_EQ(trained.size(), static_cast<size_t>(kSamples));
  for (const auto& [id, count] : trained) EXPECT_EQ(count, 1) << "sample " << id;
}

// Eight students stream every sample from one teacher at once; each gets
// the stored bytes.
TEST_F(OnlineTest, EightConcurrentStudentsAllFinish) {
  Teacher teacher = StartTeacher();
  ASSERT_NE(teacher.server, nullptr);
  auto reader = StoreReader::Open(dir_->Join("store"));
  ASSERT_TRUE(reader.ok());
  std::vector<absl::Status> results(8);
  std::vector<std::thread> students;
  for (int s = 0; s < 8; ++s) {
    students.emplace_back([&, s] {
      OnlineSourceOptions options;
      options.data = dir_->Join("data.jsonl");
      options.teachers = {teacher.server->address()};
      options.connector = std::make_shared<services::GrpcTeacherConnector>();
      options.rank = s;
      options.in_flight = 2;
      auto source = OnlineSource::Open(options);
      if (!source.ok()) {
        results[s] = source.status();
        return;
      }
      std::vector<int64_t> all;
      for (int64_t i = 0; i < kSamples; ++i) all.push_back(i);
      for (int64_t i = 0; i < kSamples; ++i) {
        (*source)->Prefetch({i}, RowRange{0, 1 << 30, 1 << 30});
        auto sample = (*source)->Get(i);
        if (!sample.ok()) {
          results[s] = sample.status();
          return;
        }
        auto views = (*reader)->Get((*reader)->sample_ids()[i]);
        for (const TensorView& v : *views) {
          if (v.name != "aux_hidden") continue;
          if (std::memcmp(v.data, sample->aux_hidden.data_ptr(), v.nbytes) != 0) {
            results[s] = absl::DataLossError(absl::StrCat("student ", s, " sample ", i));
            return;
          }
        }
        results[s] = (*source)->Commit(i + 1, {i});  // returns the credit
        if (!results[s].ok()) return;
      }
    });
  }
  for (auto& t : students) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

// ---------------------------------------------------------------------------
// Teachers as processes: one is killed with SIGKILL mid-epoch.

// Starts `args` (argv[0] a path) with this environment, its stderr written
// to `log` when given.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log = "") {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// `specstream-teacher serve` of the target in `target` as the in-process
// teachers serve it (float32 payloads with target_ids, one sequence per
// forward), on `port`, writing `port_file`: `global` flags before "serve",
// `extra` ones last.
std::vector<std::string> ServeCommand(const std::string& target, const std::string& port,
                                      const std::string& port_file,
                                      const std::vector<std::string>& extra = {},
                                      const std::vector<std::string>& global = {}) {
  std::vector<std::string> args = {SPECSTREAM_TEACHER_PATH};
  args.insert(args.end(), global.begin(), global.end());
  for (absl::string_view flag :
       absl::StrSplit("serve --runtime hf --devices cpu --dtype float32 --payload-dtype float32 "
                      "--keep-target-ids --batch-tokens 1",
                      ' ')) {
    args.emplace_back(flag);
  }
  for (const char* flag :
       {"--model", target.c_str(), "--port", port.c_str(), "--port-file", port_file.c_str()}) {
    args.push_back(flag);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string WaitForPortFile(const std::string& path) {
  const int port = testing::WaitForPortFile(path);
  return port > 0 ? "127.0.0.1:" + std::to_string(port) : "";
}

TEST_F(OnlineTest, KilledTeacherMidEpochEverySampleTrainedExactlyOnce) {
  std::vector<pid_t> pids;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    const std::string port_file = dir_->Join(absl::StrCat("teacher-", i, ".port"));
    std::filesystem::remove(port_file);
    pids.push_back(Spawn(ServeCommand(dir_->Join("target"), "0", port_file)));
    addresses.push_back(WaitForPortFile(port_file));
    ASSERT_FALSE(addresses.back().empty()) << "teacher " << i << " did not start";
  }
  TrainerConfig c = Online(addresses);
  c.max_steps = 0;
  c.epochs = 1;  // 6 steps of 4
  c.in_flight = 4;
  c.ledger_dir = dir_->Join("ledger");
  std::filesystem::remove_all(c.ledger_dir);
  auto online = Trainer::Create(c, 0, 1, {});
  ASSERT_TRUE(online.ok()) << online.status();
  ASSERT_TRUE((*online)->RunSteps(2).ok());
  // Teacher 0 freezes (its requests stay unanswered), then dies with SIGKILL
  // while the trainer waits: those samples must come from teacher 1.
  ASSERT_EQ(kill(pids[0], SIGSTOP), 0);
  std::thread killer([&] {
    // Not a wait: teacher 0 stays frozen for 1.5 s before it dies.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    kill(pids[0], SIGKILL);
  });
  const absl::Status run = (*online)->Run();
  killer.join();
  int status = 0;
  waitpid(pids[0], &status, 0);
  ASSERT_TRUE(run.ok()) << run;
  EXPECT_EQ((*online)->step(), 6);
  auto* source = dynamic_cast<OnlineSource*>(&(*online)->source());
  ASSERT_NE(source, nullptr);
  EXPECT_GT(source->refetches(), 0);
  std::cout << "samples re-requested after the kill: " << source->refetches() << "\n";

  // Every sample exactly once, and the failover changed nothing.
  ExpectEverySampleOnceAndLikeOffline(c, **online);

  kill(pids[1], SIGTERM);
  waitpid(pids[1], &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// P13 item 8: the only teacher dies with SIGKILL mid-run, requests
// unanswered, and a new one starts on its port half a second later (a crash
// and restart, a rolling update): the trainer waits within
// data.teacher_grace_s, requests the lost samples again from the new
// teacher, and trains exactly as uninterrupted.
TEST_F(OnlineTest, OnlyTeacherKilledAndRestartedOnItsPortTrainsAsIfUninterrupted) {
  const std::string port_file = dir_->Join("teacher-restarted.port");
  auto serve = [&](const std::string& port) {
    std::filesystem::remove(port_file);
    return Spawn(ServeCommand(dir_->Join("target"), port, port_file));
  };
  pid_t pid = serve("0");
  const std::string address = WaitForPortFile(port_file);
  ASSERT_FALSE(address.empty()) << "the teacher did not start";
  const std::string port = address.substr(address.rfind(':') + 1);

  TrainerConfig c = Online({address});
  c.max_steps = 0;
  c.epochs = 1;  // 6 steps of 4
  c.in_flight = 4;
  c.teacher_grace = absl::Seconds(60);
  c.ledger_dir = dir_->Join("ledger-restarted");
  std::filesystem::remove_all(c.ledger_dir);
  auto online = Trainer::Create(c, 0, 1, {});
  ASSERT_TRUE(online.ok()) << online.status();
  ASSERT_TRUE((*online)->RunSteps(2).ok());
  // The teacher freezes (what the trainer asks next stays unanswered), dies
  // with SIGKILL, and is back on its port 0.5 s later.
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  int status = 0;
  std::string restarted_address;
  std::thread restarter([&] {
    // Not waits: the teacher stays frozen 0.5 s, then down 0.5 s.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    pid = serve(port);
    restarted_address = WaitForPortFile(port_file);
  });
  const absl::Status run = (*online)->Run();
  restarter.join();
  ASSERT_EQ(restarted_address, address) << "the teacher did not come back on its port";
  ASSERT_TRUE(run.ok()) << run;
  EXPECT_EQ((*online)->step(), 6);
  auto* source = dynamic_cast<OnlineSource*>(&(*online)->source());
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->reconnects(), 1);
  EXPECT_GT(source->refetches(), 0);  // the frozen teacher's samples
  std::cout << "samples re-requested from the restarted teacher: " << source->refetches() << "\n";

  // Every sample exactly once, and the same weights as an uninterrupted run.
  ExpectEverySampleOnceAndLikeOffline(c, **online);

  kill(pid, SIGTERM);
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// data.regenerate through a teacher crash (P19): teacher 0 freezes right
// after its first answer, with the next one asked and unanswered, and dies
// with SIGKILL. Its prompts go to teacher 1, which gives the same answers
// (sampled with seed + id), so every sample trains exactly once and the run
// equals training on the store `dump --regenerate` wrote.
TEST_F(OnlineTest, TeacherKilledMidAnswerItsPromptsGoToTheOtherAndEverySampleTrainsOnce) {
  std::vector<pid_t> pids;
  std::vector<std::string> addresses;
  const std::string log = dir_->Join("answering-teacher-0.log");
  for (int i = 0; i < 2; ++i) {
    const std::string port_file = dir_->Join(absl::StrCat("answering-teacher-", i, ".port"));
    std::filesystem::remove(port_file);
    pids.push_back(
        Spawn(ServeCommand(dir_->Join("target"), "0", port_file, {}, {"--log-level", "debug"}),
              i == 0 ? log : dir_->Join("answering-teacher-1.log")));
    addresses.push_back(WaitForPortFile(port_file));
    ASSERT_FALSE(addresses.back().empty()) << "teacher " << i << " did not start";
  }
  TrainerConfig c = Regenerated(addresses, 1.0);
  c.max_steps = 0;
  c.epochs = 1;  // 6 steps of 4
  c.in_flight = 4;
  c.ledger_dir = dir_->Join("ledger-regenerated");
  std::filesystem::remove_all(c.ledger_dir);
  std::atomic<bool> frozen{false};
  std::thread killer([&] {
    // Waits (polling its log) for teacher 0's first answer, freezes it,
    // and kills it 1 s later.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log);
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      if (text.find("answered sample") != std::string::npos) {
        kill(pids[0], SIGSTOP);
        frozen = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));  // not a wait: frozen 1 s
    kill(pids[0], SIGKILL);
  });
  auto online = Trainer::Create(c, 0, 1, {});  // the answers come here
  killer.join();
  int status = 0;
  waitpid(pids[0], &status, 0);
  ASSERT_TRUE(frozen) << "teacher 0 never answered";
  ASSERT_TRUE(online.ok()) << online.status();
  auto* source = dynamic_cast<OnlineSource*>(&(*online)->source());
  ASSERT_NE(source, nullptr);
  EXPECT_GT(source->answers_retried(), 0);
  std::cout << "prompts asked again of teacher 1 after the kill: " << source->answers_retried()
            << "\n";
  ASSERT_TRUE((*online)->Run().ok());
  EXPECT_EQ((*online)->step(), 6);
  ExpectEverySampleOnceAndLikeOffline(c, **online, OfflineRegenerated(1.0));

  kill(pids[1], SIGTERM);
  waitpid(pids[1], &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
// Payloads over real NCCL (GPU builds with a CUDA device): a `specstream-
// teacher serve --nccl-device` process and this student train exactly as
// from the store. Each side is its own process and claims its own NCCL host
// (NCCL_HOSTID), so one device serves both ranks (NCCL before 2.30 refuses
// two ranks of one communicator on one device within a host); with two
// devices the teacher takes the last. Skips without a device.
TEST_F(OnlineTest, NcclPayloadsFromATeacherProcessTrainLikeOffline) {
#if !SPECSTREAM_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  const int devices = CudaDeviceCount();
  if (devices == 0) GTEST_SKIP() << "no CUDA device";
  // The spawned teacher inherits this environment; then this process takes
  // its own before its first NCCL call.
  specstream::testing::ApplyEnv(
      specstream::testing::NcclPeerEnv(devices, "specstream-online-test-teacher"));
  const std::string port_file = dir_->Join("teacher-nccl.port");
  std::filesystem::remove(port_file);
  const pid_t pid = Spawn(ServeCommand(dir_->Join("target"), "0", port_file,
                                       {"--nccl-device", std::to_string(devices - 1)}));
  specstream::testing::ApplyEnv(
      specstream::testing::NcclPeerEnv(devices, "specstream-online-test-student"));
  const std::string address = WaitForPortFile(port_file);
  ASSERT_FALSE(address.empty()) << "the teacher did not start";
  auto offline = Trainer::Create(Offline(), 0, 1, {});
  ASSERT_TRUE(offline.ok()) << offline.status();
  ASSERT_TRUE((*offline)->RunSteps(12).ok());
  auto online = Trainer::Create(Online({address}, "nccl"), 0, 1, {});
  ASSERT_TRUE(online.ok()) << online.status();
  ASSERT_TRUE((*online)->RunSteps(12).ok());
  ExpectSameTraining(**online, **offline);
  online->reset();
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
#endif
}

}  // namespace specstream::student
