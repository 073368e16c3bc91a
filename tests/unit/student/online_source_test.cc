// The online source's own logic with no server (tests/testing/
// fake_teacher_connection.h): which teacher serves a sample, failover after
// a lost teacher or a bad payload, final errors, credits, acknowledgements,
// the ledger, CP slices, and refusals at Open. The gRPC connection under it
// is tested end to end by tests/integration/online_test.cc.
#include "student/online_source.h"

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_env.h"
#include "tests/testing/fake_teacher_connection.h"
#include "tests/testing/testing.h"

namespace specstream::student {
namespace {

using testing::FakeTeacherConnector;

constexpr int kSamples = 8;

class OnlineSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Sample i: 6 + i tokens, ids (7 i + t) % 64; the first two are prompt.
    std::ofstream out(dir_.Join("data.jsonl"));
    for (int i = 0; i < kSamples; ++i) {
      std::vector<int> ids;
      std::vector<int> mask;
      for (int t = 0; t < 6 + i; ++t) {
        ids.push_back((7 * i + t) % 64);
        mask.push_back(t >= 2 ? 1 : 0);
      }
      ids_.push_back(std::vector<int32_t>(ids.begin(), ids.end()));
      out << nlohmann::json{{"input_ids", ids}, {"loss_mask", mask}}.dump() << "\n";
    }
  }

  OnlineSourceOptions Options(std::shared_ptr<FakeTeacherConnector> connector,
                              std::vector<std::string> teachers) {
    OnlineSourceOptions options;
    options.data = dir_.Join("data.jsonl");
    options.teachers = std::move(teachers);
    options.connector = std::move(connector);
    options.stream.sample_timeout = absl::Seconds(30);
    return options;
  }

  // The sample's tensors are the fake target's captures of its ids.
  void ExpectTeacherTensors(FakeTeacherConnector& connector, const TrainingSample& sample) {
    const std::vector<int32_t>& ids = ids_[sample.id];
    torch::Tensor aux = connector.runtime("a").ExpectedAux(ids);
    torch::Tensor last = connector.runtime("a").ExpectedLast(ids);
    EXPECT_EQ(sample.length, static_cast<int64_t>(ids.size()));
    EXPECT_TRUE(torch::equal(sample.aux_hidden, aux)) << "sample " << sample.id;
    EXPECT_TRUE(torch::equal(sample.last_hidden, last)) << "sample " << sample.id;
    EXPECT_TRUE(
        torch::equal(sample.input_ids, torch::tensor(std::vector<int32_t>(ids)).to(torch::kInt64)));
    ASSERT_TRUE(sample.target_ids.defined());
    EXPECT_EQ(sample.target_ids[0].item<int64_t>(), (ids[0] + 1) % 64);
  }

  testing::TempDir dir_;
  std::vector<std::vector<int32_t>> ids_;
};

TEST_F(OnlineSourceTest, EverySampleArrivesWithItsTeachersTensorsFromBothTeachers) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a", "b"});
  auto source = OnlineSource::Open(Options(connector, {"a", "b"}));
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), kSamples);
  EXPECT_TRUE((*source)->has_target_ids());
  for (int i = 0; i < kSamples; ++i) {
    auto sample = (*source)->Get(i);
    ASSERT_TRUE(sample.ok()) << sample.status();
    EXPECT_EQ(sample->id, i);
    ExpectTeacherTensors(*connector, *sample);
  }
  // Requests go round robin: both teachers served.
  EXPECT_GE(connector->requests("a").size(), 4u);
  EXPECT_GE(connector->requests("b").size(), 4u);
  EXPECT_EQ((*source)->refetches(), 0);
}

