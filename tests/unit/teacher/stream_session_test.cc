// The stream protocol (teacher/stream_session.h) with no server: a session
// over a recording StreamCall, a ComputeBatcher over the fake target runtime
// and the real inline / shm / loopback-NCCL senders. Every wait is on a
// condition, with a deadline that only a broken session reaches.
#include "teacher/stream_session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/contract.h"
#include "common/transport/shm_ring.h"
#include "gtest/gtest.h"
#include "teacher/queue_budget.h"
#include "tests/testing/fake_target_runtime.h"
#include "tests/testing/loopback_channel.h"

namespace specstream::teacher {
namespace {

using v1::StreamRequest;
using v1::StreamResponse;

constexpr absl::Duration kDeadline = absl::Seconds(30);

// What the student would see: every written message in order, and how the
// call finished. Writes complete on a thread of its own ("the network"), as
// gRPC completes them, never inside StartWrite.
class RecordingCall final : public StreamCall {
 public:
  ~RecordingCall() override { Stop(); }

  void Attach(StreamSession* session) {
    session_ = session;
    network_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (network_.joinable()) network_.join();
  }

  absl::Status StartWrite(const StreamMessage& message) override {
    absl::MutexLock lock(&mu_);
    if (!refuse_writes_.ok()) return refuse_writes_;
    EXPECT_FALSE(in_flight_.has_value()) << "two writes in flight";
    in_flight_ = message;
    return absl::OkStatus();
  }
  void Finish(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(in_flight_.has_value()) << "Finish with a write in flight";
    EXPECT_FALSE(finished_.has_value()) << "Finish twice";
    finished_ = status;
  }
  void StartReading() override {
    absl::MutexLock lock(&mu_);
    ++reads_started_;
  }

  // Test controls.
  void RefuseWrites(absl::Status why) {
    absl::MutexLock lock(&mu_);
    refuse_writes_ = std::move(why);
  }
  void FailNextWrite() {
    absl::MutexLock lock(&mu_);
    fail_next_ = true;
  }
  // Writes stay in flight while paused (a slow student).
  void Pause(bool paused) {
    absl::MutexLock lock(&mu_);
    paused_ = paused;
  }

