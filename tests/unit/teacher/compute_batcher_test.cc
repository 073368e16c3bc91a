// The teacher's compute thread over the fake target runtime: payloads equal
// the runtime's captures, batches stay within max_batch_tokens, sinks take
// turns, a failed batch fails only its bad sample, ended sinks are skipped,
// and a batch of streams wanting different layers captures their union once.
#include "teacher/compute_batcher.h"

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/transport/contract.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_target_runtime.h"

namespace specstream::teacher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(30);

class RecordingSink final : public SampleSink {
 public:
  bool ended() const override { return ended_.load(); }
  void end() { ended_ = true; }
  void Deliver(uint64_t request_id,
               absl::StatusOr<std::shared_ptr<const ReadySample>> sample) override {
    absl::MutexLock lock(&mu_);
    delivered_.emplace_back(request_id, std::move(sample));
  }
  // The deliveries so far, once there are at least `n`.
  std::vector<std::pair<uint64_t, absl::StatusOr<std::shared_ptr<const ReadySample>>>> Await(
      size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return delivered_.size() >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), kDeadline))
        << delivered_.size() << " of " << n << " delivered";
    return delivered_;
  }
  size_t count() const {
    absl::MutexLock lock(&mu_);
    return delivered_.size();
  }

 private:
  std::atomic<bool> ended_{false};
  mutable absl::Mutex mu_;
  std::vector<std::pair<uint64_t, absl::StatusOr<std::shared_ptr<const ReadySample>>>> delivered_
      ABSL_GUARDED_BY(mu_);
};

// `length` ids starting at `first` (each below the fake's vocab of 64).
std::vector<int32_t> Ids(int32_t first, int length) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back((first + i) % 64);
  return ids;
}

ComputeJob Job(const std::shared_ptr<RecordingSink>& sink, uint64_t request_id,
               const std::vector<int32_t>& ids, std::vector<int> layers = {}) {
  ComputeJob job;
  job.sink = sink;
  job.request.set_request_id(request_id);
  job.request.set_sample_id(static_cast<int64_t>(request_id));
  job.request.mutable_token_ids()->Add(ids.begin(), ids.end());
  job.request.set_loss_mask(std::string(ids.size(), '\1'));
  job.capture_layer_ids = std::move(layers);
  return job;
}

// The payload's tensor `name` (float32 payloads), checked against the
// contract's CRC32C first.
torch::Tensor TensorOf(const ReadySample& sample, const std::string& name) {
  std::string bytes(sample.bytes.size(), '\0');
  sample.bytes.CopyTo(0, bytes.size(), bytes.data());
  EXPECT_TRUE(VerifyPayload(sample.contract, bytes).ok());
  for (const v1::TensorSpec& spec : sample.contract.tensors()) {
    if (spec.name() != name) continue;
    std::vector<int64_t> shape(spec.shape().begin(), spec.shape().end());
    return torch::from_blob(bytes.data() + spec.offset(), shape, torch::kFloat32).clone();
  }
  ADD_FAILURE() << "no tensor " << name;
  return torch::Tensor();
}

ComputeBatcherOptions Options(int64_t max_batch_tokens) {
  ComputeBatcherOptions options;
  options.payload_dtype = DType::kF32;
  options.max_batch_tokens = max_batch_tokens;
  return options;
}

TEST(ComputeBatcherTest, PayloadsHoldTheRuntimesCapturesOfEachSample) {
  testing::FakeTargetRuntime runtime;
  ComputeBatcher batcher(runtime, Options(8192));
  auto sink = std::make_shared<RecordingSink>();
  const std::vector<std::vector<int32_t>> sequences = {Ids(3, 5), Ids(10, 9), Ids(40, 1)};
  for (size_t i = 0; i < sequences.size(); ++i) batcher.Enqueue(Job(sink, i + 1, sequences[i]));
  auto delivered = sink->Await(3);
  ASSERT_EQ(delivered.size(), 3u);
  for (const auto& [request_id, sample] : delivered) {
    ASSERT_TRUE(sample.ok()) << sample.status();
    const std::vector<int32_t>& ids = sequences[request_id - 1];
    EXPECT_EQ((*sample)->request_id, request_id);
    EXPECT_EQ((*sample)->row_begin, 0);
    EXPECT_EQ((*sample)->row_end, static_cast<int64_t>(ids.size()));
    EXPECT_TRUE(torch::equal(TensorOf(**sample, "aux_hidden"), runtime.ExpectedAux(ids)));
    EXPECT_TRUE(torch::equal(TensorOf(**sample, "last_hidden"), runtime.ExpectedLast(ids)));
  }
}

// A batch grows while count x longest stays within max_batch_tokens.
TEST(ComputeBatcherTest, BatchesStayWithinMaxBatchTokens) {
  testing::FakeTargetRuntime runtime;
  runtime.Hold();
  ComputeBatcher batcher(runtime, Options(24));
  auto sink = std::make_shared<RecordingSink>();
  batcher.Enqueue(Job(sink, 1, Ids(1, 4)));  // holds the compute thread
  ASSERT_TRUE(runtime.AwaitHeldForward(kDeadline));
  // Padded sizes: [8, 8, 8] is 24; [10, 4] is 2 x 10 = 20, and a third
  // would make 30; then [4].
  batcher.Enqueue(Job(sink, 2, Ids(2, 8)));
  batcher.Enqueue(Job(sink, 3, Ids(3, 8)));
  batcher.Enqueue(Job(sink, 4, Ids(4, 8)));
  batcher.Enqueue(Job(sink, 5, Ids(5, 10)));
  batcher.Enqueue(Job(sink, 6, Ids(6, 4)));
  batcher.Enqueue(Job(sink, 7, Ids(7, 4)));
  EXPECT_EQ(batcher.queued_jobs(), 6);
  runtime.Release();
  sink->Await(7);
  EXPECT_THAT(runtime.batch_sizes(), ElementsAre(1, 3, 2, 1));
  EXPECT_EQ(batcher.forward_calls(), 4);
  EXPECT_EQ(batcher.queued_jobs(), 0);
}