TEST_F(OnlineSourceTest, CommitAcknowledgesToTheServingTeacherAndWritesTheLedgerOnce) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a", "b"});
  OnlineSourceOptions options = Options(connector, {"a", "b"});
  options.ledger = dir_.Join("ledger.jsonl");
  options.rank = 3;
  auto source = OnlineSource::Open(options);
  ASSERT_TRUE(source.ok()) << source.status();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*source)->Get(i).ok());
  ASSERT_TRUE((*source)->Commit(1, {0, 1}).ok());
  ASSERT_TRUE((*source)->Commit(2, {2, 3}).ok());

  std::set<int64_t> acks;
  for (const std::string teacher : {"a", "b"}) {
    std::set<int64_t> requested;
    for (const auto& request : connector->requests(teacher)) requested.insert(request.sample_id());
    for (int64_t id : connector->acks(teacher)) {
      EXPECT_TRUE(requested.count(id)) << teacher << " was acked " << id << " it never served";
      acks.insert(id);
    }
  }
  EXPECT_EQ(acks, (std::set<int64_t>{0, 1, 2, 3}));

  std::ifstream in(options.ledger);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], (nlohmann::json{{"step", 1}, {"rank", 3}, {"sample_ids", {0, 1}}}));
  EXPECT_EQ(lines[1], (nlohmann::json{{"step", 2}, {"rank", 3}, {"sample_ids", {2, 3}}}));
}

TEST_F(OnlineSourceTest, ALostTeachersSamplesAreRequestedFromTheOtherAndNothingIsLost) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a", "b"});
  auto source = OnlineSource::Open(Options(connector, {"a", "b"}));
  ASSERT_TRUE(source.ok()) << source.status();
  connector->Hold("a");
  std::vector<int64_t> all;
  for (int i = 0; i < kSamples; ++i) all.push_back(i);
  (*source)->Prefetch(all, RowRange{0, 1 << 20, 1 << 20});
  std::set<int64_t> sent_to_a;
  for (const auto& request : connector->requests("a")) sent_to_a.insert(request.sample_id());
  sent_to_a.erase(0);  // Open's probe of sample 0
  ASSERT_GE(sent_to_a.size(), 3u);
  connector->Kill("a");
  connector->Release("a");
  for (int i = 0; i < kSamples; ++i) {
    auto sample = (*source)->Get(i);
    ASSERT_TRUE(sample.ok()) << sample.status();
    ExpectTeacherTensors(*connector, *sample);
    ASSERT_TRUE((*source)->Commit(i + 1, {i}).ok());
  }
  // At most the one answer a was computing when it died got through; the
  // rest went to b.
  EXPECT_GE((*source)->refetches(), static_cast<int64_t>(sent_to_a.size()) - 1);
  std::set<int64_t> sent_to_b;
  for (const auto& request : connector->requests("b")) sent_to_b.insert(request.sample_id());
  int64_t moved = 0;
  for (int64_t id : sent_to_a) moved += sent_to_b.count(id);
  EXPECT_GE(moved, static_cast<int64_t>(sent_to_a.size()) - 1);
}

TEST_F(OnlineSourceTest, ABadPayloadIsRequestedAgainAndABadRequestIsFinal) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  auto source = OnlineSource::Open(Options(connector, {"a"}));
  ASSERT_TRUE(source.ok()) << source.status();
  connector->CorruptNext("a");
  auto sample = (*source)->Get(3);
  ASSERT_TRUE(sample.ok()) << sample.status();
  ExpectTeacherTensors(*connector, *sample);
  EXPECT_EQ((*source)->refetches(), 1);
  int asked = 0;
  for (const auto& request : connector->requests("a")) asked += request.sample_id() == 3;
  EXPECT_EQ(asked, 2);

  // Transient codes are retried too; a refusal of the request is not.
  connector->FailNext("a", absl::ResourceExhaustedError("busy"));
  ASSERT_TRUE((*source)->Get(4).ok());
  EXPECT_EQ((*source)->refetches(), 2);
  connector->FailNext("a", absl::InvalidArgumentError("sample.token_ids: bad"));
  auto refused = (*source)->Get(5);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("sample.token_ids"), std::string::npos)
      << refused.status();
  EXPECT_EQ((*source)->refetches(), 2);
}