  bool Await(const std::function<bool(const std::vector<StreamMessage>&,
                                      const std::optional<absl::Status>&)>& done) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(written_, finished_); };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), kDeadline);
  }
  bool AwaitFinished() {
    return Await([](const auto&, const auto& finished) { return finished.has_value(); });
  }
  std::vector<StreamMessage> written() {
    absl::MutexLock lock(&mu_);
    return written_;
  }
  std::optional<absl::Status> finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  int reads_started() {
    absl::MutexLock lock(&mu_);
    return reads_started_;
  }

 private:
  void Loop() {
    while (true) {
      bool ok = true;
      {
        absl::MutexLock lock(&mu_);
        auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || (in_flight_.has_value() && !paused_);
        };
        mu_.Await(absl::Condition(&work));
        if (stop_) return;
        ok = !fail_next_;
        fail_next_ = false;
        if (ok) written_.push_back(std::move(*in_flight_));
        in_flight_.reset();
      }
      session_->OnWriteDone(ok);
    }
  }

  StreamSession* session_ = nullptr;
  std::thread network_;
  absl::Mutex mu_;
  std::optional<StreamMessage> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<StreamMessage> written_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> finished_ ABSL_GUARDED_BY(mu_);
  absl::Status refuse_writes_ ABSL_GUARDED_BY(mu_);
  bool fail_next_ ABSL_GUARDED_BY(mu_) = false;
  int reads_started_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Payloads reassembled from what a session wrote (inline chunks, or shm
// locators read from `ring`), keyed by request id.
struct Decoded {
  std::optional<StreamResponse::Opened> opened;
  std::map<uint64_t, StreamResponse::SampleHeader> headers;
  std::map<uint64_t, std::string> payloads;
  std::map<uint64_t, StreamResponse::SampleError> errors;
  std::vector<uint64_t> header_order;
  std::string protocol_error;
};

// `chunks_follow_headers`: inline and shm streams (NCCL payloads go out of
// band).
Decoded Decode(const std::vector<StreamMessage>& messages, const ShmRing* ring = nullptr,
               bool chunks_follow_headers = true) {
  Decoded d;
  uint64_t open_payload = 0;  // request id of a payload whose bytes are still coming
  for (const StreamMessage& m : messages) {
    if (m.is_chunk || m.message.has_chunk()) {
      const uint64_t id = m.is_chunk ? m.request_id : m.message.chunk().request_id();
      const uint64_t offset = m.is_chunk ? m.offset : m.message.chunk().offset();
      std::string& payload = d.payloads[id];
      if (id != open_payload || offset != payload.size()) {
        d.protocol_error = absl::StrCat("chunk of ", id, " at ", offset, " out of order");
      }
      if (m.is_chunk) {
        payload.append(m.data.data(), m.data.size());
      } else {
        const auto& shm = m.message.chunk().shm();
        auto record = ring->Read(shm.position(), shm.length());
        if (!record.ok()) d.protocol_error = std::string(record.status().message());
        if (record.ok()) payload.append(record->data(), record->size());
      }
      if (payload.size() == d.headers[id].contract().payload_bytes()) open_payload = 0;
      continue;
    }
    if (open_payload != 0) d.protocol_error = "a message inside a payload";
    const StreamResponse& r = m.message;
    if (r.has_opened()) {
      if (!messages.empty() && &m != &messages.front()) d.protocol_error = "Opened is not first";
      d.opened = r.opened();
    } else if (r.has_header()) {
      d.headers[r.header().request_id()] = r.header();
      d.header_order.push_back(r.header().request_id());
      d.payloads[r.header().request_id()];
      if (chunks_follow_headers && r.header().contract().payload_bytes() > 0) {
        open_payload = r.header().request_id();
      }
    } else if (r.has_error()) {
      d.errors[r.error().request_id()] = r.error();
    }
  }
  return d;
}

class StreamSessionTest : public ::testing::Test {
 protected:
  void SetUp() override { Configure(); }

  void Configure(int max_samples_per_stream = 8, int max_queued_requests = 4096,
                 uint64_t chunk_bytes = 4096, PayloadChannelJoin nccl = nullptr,
                 int64_t max_batch_tokens = 8192) {
    session_.reset();
    call_.reset();
    batcher_.reset();
    ComputeBatcherOptions batcher;
    batcher.max_batch_tokens = max_batch_tokens;
    batcher.payload_dtype = DType::kF32;
    batcher.keep_target_ids = true;
    batcher_ = std::make_unique<ComputeBatcher>(runtime_, batcher);
    config_.payload_dtype = v1::DTYPE_F32;
    config_.max_tokens = 256;
    config_.vocab_size = runtime_.Describe().vocab_size;
    config_.num_layers = runtime_.Describe().num_layers;
    config_.max_samples_per_stream = max_samples_per_stream;
    config_.max_queued_requests = max_queued_requests;
    config_.sender.chunk_bytes = chunk_bytes;
    config_.sender.nccl_join = std::move(nccl);
    config_.batcher = batcher_.get();
    call_ = std::make_unique<RecordingCall>();
    session_ = std::make_shared<StreamSession>(config_, call_.get(), "test-peer");
    call_->Attach(session_.get());
  }

  void TearDown() override {
    if (session_ != nullptr) {
      session_->OnCancel();
      call_->AwaitFinished();
      int64_t sent = 0;
      session_->OnDone(&sent);
      call_->Stop();
    }
    batcher_.reset();
  }

  static std::vector<int32_t> Ids(int sample, int length = 40) {
    std::vector<int32_t> ids;
    for (int t = 0; t < length; ++t) ids.push_back((sample * 7 + t * 3) % 60);
    return ids;
  }
  void Send(const StreamRequest& request) { session_->OnRequest(request); }
  static StreamRequest OpenRequest(const std::vector<int32_t>& capture_layer_ids) {
    StreamRequest r;
    r.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
    r.mutable_open()->mutable_capture_layer_ids()->Add(capture_layer_ids.begin(),
                                                       capture_layer_ids.end());
    return r;
  }
  static StreamRequest SampleRequest(uint64_t request_id, int sample) {
    StreamRequest r;
    r.mutable_sample()->set_request_id(request_id);
    r.mutable_sample()->set_sample_id(sample);
    for (int32_t id : Ids(sample)) r.mutable_sample()->add_token_ids(id);
    return r;
  }
  void Open(v1::Transport transport = v1::TRANSPORT_INLINE, const ShmRing* ring = nullptr,
            const std::string& nccl_id = "") {
    StreamRequest r;
    r.mutable_open()->set_transport(transport);
    if (ring != nullptr) {
      r.mutable_open()->set_shm_name(ring->name());
      r.mutable_open()->set_shm_capacity(ring->capacity());
    }
    if (!nccl_id.empty()) r.mutable_open()->set_nccl_unique_id(nccl_id);
    Send(r);
  }
  void Credit(uint32_t n) {
    StreamRequest r;
    r.mutable_credit()->set_n(n);
    Send(r);
  }
  void Ack(int64_t sample_id) {
    StreamRequest r;
    r.mutable_ack()->add_sample_ids(sample_id);
    Send(r);
  }
  void Request(uint64_t request_id, int sample, std::vector<int32_t> ids = {}) {
    if (ids.empty()) ids = Ids(sample);
    StreamRequest r;
    r.mutable_sample()->set_request_id(request_id);
    r.mutable_sample()->set_sample_id(sample);
    for (int32_t id : ids) r.mutable_sample()->add_token_ids(id);
    Send(r);
  }
  bool AwaitHeaders(size_t n) {
    return call_->Await([n](const std::vector<StreamMessage>& w, const auto& finished) {
      size_t headers = 0;
      for (const StreamMessage& m : w) headers += !m.is_chunk && m.message.has_header();
      return headers >= n || finished.has_value();
    });
  }
  bool AwaitErrors(size_t n) {
    return call_->Await([n](const std::vector<StreamMessage>& w, const auto& finished) {
      size_t errors = 0;
      for (const StreamMessage& m : w) errors += !m.is_chunk && m.message.has_error();
      return errors >= n || finished.has_value();
    });
  }
  // The payload's aux_hidden equals the fake runtime's capture of `ids`
  // (of `layers`; empty: the described ones).
  void ExpectAuxOf(const Decoded& d, uint64_t request_id, const std::vector<int32_t>& ids,
                   const std::vector<int>& layers = {}) {
    const auto& header = d.headers.at(request_id);
    const std::string& payload = d.payloads.at(request_id);
    ASSERT_TRUE(VerifyPayload(header.contract(), payload).ok());
    for (const v1::TensorSpec& spec : header.contract().tensors()) {
      if (spec.name() != "aux_hidden") continue;
      torch::Tensor expected = runtime_.ExpectedAux(ids, layers);
      EXPECT_EQ(std::vector<int64_t>(spec.shape().begin(), spec.shape().end()),
                expected.sizes().vec());
      ASSERT_EQ(spec.nbytes(), expected.nbytes());
      EXPECT_EQ(0, std::memcmp(payload.data() + spec.offset(), expected.data_ptr(), spec.nbytes()));
      return;
    }
    ADD_FAILURE() << "no aux_hidden in the contract";
  }

  testing::FakeTargetRuntime runtime_;
  std::unique_ptr<ComputeBatcher> batcher_;
  std::unique_ptr<QueueBudget> budget_;  // outlives every session
  StreamSessionConfig config_;
  std::unique_ptr<RecordingCall> call_;
  std::shared_ptr<StreamSession> session_;
};

TEST_F(StreamSessionTest, OpenedFirstThenHeadersAndInlineChunksInOrder) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(3);
  for (int i = 1; i <= 3; ++i) Request(i, i);
  ASSERT_TRUE(AwaitHeaders(3));
  ASSERT_TRUE(call_->Await([](const auto& w, const auto&) {
    return Decode(w).payloads.size() == 3 &&
           Decode(w).payloads.at(3).size() == Decode(w).headers.at(3).contract().payload_bytes();
  }));
  const Decoded d = Decode(call_->written());
  EXPECT_EQ(d.protocol_error, "");
  ASSERT_TRUE(d.opened.has_value());
  EXPECT_EQ(d.opened->transport(), v1::TRANSPORT_INLINE);
  EXPECT_EQ(d.opened->chunk_bytes(), 4096u);
  for (int i = 1; i <= 3; ++i) ExpectAuxOf(d, i, Ids(i));
  // A 40-token float32 payload spans several 4 KiB chunks.
  size_t chunks = 0;
  for (const StreamMessage& m : call_->written()) chunks += m.is_chunk;
  EXPECT_GT(chunks, 3u);
  EXPECT_EQ(session_->phase(), StreamSession::Phase::kOpen);
}