// Sinks take turns: one job from each sink with jobs waiting before a second
// from any, so a stream's backlog never delays another stream by more than
// one job.
TEST(ComputeBatcherTest, SinksTakeTurns) {
  testing::FakeTargetRuntime runtime;
  runtime.Hold();
  ComputeBatcher batcher(runtime, Options(4));  // one 4-token sample per batch
  auto first = std::make_shared<RecordingSink>();
  auto busy = std::make_shared<RecordingSink>();
  auto other = std::make_shared<RecordingSink>();
  batcher.Enqueue(Job(first, 1, Ids(1, 4)));
  ASSERT_TRUE(runtime.AwaitHeldForward(kDeadline));
  for (int i = 0; i < 3; ++i) batcher.Enqueue(Job(busy, 10 + i, Ids(10 + i, 4)));
  batcher.Enqueue(Job(other, 20, Ids(20, 4)));
  batcher.Enqueue(Job(other, 21, Ids(21, 4)));
  runtime.Release();
  busy->Await(3);
  other->Await(2);
  EXPECT_THAT(runtime.first_ids(), ElementsAre(1, 10, 20, 11, 21, 12));
}

// A failed batch is retried one sample at a time: only the sample that
// fails the forward fails.
TEST(ComputeBatcherTest, AFailedBatchFailsOnlyItsBadSample) {
  testing::FakeTargetRuntime runtime;
  runtime.set_poison_id(33);
  runtime.Hold();
  ComputeBatcher batcher(runtime, Options(8192));
  auto sink = std::make_shared<RecordingSink>();
  batcher.Enqueue(Job(sink, 1, Ids(1, 3)));
  ASSERT_TRUE(runtime.AwaitHeldForward(kDeadline));
  batcher.Enqueue(Job(sink, 2, Ids(10, 3)));
  batcher.Enqueue(Job(sink, 3, Ids(32, 3)));  // holds 33
  batcher.Enqueue(Job(sink, 4, Ids(20, 3)));
  runtime.Release();
  auto delivered = sink->Await(4);
  EXPECT_THAT(runtime.batch_sizes(), ElementsAre(1, 3, 1, 1, 1));
  for (const auto& [request_id, sample] : delivered) {
    if (request_id == 3) {
      ASSERT_FALSE(sample.ok());
      EXPECT_EQ(sample.status().code(), absl::StatusCode::kInternal);
      EXPECT_THAT(std::string(sample.status().message()), HasSubstr("teacher forward"));
    } else {
      EXPECT_TRUE(sample.ok()) << request_id << ": " << sample.status();
    }
  }
}

// The jobs of a sink that ended are dropped unseen; the others run.
TEST(ComputeBatcherTest, EndedSinksAreSkipped) {
  testing::FakeTargetRuntime runtime;
  runtime.Hold();
  ComputeBatcher batcher(runtime, Options(8192));
  auto live = std::make_shared<RecordingSink>();
  auto gone = std::make_shared<RecordingSink>();
  batcher.Enqueue(Job(live, 1, Ids(1, 3)));
  ASSERT_TRUE(runtime.AwaitHeldForward(kDeadline));
  batcher.Enqueue(Job(gone, 2, Ids(2, 3)));
  batcher.Enqueue(Job(gone, 3, Ids(3, 3)));
  batcher.Enqueue(Job(live, 4, Ids(4, 3)));
  gone->end();
  runtime.Release();
  live->Await(2);
  EXPECT_EQ(gone->count(), 0u);
  EXPECT_THAT(runtime.first_ids(), ElementsAre(1, 4));
  EXPECT_EQ(batcher.queued_jobs(), 0);
}

// Streams that want different layers share one forward over the ascending
// union; each sample holds its own layers, in its order.
TEST(ComputeBatcherTest, MixedCaptureLayersShareOneForwardOfTheirUnion) {
  testing::FakeTargetRuntime runtime;  // 4 layers, described {1, 2}
  runtime.Hold();
  ComputeBatcher batcher(runtime, Options(8192));
  auto a = std::make_shared<RecordingSink>();
  auto b = std::make_shared<RecordingSink>();
  batcher.Enqueue(Job(a, 1, Ids(1, 2)));
  ASSERT_TRUE(runtime.AwaitHeldForward(kDeadline));
  batcher.Enqueue(Job(a, 2, Ids(5, 4), {3, 0}));
  batcher.Enqueue(Job(b, 3, Ids(9, 3)));  // the described {1, 2}
  runtime.Release();
  auto from_a = a->Await(2);
  auto from_b = b->Await(1);
  const std::vector<std::vector<int>> asked = runtime.capture_requests();
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_THAT(asked[1], ElementsAre(0, 1, 2, 3));
  ASSERT_TRUE(from_a[1].second.ok()) << from_a[1].second.status();
  EXPECT_TRUE(torch::equal(TensorOf(**from_a[1].second, "aux_hidden"),
                           runtime.ExpectedAux(Ids(5, 4), {3, 0})));
  ASSERT_TRUE(from_b[0].second.ok()) << from_b[0].second.status();
  EXPECT_TRUE(
      torch::equal(TensorOf(**from_b[0].second, "aux_hidden"), runtime.ExpectedAux(Ids(9, 3))));
}

}  // namespace
}  // namespace specstream::teacher