TEST_F(OnlineSourceTest, WithNoGraceWhenEveryTeacherIsGoneASampleFailsAtOnce) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  OnlineSourceOptions options = Options(connector, {"a"});
  options.teacher_grace = absl::ZeroDuration();
  auto source = OnlineSource::Open(options);
  ASSERT_TRUE(source.ok()) << source.status();
  connector->Kill("a");
  auto sample = (*source)->Get(2);
  EXPECT_EQ(sample.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(sample.status().message().find(
                "every teacher is gone for more than data.teacher_grace_s = 0 s"),
            std::string::npos)
      << sample.status();
  EXPECT_EQ(connector->describes("a"), 1);  // Open's: no reconnection
}

// P13 item 8: the only teacher restarts (a rolling update, a crash) on the
// same address within data.teacher_grace_s.
class TeacherGraceTest : public OnlineSourceTest {
 protected:
  OnlineSourceOptions GraceOptions(std::shared_ptr<FakeTeacherConnector> connector,
                                   absl::Duration grace) {
    OnlineSourceOptions options = Options(std::move(connector), {"a"});
    options.teacher_grace = grace;
    options.reconnect_backoff = absl::Milliseconds(5);
    options.reconnect_max_backoff = absl::Milliseconds(20);
    return options;
  }
};

TEST_F(TeacherGraceTest, TheOnlyTeacherRestartedWithinTheGraceLosesNothingAndRepeatsNothing) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  OnlineSourceOptions options = GraceOptions(connector, absl::Seconds(30));
  options.ledger = dir_.Join("ledger.jsonl");
  auto source = OnlineSource::Open(options);
  ASSERT_TRUE(source.ok()) << source.status();
  for (int i = 0; i < 2; ++i) {
    auto sample = (*source)->Get(i);
    ASSERT_TRUE(sample.ok()) << sample.status();
    ASSERT_TRUE((*source)->Commit(i + 1, {i}).ok());
  }
  // The rest is requested, then the teacher dies with it unanswered (but
  // for the one answer it was computing).
  connector->Hold("a");
  std::vector<int64_t> rest;
  for (int i = 2; i < kSamples; ++i) rest.push_back(i);
  (*source)->Prefetch(rest, RowRange{0, 1 << 20, 1 << 20});
  connector->Kill("a");
  connector->Release("a");
  // It stays down for three reconnection attempts (Open's Describe + 3).
  ASSERT_TRUE(connector->AwaitDescribes("a", 4, absl::Seconds(30)));
  const size_t before_restart = connector->requests("a").size();
  connector->Restart("a");
  for (int i = 2; i < kSamples; ++i) {
    auto sample = (*source)->Get(i);
    ASSERT_TRUE(sample.ok()) << "sample " << i << ": " << sample.status();
    EXPECT_EQ(sample->id, i);
    ExpectTeacherTensors(*connector, *sample);
    ASSERT_TRUE((*source)->Commit(i + 1, {i}).ok());
  }
  EXPECT_EQ((*source)->reconnects(), 1);
  EXPECT_GE((*source)->refetches(), kSamples - 3);  // all but the answer in progress
  // The restarted teacher was asked for each lost sample once.
  const auto requests = connector->requests("a");
  std::map<int64_t, int> asked_again;
  for (size_t r = before_restart; r < requests.size(); ++r) ++asked_again[requests[r].sample_id()];
  EXPECT_GE(asked_again.size(), static_cast<size_t>(kSamples - 3));
  for (const auto& [id, count] : asked_again) {
    EXPECT_GE(id, 2);
    EXPECT_EQ(count, 1) << "sample " << id;
  }
  // Trained: every sample once, in order, as without the restart.
  std::ifstream in(options.ledger);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSamples));
  for (int i = 0; i < kSamples; ++i) {
    EXPECT_EQ(lines[i], (nlohmann::json{{"step", i + 1}, {"rank", 0}, {"sample_ids", {i}}}));
  }
}