TEST_F(StreamSessionTest, NothingIsComputedWithoutCreditAndAnAckReturnsIt) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Request(1, 1);
  Request(2, 2);
  ASSERT_TRUE(call_->Await([](const auto& w, const auto&) { return !w.empty(); }));  // Opened
  EXPECT_EQ(runtime_.forward_calls(), 0);
  Credit(1);
  ASSERT_TRUE(AwaitHeaders(1));
  EXPECT_EQ(Decode(call_->written()).header_order, std::vector<uint64_t>({1}));
  // The one credit is in flight until the sample is acked.
  Ack(1);
  ASSERT_TRUE(AwaitHeaders(2));
  EXPECT_EQ(Decode(call_->written()).header_order, std::vector<uint64_t>({1, 2}));
}

TEST_F(StreamSessionTest, BadRequestsGetSampleErrorsAndTheStreamGoesOn) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(4);
  Request(1, 1, {1, 2, 999});  // outside the vocab
  Request(2, 2);
  Request(2, 3);  // request id in use
  ASSERT_TRUE(AwaitErrors(2));
  ASSERT_TRUE(AwaitHeaders(1));
  const Decoded d = Decode(call_->written());
  ASSERT_EQ(d.errors.count(1), 1u);
  EXPECT_EQ(d.errors.at(1).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(d.errors.at(1).message().find("sample.token_ids[2]"), std::string::npos);
  EXPECT_NE(d.errors.at(2).message().find("already in use"), std::string::npos);
  EXPECT_EQ(d.header_order, std::vector<uint64_t>({2}));
  EXPECT_FALSE(call_->finished().has_value());
}

TEST_F(StreamSessionTest, ProtocolViolationsEndTheStreamNamingThem) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Credit(1);  // before Open
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(call_->finished()->message().find("first StreamRequest must be Open"),
            std::string::npos);

  Configure();
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  StreamRequest open;
  open.mutable_open()->set_transport(static_cast<v1::Transport>(42));
  Send(open);
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_NE(call_->finished()->message().find("open.transport"), std::string::npos);
}

TEST_F(StreamSessionTest, ARefusedStreamFinishesAtOnceWithTheRefusal) {
  EXPECT_FALSE(session_->Begin(absl::UnauthenticatedError("no token")));
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(call_->written().empty());
}

TEST_F(StreamSessionTest, AnAdmittedStreamStartsReadingOnce) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  EXPECT_EQ(call_->reads_started(), 1);
}

// The verdict on a stream's token may come after the student gave up: the
// session must neither read nor finish a second time.
TEST_F(StreamSessionTest, AVerdictAfterCancelStartsNothing) {
  session_->OnCancel();
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_FALSE(session_->Begin(absl::OkStatus()));
  EXPECT_EQ(call_->reads_started(), 0);
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kCancelled);
}

TEST_F(StreamSessionTest, TooManyWaitingRequestsEndTheStream) {
  Configure(/*max_samples_per_stream=*/8, /*max_queued_requests=*/2);
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  for (int i = 1; i <= 3; ++i) Request(i, i);
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kResourceExhausted);
}