// The grace and the backoff run on a clock the test moves to each deadline
// the source waits for: a minute of grace passes in no real time.
TEST_F(TeacherGraceTest, PastTheGraceTheSampleFailsNamingTheGrace) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  testing::FakeEnv clock;
  OnlineSourceOptions options = GraceOptions(connector, absl::Seconds(60));
  options.reconnect_backoff = absl::Milliseconds(100);
  options.reconnect_max_backoff = absl::Seconds(5);
  options.clock = &clock;
  auto source = OnlineSource::Open(options);
  ASSERT_TRUE(source.ok()) << source.status();
  const absl::Time killed = clock.Now();
  const absl::Time sample_deadline = killed + options.stream.sample_timeout + options.teacher_grace;
  connector->Kill("a");
  std::atomic<bool> done{false};
  absl::StatusOr<TrainingSample> sample = absl::UnknownError("not yet");
  std::thread getter([&] {
    sample = (*source)->Get(2);
    done = true;
  });
  int moves = 0;
  absl::Time moved_to = killed;
  while (!done.load()) {
    // The reconnector waits for its next try or the grace's end, both before
    // the sample's own deadline.
    ASSERT_TRUE(testing::WaitUntil(
        [&] {
          const absl::Time next = clock.NextDeadline();
          return done.load() || (next > moved_to && next < sample_deadline);
        },
        absl::Seconds(30)))
        << "no wait after " << moved_to - killed << "; next deadline at "
        << clock.NextDeadline() - killed << ", sample deadline at " << sample_deadline - killed;
    if (done.load()) break;
    moved_to = clock.NextDeadline();
    clock.Advance(moved_to - clock.Now());
    ASSERT_LT(++moves, 1000);
  }
  getter.join();
  EXPECT_EQ(sample.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(sample.status().message().find(
                "every teacher is gone for more than data.teacher_grace_s = 60 s"),
            std::string::npos)
      << sample.status();
  EXPECT_EQ(clock.Now() - killed, absl::Seconds(60)) << "it waited out the grace, no more";
  // Retried on the schedule meanwhile: 0.1 s doubling to 5 s, each +-20%,
  // fits 14 to 20 tries in a minute (plus Open's Describe).
  EXPECT_GE(connector->describes("a"), 1 + 13);
  EXPECT_LE(connector->describes("a"), 1 + 21);
  // Later samples fail at once, the same way.
  connector->Restart("a");
  auto later = (*source)->Get(3);
  EXPECT_EQ(later.status(), sample.status());
  EXPECT_EQ((*source)->reconnects(), 0);
}

// P24 item 1: a teacher daemon restarted under a coordinator refuses the
// job's token until its first heartbeat there: the student waits that out
// as it waits out a teacher that is down, within the grace.
TEST_F(TeacherGraceTest, ARestartedTeacherRefusingTheTokenForAWhileIsWaitedFor) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  auto source = OnlineSource::Open(GraceOptions(connector, absl::Seconds(30)));
  ASSERT_TRUE(source.ok()) << source.status();
  connector->Kill("a");
  ASSERT_TRUE(connector->AwaitDescribes("a", 2, absl::Seconds(30)));  // lost, being retried
  const int64_t before = connector->describes("a");
  connector->RefuseTokens("a", 3);
  connector->Restart("a");
  for (int i = 0; i < kSamples; ++i) {
    auto sample = (*source)->Get(i);
    ASSERT_TRUE(sample.ok()) << "sample " << i << ": " << sample.status();
    ASSERT_TRUE((*source)->Commit(i + 1, {i}).ok());
  }
  EXPECT_EQ((*source)->reconnects(), 1);
  EXPECT_GE(connector->describes("a") - before, 4);  // three refused, then admitted
}

TEST_F(TeacherGraceTest, ATeacherBackWithAnotherModelIsRefused) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  auto source = OnlineSource::Open(GraceOptions(connector, absl::Seconds(30)));
  ASSERT_TRUE(source.ok()) << source.status();
  connector->Kill("a");
  ASSERT_TRUE(connector->AwaitDescribes("a", 2, absl::Seconds(30)));  // lost, being retried
  connector->ServeAnotherModel("a");
  connector->Restart("a");
  auto sample = (*source)->Get(2);
  EXPECT_EQ(sample.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(sample.status().message().find("hidden_size"), std::string::npos) << sample.status();
  EXPECT_EQ((*source)->reconnects(), 0);
}