// P13 item 18: one budget for waiting requests over every stream. A request
// the budget cannot take is refused alone (SampleError RESOURCE_EXHAUSTED,
// the stream goes on); a stream that grants credit first is not charged;
// submitting, cancelling, half-closing and draining each give the bytes back.
TEST_F(StreamSessionTest, StreamsShareOneQueueBudgetAndARequestOverItIsRefused) {
  StreamRequest probe;
  for (int32_t id : Ids(1)) probe.mutable_sample()->add_token_ids(id);
  const int64_t per_request = QueuedRequestBytes(probe.sample());
  EXPECT_EQ(per_request, 40 * 4 + kQueuedRequestOverheadBytes);
  budget_ = std::make_unique<QueueBudget>(4 * per_request);
  config_.queue_budget = budget_.get();

  struct Stream {
    std::unique_ptr<RecordingCall> call = std::make_unique<RecordingCall>();
    std::shared_ptr<StreamSession> session;
  };
  auto start = [&](const std::string& peer) {
    Stream s;
    s.session = std::make_shared<StreamSession>(config_, s.call.get(), peer);
    s.call->Attach(s.session.get());
    EXPECT_TRUE(s.session->Begin(absl::OkStatus()));
    StreamRequest open;
    open.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
    s.session->OnRequest(open);
    return s;
  };
  auto request = [](Stream& s, uint64_t request_id) {
    StreamRequest r;
    r.mutable_sample()->set_request_id(request_id);
    r.mutable_sample()->set_sample_id(static_cast<int64_t>(request_id));
    for (int32_t id : Ids(static_cast<int>(request_id))) r.mutable_sample()->add_token_ids(id);
    s.session->OnRequest(r);
  };
  auto errors = [](Stream& s, size_t n) {
    return s.call->Await([n](const std::vector<StreamMessage>& w, const auto& finished) {
      return Decode(w).errors.size() >= n || finished.has_value();
    });
  };
  auto end = [](Stream& s) {
    EXPECT_TRUE(s.call->AwaitFinished());
    int64_t sent = 0;
    s.session->OnDone(&sent).IgnoreError();
    s.call->Stop();
  };

  // Two floods without credit: the first has 3 waiting, the second 1; its
  // other 2 are refused, and it is not ended.
  Stream a = start("flood-a");
  Stream b = start("flood-b");
  for (uint64_t id = 1; id <= 3; ++id) request(a, id);
  for (uint64_t id = 1; id <= 3; ++id) request(b, id);
  EXPECT_EQ(budget_->used(), 4 * per_request);
  ASSERT_TRUE(errors(b, 2));
  Decoded db = Decode(b.call->written());
  ASSERT_EQ(db.errors.size(), 2u);
  for (uint64_t id : {2u, 3u}) {
    ASSERT_EQ(db.errors.count(id), 1u) << id;
    EXPECT_EQ(db.errors.at(id).code(), static_cast<int32_t>(absl::StatusCode::kResourceExhausted));
    EXPECT_NE(db.errors.at(id).message().find("--max-queued-mib"), std::string::npos)
        << db.errors.at(id).message();
  }
  EXPECT_FALSE(b.call->finished().has_value());
  EXPECT_TRUE(Decode(a.call->written()).errors.empty());

  // A student that grants credit before it asks is served with the budget full.
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(2);
  Request(1, 1);
  Request(2, 2);
  ASSERT_TRUE(AwaitHeaders(2));
  EXPECT_TRUE(Decode(call_->written()).errors.empty());
  EXPECT_EQ(budget_->used(), 4 * per_request);

  // A credit submits one of a's: its bytes return, and a refused id of b's
  // may be sent again.
  {
    StreamRequest credit;
    credit.mutable_credit()->set_n(1);
    a.session->OnRequest(credit);
  }
  ASSERT_TRUE(a.call->Await([](const std::vector<StreamMessage>& w, const auto&) {
    return Decode(w).headers.size() == 1;
  }));
  EXPECT_EQ(budget_->used(), 3 * per_request);
  request(b, 2);
  EXPECT_EQ(budget_->used(), 4 * per_request);
  EXPECT_EQ(Decode(b.call->written()).errors.size(), 2u);

  // Every end gives the rest back: a drained stream answers its waiting
  // requests UNAVAILABLE, a cancelled one drops them, and so does a
  // half-closed one.
  Stream c = start("flood-c");
  request(c, 7);  // refused: the budget is full
  ASSERT_TRUE(errors(c, 1));
  b.session->Drain();
  end(b);
  db = Decode(b.call->written());
  for (uint64_t id : {1u, 2u}) {
    EXPECT_EQ(db.errors.at(id).code(), static_cast<int32_t>(absl::StatusCode::kUnavailable)) << id;
  }
  EXPECT_EQ(b.call->finished()->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(budget_->used(), 2 * per_request);
  request(c, 8);  // fits now
  EXPECT_EQ(budget_->used(), 3 * per_request);
  a.session->OnCancel();
  end(a);
  EXPECT_EQ(budget_->used(), per_request);
  c.session->OnReadsDone();
  end(c);
  EXPECT_EQ(c.call->finished()->code(), absl::StatusCode::kOk);
  EXPECT_EQ(budget_->used(), 0);
  EXPECT_EQ(budget_->peak(), 4 * per_request);
}

// P24 item 2: one stream's waiting requests have a bound of their own
// below the teacher-wide budget; a request over it is refused alone.
TEST_F(StreamSessionTest, OneStreamsWaitingRequestsHaveTheirOwnBound) {
  StreamRequest probe;
  for (int32_t id : Ids(1)) probe.mutable_sample()->add_token_ids(id);
  const int64_t per_request = QueuedRequestBytes(probe.sample());
  budget_ = std::make_unique<QueueBudget>(100 * per_request);
  config_.queue_budget = budget_.get();
  config_.max_queued_request_bytes = 3 * per_request;
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  for (int i = 1; i <= 5; ++i) Request(i, i);  // no credit: all wait or are refused
  EXPECT_EQ(budget_->used(), 3 * per_request);
  ASSERT_TRUE(AwaitErrors(2));
  const Decoded d = Decode(call_->written());
  ASSERT_EQ(d.errors.size(), 2u);
  for (uint64_t id : {4u, 5u}) {
    ASSERT_EQ(d.errors.count(id), 1u) << id;
    EXPECT_EQ(d.errors.at(id).code(), static_cast<int32_t>(absl::StatusCode::kResourceExhausted));
    EXPECT_NE(d.errors.at(id).message().find("--max-queued-mib-per-stream"), std::string::npos)
        << d.errors.at(id).message();
  }
  EXPECT_FALSE(call_->finished().has_value());
  Credit(5);  // the three waiting are served, and a refused id may be sent again
  Request(4, 4);
  ASSERT_TRUE(AwaitHeaders(4));
  EXPECT_EQ(budget_->used(), 0);
}

// P24 item 2: streams take turns at the compute thread. One stream with
// eight samples queued ahead of another's one request delays it by one of
// its samples, not eight (FIFO across streams would compute it ninth).
TEST_F(StreamSessionTest, StreamsTakeTurnsAtTheComputeThread) {
  Configure(/*max_samples_per_stream=*/8, /*max_queued_requests=*/4096, /*chunk_bytes=*/4096,
            /*nccl=*/nullptr, /*max_batch_tokens=*/40);  // one 40-token sample per forward
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(8);
  RecordingCall other_call;
  auto other = std::make_shared<StreamSession>(config_, &other_call, "other-peer");
  other_call.Attach(other.get());
  ASSERT_TRUE(other->Begin(absl::OkStatus()));
  runtime_.Hold();
  for (int i = 1; i <= 8; ++i) Request(i, i, std::vector<int32_t>(40, 1));
  {
    StreamRequest open;
    open.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
    other->OnRequest(open);
    StreamRequest credit;
    credit.mutable_credit()->set_n(1);
    other->OnRequest(credit);
    StreamRequest sample;
    sample.mutable_sample()->set_request_id(1);
    sample.mutable_sample()->set_sample_id(1);
    for (int t = 0; t < 40; ++t) sample.mutable_sample()->add_token_ids(2);
    other->OnRequest(sample);
  }
  runtime_.Release();
  ASSERT_TRUE(AwaitHeaders(8));
  ASSERT_TRUE(other_call.Await([](const std::vector<StreamMessage>& w, const auto& finished) {
    return Decode(w).headers.size() == 1 || finished.has_value();
  }));
  const std::vector<int32_t> order = runtime_.first_ids();
  ASSERT_EQ(order.size(), 9u);
  const auto at = std::find(order.begin(), order.end(), 2) - order.begin();
  EXPECT_LE(at, 2) << "the other stream's sample was computed after " << at << " of the first's";
  other->OnCancel();
  EXPECT_TRUE(other_call.AwaitFinished());
  int64_t sent = 0;
  other->OnDone(&sent).IgnoreError();
  other_call.Stop();
}

// A student that is refused and never reads cannot pile up SampleErrors:
// past max_queued_requests unwritten responses its stream ends.
TEST_F(StreamSessionTest, RefusalsThatAreNeverReadEndTheStream) {
  Configure(/*max_samples_per_stream=*/8, /*max_queued_requests=*/2);
  budget_ = std::make_unique<QueueBudget>(1);  // every waiting request is refused
  config_.queue_budget = budget_.get();
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  call_->Pause(true);
  Open();
  for (int i = 1; i <= 3; ++i) Request(i, i);
  EXPECT_EQ(budget_->used(), 0);
  call_->Pause(false);
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(call_->finished()->message().find("read the stream"), std::string::npos)
      << call_->finished()->message();
  EXPECT_LE(Decode(call_->written()).errors.size(), 2u);
}

TEST_F(StreamSessionTest, AFailedForwardFailsOnlyItsSample) {
  runtime_.set_poison_id(59);
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(3);
  runtime_.Hold();  // the three requests meet in one batch
  Request(1, 1);
  Request(2, 2, {5, 59, 7});
  Request(3, 3);
  runtime_.Release();
  ASSERT_TRUE(AwaitErrors(1));
  ASSERT_TRUE(AwaitHeaders(2));
  const Decoded d = Decode(call_->written());
  EXPECT_EQ(d.errors.count(2), 1u);
  EXPECT_NE(d.errors.at(2).message().find("teacher forward"), std::string::npos);
  EXPECT_EQ(d.headers.count(1) + d.headers.count(3), 2u);
}

TEST_F(StreamSessionTest, MaterialisedSamplesAreBoundedWhileTheStudentIsSlow) {
  Configure(/*max_samples_per_stream=*/2);
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  call_->Pause(true);  // nothing is written: Opened stays in flight
  Open();
  Credit(10);
  for (int i = 1; i <= 10; ++i) Request(i, i);
  // Two samples are computed and wait; no more until they are sent.
  ASSERT_TRUE(runtime_.AwaitSamples(2, kDeadline));
  int64_t computed = 0;
  for (int64_t b : runtime_.batch_sizes()) computed += b;
  EXPECT_EQ(computed, 2);
  call_->Pause(false);
  ASSERT_TRUE(AwaitHeaders(10));
}

TEST_F(StreamSessionTest, HalfCloseFinishesOkOnceEverythingIsSent) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(2);
  Request(1, 1);
  Request(2, 2);
  session_->OnReadsDone();
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_TRUE(call_->finished()->ok()) << *call_->finished();
  const Decoded d = Decode(call_->written());
  EXPECT_EQ(d.header_order.size(), 2u);
  EXPECT_EQ(d.protocol_error, "");
}