TEST_F(OnlineSourceTest, SlicesAskOnlyForTheirRowsAndHaloAndEmptyShardsAskForNothing) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  auto source = OnlineSource::Open(Options(connector, {"a"}));
  ASSERT_TRUE(source.ok()) << source.status();
  const int index = 5;  // 11 tokens
  auto slice = (*source)->GetRows(index, RowRange{2, 5, 7});
  ASSERT_TRUE(slice.ok()) << slice.status();
  const v1::StreamRequest::SampleRequest request = connector->requests("a").back();
  EXPECT_EQ(request.sample_id(), index);
  EXPECT_EQ(request.slice_begin(), 2);
  EXPECT_EQ(request.slice_end(), 5);
  EXPECT_EQ(request.halo_after(), 2);
  EXPECT_EQ(slice->offset, 2);
  EXPECT_EQ(slice->length, 11);
  const torch::Tensor aux = connector->runtime("a").ExpectedAux(ids_[index]);
  const torch::Tensor last = connector->runtime("a").ExpectedLast(ids_[index]);
  EXPECT_TRUE(torch::equal(slice->aux_hidden, aux.narrow(0, 2, 3)));    // own rows
  EXPECT_TRUE(torch::equal(slice->last_hidden, last.narrow(0, 2, 5)));  // plus the halo
  EXPECT_EQ(slice->input_ids.size(0), 5);

  const size_t asked = connector->requests("a").size();
  auto empty = (*source)->GetRows(index, RowRange{11, 16, 18});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->input_ids.size(0), 0);
  EXPECT_EQ(empty->aux_hidden.size(0), 0);
  EXPECT_EQ(empty->aux_hidden.size(1), 2 * 8);  // two capture layers of hidden 8
  EXPECT_EQ(connector->requests("a").size(), asked);
}

TEST_F(OnlineSourceTest, CreditsBoundWhatATeacherHasAnsweredAndNotBeenAcknowledged) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
  OnlineSourceOptions options = Options(connector, {"a"});
  options.in_flight = 2;
  auto source = OnlineSource::Open(options);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<int64_t> all;
  for (int i = 0; i < kSamples; ++i) all.push_back(i);
  (*source)->Prefetch(all, RowRange{0, 1 << 20, 1 << 20});
  // Open's probe (acknowledged) and then two answers: the credits.
  ASSERT_TRUE(connector->AwaitAnswers("a", 3, absl::Seconds(30)));
  EXPECT_EQ(connector->requests("a").size(), 1u + kSamples);
  for (int i = 0; i < kSamples; ++i) {
    auto sample = (*source)->Get(i);
    ASSERT_TRUE(sample.ok()) << sample.status();
    ASSERT_TRUE((*source)->Commit(i + 1, {i}).ok());
  }
  // Without the credit bound the teacher would have answered all eight
  // while the source was not yet taking them.
  EXPECT_EQ(connector->max_outstanding("a"), 2);
  EXPECT_EQ(connector->answers("a"), kSamples + 1);  // and Open's probe
}

TEST_F(OnlineSourceTest, OpenSkipsDeadTeachersAndRefusesMixedModelsOrNoConnection) {
  auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a", "b"});
  connector->SetDown("a");
  auto one = OnlineSource::Open(Options(connector, {"a", "b"}));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(connector->requests("a").empty());
  one->reset();

  connector->SetDown("b");
  auto none = OnlineSource::Open(Options(connector, {"a", "b"}));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no teacher answered"), std::string::npos);

  auto mixed_connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a", "b"});
  mixed_connector->ServeAnotherModel("b");
  auto mixed = OnlineSource::Open(Options(mixed_connector, {"a", "b"}));
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mixed.status().message().find("hidden_size"), std::string::npos) << mixed.status();

  auto unconnected = OnlineSource::Open(Options(nullptr, {"a"}));
  EXPECT_EQ(unconnected.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unconnected.status().message().find("data.teachers"), std::string::npos);

  OnlineSourceOptions shm = Options(mixed_connector, {"a"});
  shm.stream.transport = "shm";
  auto refused = OnlineSource::Open(shm);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("data.transport"), std::string::npos);
}

// P14 item 2: a source names the capture layers it trains on; every stream
// asks for them, every sample holds exactly their columns, and model()
// reports them (the fake target has 4 layers, hidden 8, its own set {1, 2}).
TEST_F(OnlineSourceTest, CaptureLayerIdsAreAskedOfEveryTeacherAndReported) {
  for (const std::vector<int32_t>& layers :
       {std::vector<int32_t>{0, 3}, {2}, {0, 1, 2, 3}, {1, 2}}) {
    auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a", "b"});
    OnlineSourceOptions options = Options(connector, {"a", "b"});
    options.capture_layer_ids = layers;
    auto source = OnlineSource::Open(options);
    ASSERT_TRUE(source.ok()) << source.status();
    const std::vector<int> want(layers.begin(), layers.end());
    EXPECT_EQ((*source)->model().capture_layer_ids, want);
    for (int i = 0; i < kSamples; ++i) {
      auto sample = (*source)->Get(i);
      ASSERT_TRUE(sample.ok()) << sample.status();
      EXPECT_EQ(sample->aux_hidden.sizes().vec(),
                (std::vector<int64_t>{6 + i, static_cast<int64_t>(layers.size()) * 8}));
      EXPECT_TRUE(
          torch::equal(sample->aux_hidden, connector->runtime("a").ExpectedAux(ids_[i], want)))
          << "sample " << i;
    }
    // Both teachers served, and an empty CP shard is as wide.
    EXPECT_GE(connector->requests("a").size(), 4u);
    EXPECT_GE(connector->requests("b").size(), 4u);
    auto empty = (*source)->GetRows(0, RowRange{100, 120, 120});
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ(empty->aux_hidden.sizes().vec(),
              (std::vector<int64_t>{0, static_cast<int64_t>(layers.size()) * 8}));
  }
}

TEST_F(OnlineSourceTest, CaptureLayerIdsAreRefusedNamingTheField) {
  // Not ascending, repeated, outside the 4-layer target.
  for (const std::vector<int32_t>& layers : {std::vector<int32_t>{3, 1}, {1, 1}, {0, 4}, {-1}}) {
    auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
    OnlineSourceOptions options = Options(connector, {"a"});
    options.capture_layer_ids = layers;
    auto source = OnlineSource::Open(options);
    ASSERT_FALSE(source.ok());
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
    EXPECT_NE(source.status().message().find("capture_layer_ids["), std::string::npos)
        << source.status();
    EXPECT_NE(source.status().message().find("4-layer target"), std::string::npos)
        << source.status();
  }
  // A teacher that predates per-stream capture layers serves only its own.
  {
    auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
    connector->ServeOwnCaptureLayersOnly("a");
    OnlineSourceOptions options = Options(connector, {"a"});
    options.capture_layer_ids = {0, 3};
    auto source = OnlineSource::Open(options);
    ASSERT_FALSE(source.ok());
    EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition) << source.status();
    EXPECT_NE(source.status().message().find(
                  "capture_layer_ids: [0, 3] asked for, but teacher a serves only its own "
                  "capture layers [1, 2]"),
              std::string::npos)
        << source.status();
    options.capture_layer_ids = {1, 2};  // its own: fine
    auto same = OnlineSource::Open(options);
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_EQ((*same)->model().capture_layer_ids, (std::vector<int>{1, 2}));
  }
  // A teacher that says it honours them but sends another width: refused
  // when the first sample arrives.
  {
    auto connector = std::make_shared<FakeTeacherConnector>(std::vector<std::string>{"a"});
    connector->IgnoreCaptureLayers("a");
    OnlineSourceOptions options = Options(connector, {"a"});
    options.capture_layer_ids = {3};
    auto source = OnlineSource::Open(options);
    ASSERT_FALSE(source.ok());
    EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition) << source.status();
    EXPECT_NE(source.status().message().find(
                  "the teacher sent aux_hidden [6, 16], but capture_layer_ids [3] of hidden "
                  "size 8 need 8 columns"),
              std::string::npos)
        << source.status();
  }
}

}  // namespace
}  // namespace specstream::student