TEST_F(StreamSessionTest, DrainAnswersWaitingRequestsUnavailableAndEnds) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(1);
  Request(1, 1);
  Request(2, 2);  // waits for a credit
  ASSERT_TRUE(AwaitHeaders(1));
  call_->Pause(true);  // the drain's first SampleError stays in flight
  session_->Drain();
  Request(3, 3);
  call_->Pause(false);
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kUnavailable);
  const Decoded d = Decode(call_->written());
  ASSERT_EQ(d.errors.size(), 2u);
  EXPECT_EQ(d.errors.at(2).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(d.errors.at(3).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(d.header_order, std::vector<uint64_t>({1}));
}

TEST_F(StreamSessionTest, AFailedWriteEndsTheStreamUnavailable) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  call_->FailNextWrite();
  Open();
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kUnavailable);
}

TEST_F(StreamSessionTest, AMessageThatCannotBeFramedEndsTheStreamWithItsReason) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  call_->RefuseWrites(absl::InternalError("serializing specstream.v1.StreamResponse: too big"));
  Open();
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kInternal);
  EXPECT_NE(call_->finished()->message().find("serializing"), std::string::npos);
}

TEST_F(StreamSessionTest, ShmPayloadsGoThroughTheRingAsLocators) {
  ShmRingOptions ring_options;
  ring_options.name = absl::StrCat("/specstream-session-test-", getpid());
  ring_options.capacity = 1 << 20;
  auto ring = ShmRing::Create(ring_options);
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open(v1::TRANSPORT_SHM, ring->get());
  Credit(2);
  Request(1, 1);
  Request(2, 2);
  ASSERT_TRUE(AwaitHeaders(2));
  ASSERT_TRUE(call_->Await([&ring](const auto& w, const auto&) {
    const Decoded d = Decode(w, ring->get());
    return d.payloads.size() == 2 &&
           d.payloads.at(2).size() == d.headers.at(2).contract().payload_bytes();
  }));
  const Decoded d = Decode(call_->written(), ring->get());
  EXPECT_EQ(d.protocol_error, "");
  EXPECT_EQ(d.opened->transport(), v1::TRANSPORT_SHM);
  ExpectAuxOf(d, 1, Ids(1));
  ExpectAuxOf(d, 2, Ids(2));
  for (const StreamMessage& m : call_->written()) EXPECT_FALSE(m.is_chunk);
}

// P13 item 6: another local process truncating the student's ring after the
// Open used to kill the teacher with SIGBUS at the first payload. Now that
// stream ends with DATA_LOSS naming the ring, and the teacher (this process)
// serves its next stream as before.
TEST_F(StreamSessionTest, ShmRingTruncatedAfterOpenEndsTheStreamWithDataLoss) {
  ShmRingOptions ring_options;
  ring_options.name = absl::StrCat("/specstream-session-test-truncated-", getpid());
  ring_options.capacity = 1 << 20;
  auto ring = ShmRing::Create(ring_options);
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open(v1::TRANSPORT_SHM, ring->get());
  ASSERT_TRUE(call_->Await([](const auto& w, const auto&) { return !w.empty(); }));  // Opened
  const int fd = shm_open(ring_options.name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  Credit(1);
  Request(1, 1);
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_EQ(call_->finished()->code(), absl::StatusCode::kDataLoss) << *call_->finished();
  EXPECT_NE(call_->finished()->message().find(ring_options.name), std::string::npos);
  EXPECT_NE(call_->finished()->message().find("truncated"), std::string::npos);

  int64_t sent = 0;
  EXPECT_EQ(session_->OnDone(&sent).code(), absl::StatusCode::kDataLoss);
  call_->Stop();

  // The next stream, on the same batcher and runtime.
  Configure();
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open();
  Credit(1);
  Request(2, 2);
  ASSERT_TRUE(call_->Await([](const auto& w, const auto&) {
    const Decoded d = Decode(w);
    return d.payloads.count(2) == 1 &&
           d.payloads.at(2).size() == d.headers.at(2).contract().payload_bytes();
  }));
  ExpectAuxOf(Decode(call_->written()), 2, Ids(2));
}

TEST_F(StreamSessionTest, NcclPayloadsGoOutOfBandAfterTheJoin) {
  const PayloadChannelFactory channels = testing::LoopbackChannelFactory();
  Configure(8, 4096, 4096, channels.join);
  auto id = channels.new_id();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open(v1::TRANSPORT_NCCL, nullptr, *id);
  Credit(1);
  Request(1, 1);
  // Nothing is written before the student joins: Opened waits for it.
  EXPECT_EQ(session_->phase(), StreamSession::Phase::kConnecting);
  EXPECT_TRUE(call_->written().empty());
  PayloadChannelOptions student;
  student.rank = 1;
  auto channel = channels.join(*id, student);
  ASSERT_TRUE(channel.ok()) << channel.status();
  ASSERT_TRUE(AwaitHeaders(1));
  const Decoded d = Decode(call_->written(), nullptr, /*chunks_follow_headers=*/false);
  EXPECT_EQ(d.protocol_error, "");
  ASSERT_TRUE(d.opened.has_value());
  EXPECT_EQ(d.opened->transport(), v1::TRANSPORT_NCCL);
  const v1::TensorContract& contract = d.headers.at(1).contract();
  EXPECT_TRUE(contract.has_device_checksum());
  std::string payload(contract.payload_bytes(), '\0');
  ASSERT_TRUE((*channel)->Recv(payload.data(), payload.size()).ok());
  EXPECT_TRUE(VerifyPayload(contract, payload).ok());
  for (const StreamMessage& m : call_->written()) EXPECT_FALSE(m.is_chunk);
}

TEST_F(StreamSessionTest, NcclIsRefusedWhereTheTeacherHasNone) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Open(v1::TRANSPORT_NCCL, nullptr, std::string(kPayloadChannelIdBytes, 'x'));
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_NE(call_->finished()->message().find("TRANSPORT_NCCL"), std::string::npos);
}

// Two streams naming their own capture layers ({3} and {0, 2}) while the
// runtime is held: their queued samples share one forward, which captures
// the union {0, 2, 3} once; each payload holds its stream's layers only, in
// its order, with a contract of that width.
TEST_F(StreamSessionTest, EachStreamGetsItsOwnCaptureLayersFromOneForward) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Send(OpenRequest({3}));
  RecordingCall call2;
  auto session2 = std::make_shared<StreamSession>(config_, &call2, "test-peer-2");
  call2.Attach(session2.get());
  ASSERT_TRUE(session2->Begin(absl::OkStatus()));
  session2->OnRequest(OpenRequest({0, 2}));
  Credit(4);
  StreamRequest credit;
  credit.mutable_credit()->set_n(4);
  session2->OnRequest(credit);

  runtime_.Hold();
  Request(1, 1);  // taken into a forward, which waits
  auto queued = [&](int64_t n) {
    const absl::Time deadline = absl::Now() + kDeadline;
    while (batcher_->queued_jobs() != n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return batcher_->queued_jobs() == n;
  };
  ASSERT_TRUE(queued(0));
  Request(2, 2);
  session2->OnRequest(SampleRequest(1, 3));
  session2->OnRequest(SampleRequest(2, 4));
  ASSERT_TRUE(queued(3));
  runtime_.Release();
  ASSERT_TRUE(AwaitHeaders(2));
  ASSERT_TRUE(call2.Await([](const auto& w, const auto&) {
    const Decoded d = Decode(w);
    return d.payloads.size() == 2 &&
           d.payloads.at(2).size() == d.headers.at(2).contract().payload_bytes();
  }));
  ASSERT_TRUE(call_->Await([](const auto& w, const auto&) {
    const Decoded d = Decode(w);
    return d.payloads.size() == 2 &&
           d.payloads.at(2).size() == d.headers.at(2).contract().payload_bytes();
  }));
  EXPECT_EQ(runtime_.batch_sizes(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(runtime_.capture_requests(), (std::vector<std::vector<int>>{{3}, {0, 2, 3}}));
  const Decoded one = Decode(call_->written());
  const Decoded two = Decode(call2.written());
  EXPECT_EQ(one.protocol_error, "");
  EXPECT_EQ(two.protocol_error, "");
  ExpectAuxOf(one, 1, Ids(1), {3});
  ExpectAuxOf(one, 2, Ids(2), {3});
  ExpectAuxOf(two, 1, Ids(3), {0, 2});
  ExpectAuxOf(two, 2, Ids(4), {0, 2});

  session2->OnCancel();
  call2.AwaitFinished();
  int64_t sent = 0;
  EXPECT_EQ(session2->OnDone(&sent).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sent, 2);
  call2.Stop();
}

// Capture layer ids the model does not have, or out of order, end the
// stream at Open with INVALID_ARGUMENT naming the field; nothing is written.
TEST_F(StreamSessionTest, BadCaptureLayerIdsEndTheStreamAtOpen) {
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Send(OpenRequest({2, 1}));
  ASSERT_TRUE(call_->AwaitFinished());
  const absl::Status status = *call_->finished();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("open.capture_layer_ids[1]: 1 follows 2"), std::string::npos)
      << status;
  EXPECT_TRUE(call_->written().empty());
  Configure();
  ASSERT_TRUE(session_->Begin(absl::OkStatus()));
  Send(OpenRequest({0, 4}));  // the fake target has 4 layers
  ASSERT_TRUE(call_->AwaitFinished());
  EXPECT_NE(call_->finished()->message().find("open.capture_layer_ids[1]: 4 is outside [0, 4)"),
            std::string::npos)
      << *call_->finished();
}

}  // namespace
}  // namespace specstream::teacher
