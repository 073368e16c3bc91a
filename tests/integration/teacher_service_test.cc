// TeacherService end to end: a real gRPC server on 127.0.0.1 port 0 over a
// tiny random model, talked to by students written against the proto alone
// (the synchronous generated stub; shm chunks read from a ring the student
// creates). Payloads are compared byte for byte with what `dump` stores for
// the same samples.
#include "services/teacher/teacher_service.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc/byte_buffer.h"
#include "common/offline_store.h"
#include "common/transport/contract.h"
#include "common/transport/shm_ring.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "teacher/decode_target.h"
#include "teacher/dump.h"
#include "teacher/hf_runtime.h"
#include "tests/testing/loopback_channel.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"
#if SPECSTREAM_WITH_NCCL
#include "common/transport/nccl_util.h"
#endif

namespace specstream::teacher {
namespace {

using services::kTeacherServiceName;
using services::TeacherServer;
using services::TeacherServerOptions;
using v1::StreamRequest;
using v1::StreamResponse;

constexpr int kSamples = 10;
constexpr int kVocab = 128;

// Sample i: 4..33 tokens; sample 2 has no loss_mask (all ones).
std::vector<int32_t> SampleIds(int i) {
  const int t = 4 + (i * 7) % 30;
  std::vector<int32_t> ids;
  for (int k = 0; k < t; ++k) ids.push_back((i * 31 + k * 17 + 3) % kVocab);
  return ids;
}
std::string SampleMask(int i) {
  if (i == 2) return "";
  std::string mask(SampleIds(i).size(), '\1');
  for (size_t k = 0; k < mask.size() && k < 3; ++k) mask[k] = '\0';
  return mask;
}

// Delegates to a real runtime; records each Forward's batch size, and can
// hold Forward calls at a gate (to make requests pile up deterministically).
class RecordingRuntime final : public TargetRuntime {
 public:
  explicit RecordingRuntime(TargetRuntime& inner) : inner_(inner) {}
  const ModelDescription& Describe() const override { return inner_.Describe(); }
  absl::StatusOr<std::vector<SequenceCapture>> Forward(const ForwardRequest& r) override {
    {
      absl::MutexLock lock(&mu_);
      batches_.push_back(r.sequences.size());
      capture_requests_.push_back(r.capture_layer_ids);
      mu_.Await(absl::Condition(&gate_open_));
    }
    return inner_.Forward(r);
  }
  void SetGate(bool open) {
    absl::MutexLock lock(&mu_);
    gate_open_ = open;
  }
  std::vector<size_t> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // Each Forward's ForwardRequest::capture_layer_ids.
  std::vector<std::vector<int>> capture_requests() {
    absl::MutexLock lock(&mu_);
    return capture_requests_;
  }
  bool AwaitCalls(size_t n, absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return batches_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  TargetRuntime& inner_;
  absl::Mutex mu_;
  std::vector<size_t> batches_;
  std::vector<std::vector<int>> capture_requests_;
  bool gate_open_ = true;
};

struct ReceivedSample {
  StreamResponse::SampleHeader header;
  std::string payload;
};

// What a student saw on one stream.
struct StreamState {
  std::optional<StreamResponse::Opened> opened;
  std::vector<ReceivedSample> samples;                     // complete payloads, in arrival order
  std::map<uint64_t, StreamResponse::SampleError> errors;  // by request id
  int headers = 0;
  std::string protocol_error;  // the first protocol violation seen
  bool ended = false;
};

// A student's end of StreamHiddenStates: a reader thread assembles payloads
// (inline chunks, or shm records copied out of its own ring and released)
// and checks the protocol's ordering rules as it goes.
class TestStream final {
 public:
  explicit TestStream(v1::TeacherService::Stub* stub) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    stream_ = stub->StreamHiddenStates(&context_);
  }
  ~TestStream() {
    if (reader_.joinable()) {
      context_.TryCancel();
      reader_.join();
    }
  }

  // TRANSPORT_SHM: the ring this student creates for the teacher.
  void CreateRing(uint64_t capacity) {
    ShmRingOptions options;
    options.name = absl::StrCat("/specstream-test-", getpid(), "-", next_ring_++, "-",
                                reinterpret_cast<uintptr_t>(this));
    options.capacity = capacity;
    auto ring = ShmRing::Create(options);
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = *std::move(ring);
  }

  void Open(v1::Transport transport, uint64_t max_chunk_bytes = 0,
            v1::DType contract_dtype = v1::DTYPE_UNSPECIFIED,
            const std::vector<int32_t>& capture_layer_ids = {}) {
    StreamRequest request;
    StreamRequest::Open* open = request.mutable_open();
    open->set_transport(transport);
    open->mutable_capture_layer_ids()->Add(capture_layer_ids.begin(), capture_layer_ids.end());
    open->set_max_chunk_bytes(max_chunk_bytes);
    open->set_contract_dtype(contract_dtype);
    if (ring_) {
      open->set_shm_name(ring_->name());
      open->set_shm_capacity(ring_->capacity());
    }
    Write(request);
    StartReading();
  }
  void StartReading() {
    if (!reader_.joinable()) reader_ = std::thread([this] { ReadLoop(); });
  }
  void Credit(uint32_t n) {
    StreamRequest request;
    request.mutable_credit()->set_n(n);
    Write(request);
  }
  void Ack(const std::vector<int64_t>& ids) {
    StreamRequest request;
    for (int64_t id : ids) request.mutable_ack()->add_sample_ids(id);
    Write(request);
  }
  // Sample `i` of the data set (or a whole custom request).
  void Request(uint64_t request_id, int i, int64_t slice_begin = 0, int64_t slice_end = 0,
               int64_t halo_before = 0, int64_t halo_after = 0) {
    StreamRequest request;
    StreamRequest::SampleRequest* s = request.mutable_sample();
    s->set_request_id(request_id);
    s->set_sample_id(i);
    for (int32_t id : SampleIds(i)) s->add_token_ids(id);
    s->set_loss_mask(SampleMask(i));
    s->set_slice_begin(slice_begin);
    s->set_slice_end(slice_end);
    s->set_halo_before(halo_before);
    s->set_halo_after(halo_after);
    Write(request);
  }
  void Write(const StreamRequest& request) { stream_->Write(request); }

  // Waits (60 s at most) until `done` holds for the state.
  bool Await(const std::function<bool(const StreamState&)>& done,
             absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(state_); };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }
  bool AwaitSamples(size_t n) {
    return Await([n](const StreamState& s) { return s.samples.size() >= n || s.ended; });
  }
  StreamState state() {
    absl::MutexLock lock(&mu_);
    return state_;
  }

  // Half-closes, reads what remains and returns the call's status.
  grpc::Status Finish() {
    stream_->WritesDone();
    return AwaitEnd();
  }
  // The call's status once the teacher ends it.
  grpc::Status AwaitEnd() {
    StartReading();
    reader_.join();
    return stream_->Finish();
  }

 private:
  void ReadLoop() {
    StreamResponse response;
    std::optional<ReceivedSample> current;
    while (stream_->Read(&response)) {
      absl::MutexLock lock(&mu_);
      auto violation = [&](const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (state_.protocol_error.empty()) state_.protocol_error = what;
      };
      switch (response.kind_case()) {
        case StreamResponse::kOpened:
          if (state_.opened || state_.headers > 0 || !state_.errors.empty()) {
            violation("Opened is not the first message");
          }
          state_.opened = response.opened();
          break;
        case StreamResponse::kHeader:
          if (current) violation("a header inside another payload");
          if (!ValidateContract(response.header().contract()).ok()) violation("bad contract");
          ++state_.headers;
          current = ReceivedSample{response.header(), ""};
          break;
        case StreamResponse::kChunk: {
          const StreamResponse::PayloadChunk& chunk = response.chunk();
          if (!current || chunk.request_id() != current->header.request_id() ||
              chunk.offset() != current->payload.size()) {
            violation("a chunk out of order");
            break;
          }
          if (ring_) {
            if (!chunk.data().empty() || !chunk.has_shm()) violation("an shm chunk without shm");
            auto bytes = ring_->Read(chunk.shm().position(), chunk.shm().length());
            if (!bytes.ok()) {
              violation(std::string(bytes.status().message()));
              break;
            }
            current->payload.append(bytes->data(), bytes->size());
            if (!ring_->Release(chunk.shm().position() + chunk.shm().length()).ok()) {
              violation("release failed");
            }
          } else {
            if (chunk.data().empty()) violation("an empty inline chunk");
            current->payload += chunk.data();
          }
          if (current->payload.size() > current->header.contract().payload_bytes()) {
            violation("a payload longer than its contract");
          }
          if (current->payload.size() == current->header.contract().payload_bytes()) {
            state_.samples.push_back(*std::move(current));
            current.reset();
          }
          break;
        }
        case StreamResponse::kError:
          if (current) violation("a SampleError inside a payload");
          state_.errors[response.error().request_id()] = response.error();
          break;
        default:
          violation("a StreamResponse with no kind");
      }
    }
    absl::MutexLock lock(&mu_);
    state_.ended = true;
  }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<StreamRequest, StreamResponse>> stream_;
  std::unique_ptr<ShmRing> ring_;
  std::thread reader_;
  absl::Mutex mu_;
  StreamState state_ ABSL_GUARDED_BY(mu_);
  static inline std::atomic<int> next_ring_{0};
};

class TeacherServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    specstream::testing::TinyModelOptions model;
    model.vocab = kVocab;
    specstream::testing::WriteTinyModel(dir_.Join("model"), model);
    HfRuntimeOptions options;
    options.model_dir = dir_.Join("model");
    options.dtype = "float32";
    auto runtime = HfRuntime::Create(options);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = std::move(*runtime);
    recording_ = std::make_unique<RecordingRuntime>(*runtime_);
    std::string data;
    for (int i = 0; i < kSamples; ++i) {
      nlohmann::json record;
      record["input_ids"] = SampleIds(i);
      const std::string mask = SampleMask(i);
      if (!mask.empty()) record["loss_mask"] = std::vector<int>(mask.begin(), mask.end());
      data += record.dump() + "\n";
    }
    specstream::testing::WriteFile(dir_.Join("data.jsonl"), data);
  }

  void TearDown() override {
    recording_->SetGate(true);  // a failed test may have left a forward held
    if (server_) server_->Shutdown(absl::Seconds(5));
  }

  // The offline store of the data set in `dtype`, one sample per forward.
  const StoreReader& Store(const std::string& dtype) {
    auto& reader = stores_[dtype];
    if (!reader) {
      DumpOptions options;
      options.data = dir_.Join("data.jsonl");
      options.out = dir_.Join("store-" + dtype);
      options.batch_tokens = 1;
      options.keep_target_ids = true;
      options.store_dtype = dtype;
      options.progress_terminal = 0;
      auto summary = RunDump(*runtime_, options);
      EXPECT_TRUE(summary.ok()) << summary.status();
      auto opened = StoreReader::Open(options.out);
      EXPECT_TRUE(opened.ok()) << opened.status();
      reader = *std::move(opened);
    }
    return *reader;
  }

  // What the store holds for rows [row_begin, row_end) of sample `id`, laid
  // out as `contract` says (names and order from the contract, bytes from
  // the store).
  std::string Expected(const StoreReader& store, int64_t id, const v1::TensorContract& contract,
                       int64_t row_begin, int64_t row_end) {
    auto views = store.Get(id);
    EXPECT_TRUE(views.ok()) << views.status();
    if (!views.ok()) return "";
    std::string out;
    for (const v1::TensorSpec& spec : contract.tensors()) {
      const TensorView* view = nullptr;
      for (const TensorView& v : *views) {
        if (v.name == spec.name()) view = &v;
      }
      EXPECT_NE(view, nullptr) << spec.name();
      if (view == nullptr) return "";
      EXPECT_EQ(ToProtoDType(view->dtype), spec.dtype()) << spec.name();
      EXPECT_EQ(spec.shape(0), row_end - row_begin) << spec.name();
      const size_t row_bytes = view->nbytes / view->shape[0];
      out.append(reinterpret_cast<const char*>(view->data) + row_begin * row_bytes,
                 (row_end - row_begin) * row_bytes);
    }
    return out;
  }

  // Dumps the store in the payload dtype first: the runtime serves one
  // thread at a time, and once the server runs it belongs to the server.
  void StartServer(TeacherServiceOptions options) {
    Store(options.payload_dtype);
    TeacherServerOptions server_options;
    server_options.service = std::move(options);
    auto server = TeacherServer::Start(*recording_, server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(
        static_cast<int>(server_->core().description().max_message_bytes()));
    channel_ =
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args);
    stub_ = v1::TeacherService::NewStub(channel_);
  }

  // Requests every sample (credits `credits`, acking each on arrival) and
  // checks each payload against the store in `dtype`.
  void StreamAllAndCompare(TestStream& stream, const std::string& dtype, uint32_t credits) {
    stream.Credit(credits);
    for (int i = 0; i < kSamples; ++i) stream.Request(100 + i, i);
    size_t acked = 0;
    while (acked < kSamples) {
      ASSERT_TRUE(stream.AwaitSamples(acked + 1)) << "timed out after " << acked << " samples";
      StreamState state = stream.state();
      ASSERT_EQ(state.protocol_error, "");
      ASSERT_FALSE(state.ended && state.samples.size() <= acked) << "stream ended early";
      for (; acked < state.samples.size(); ++acked) {
        const ReceivedSample& s = state.samples[acked];
        stream.Ack({s.header.sample_id()});
        const int64_t id = s.header.sample_id();
        EXPECT_EQ(s.header.request_id(), static_cast<uint64_t>(100 + id));
        EXPECT_EQ(s.header.row_begin(), 0);
        EXPECT_EQ(s.header.row_end(), static_cast<int64_t>(SampleIds(id).size()));
        EXPECT_TRUE(VerifyPayload(s.header.contract(), s.payload).ok());
        EXPECT_TRUE(s.payload ==
                    Expected(Store(dtype), id, s.header.contract(), 0, s.header.row_end()))
            << "sample " << id << " differs from the store";
      }
    }
    grpc::Status status = stream.Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(stream.state().errors.empty());
  }

  specstream::testing::TempDir dir_;
  std::unique_ptr<HfRuntime> runtime_;
  std::unique_ptr<RecordingRuntime> recording_;
  std::map<std::string, std::unique_ptr<StoreReader>> stores_;
  std::unique_ptr<TeacherServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TeacherService::Stub> stub_;
};

TeacherServiceOptions Options(const std::string& dtype = "bfloat16") {
  TeacherServiceOptions options;
  options.payload_dtype = dtype;
  options.keep_target_ids = true;
  options.max_tokens = 64;
  options.max_batch_tokens = 1;  // as the store was dumped: byte-identical captures
  return options;
}

TEST_F(TeacherServiceTest, DescribeReportsTheModelAndTheTransports) {
  StartServer(Options("float16"));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::DescribeResponse d;
  grpc::Status status = stub_->Describe(&context, v1::DescribeRequest(), &d);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const ModelDescription& model = runtime_->Describe();
  EXPECT_EQ(d.model_type(), "llama");
  EXPECT_EQ(d.hidden_size(), model.hidden_size);
  EXPECT_EQ(d.vocab_size(), kVocab);
  EXPECT_EQ(d.num_layers(), 8);
  EXPECT_EQ(std::vector<int>(d.capture_layer_ids().begin(), d.capture_layer_ids().end()),
            model.capture_layer_ids);
  EXPECT_EQ(d.dtype(), v1::DTYPE_F16);
  EXPECT_EQ(d.max_tokens(), 64);
  ASSERT_EQ(d.transports_size(), 2);
  EXPECT_EQ(d.transports(0), v1::TRANSPORT_INLINE);
  EXPECT_EQ(d.transports(1), v1::TRANSPORT_SHM);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(d.hostname(), host);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  EXPECT_EQ(d.boot_id(), boot_id);
  EXPECT_GE(d.max_message_bytes(), static_cast<int64_t>((1 << 20) + kMaxChunkHeaderBytes));
}

// An NCCL device is checked when the server starts and then advertised.
// rpc Answer (data.regenerate): the target's own answer, what TargetAnswers
// (`dump --regenerate`, `specstream-eval generate`) writes, greedy and
// sampled by seed + sample id; a repeated request is decoded once; the
// prompt plus the answer stays within max_tokens; answers asked at once are
// decoded together in batched steps, each still what it is alone; bad
// requests name their field.
TEST_F(TeacherServiceTest, AnswerGivesWhatTheTargetWritesDecodesARepeatOnceAndBatches) {
  std::vector<int32_t> prompt = SampleIds(2);
  prompt.resize(5);
  std::vector<int32_t> long_prompt(63, 7);  // max_tokens 64 leaves one answer token
  // The references, before the server owns the runtime.
  std::vector<std::vector<int32_t>> expected;
  for (double temperature : {0.0, 1.0}) {
    spec::DecodeOptions decode;
    decode.max_new_tokens = 16;
    decode.temperature = temperature;
    decode.seed = 7;
    decode.stop_ids = StopIds(runtime_->config(), nullptr);
    TargetAnswers answers(*runtime_, decode);
    auto answer = answers.Answer(prompt, /*id=*/3);
    ASSERT_TRUE(answer.ok()) << answer.status();
    expected.push_back(answer->tokens);
  }
  ASSERT_NE(expected[0], expected[1]);  // sampling changed something
  // Four more, asked at once below (sample ids 10..13, sampled, 40 tokens
  // after 6 prompt ids: within max_tokens).
  auto short_prompt = [](int id) {
    std::vector<int32_t> ids = SampleIds(id % kSamples);
    ids.resize(6);
    return ids;
  };
  std::vector<std::vector<int32_t>> concurrent;
  for (int id = 10; id < 14; ++id) {
    spec::DecodeOptions decode;
    decode.max_new_tokens = 40;
    decode.temperature = 1;
    decode.seed = 7;
    decode.stop_ids = StopIds(runtime_->config(), nullptr);
    TargetAnswers answers(*runtime_, decode);
    auto answer = answers.Answer(short_prompt(id), id);
    ASSERT_TRUE(answer.ok()) << answer.status();
    concurrent.push_back(answer->tokens);
  }
  TeacherServerOptions server_options;
  server_options.service = Options("float32");
  auto server = TeacherServer::Start(*runtime_, server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  stub_ = v1::TeacherService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(server_->core().description().answers());

  auto ask = [&](const std::vector<int32_t>& ids, int64_t max_new, double temperature,
                 std::vector<int32_t>* out, int64_t sample_id = 3) {
    v1::AnswerRequest request;
    request.set_sample_id(sample_id);
    request.mutable_prompt_ids()->Add(ids.begin(), ids.end());
    request.set_max_new_tokens(max_new);
    request.set_temperature(temperature);
    request.set_seed(7);
    grpc::ClientContext context;
    v1::AnswerResponse response;
    const grpc::Status status = stub_->Answer(&context, request, &response);
    if (out != nullptr) out->assign(response.answer_ids().begin(), response.answer_ids().end());
    return status;
  };
  std::vector<int32_t> answer;
  for (int repeat = 0; repeat < 2; ++repeat) {
    for (int t = 0; t < 2; ++t) {
      const grpc::Status status = ask(prompt, 16, t, &answer);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(answer, expected[t]) << "temperature " << t << ", repeat " << repeat;
    }
  }
  TeacherCore::Stats stats = server_->core().stats();
  EXPECT_EQ(stats.answers_decoded, 2);
  EXPECT_EQ(stats.answers_reused, 2);
  ASSERT_TRUE(ask(long_prompt, 16, 0, &answer).ok());
  EXPECT_EQ(answer.size(), 1u);

  // Asked at once, the four are decoded together (more than one answer per
  // batched step on average) and each is what it is alone.
  stats = server_->core().stats();
  std::vector<std::vector<int32_t>> got(4);
  std::vector<grpc::Status> statuses(4);
  std::vector<std::thread> askers;
  for (int j = 0; j < 4; ++j) {
    askers.emplace_back(
        [&, j] { statuses[j] = ask(short_prompt(10 + j), 40, 1, &got[j], 10 + j); });
  }
  for (std::thread& asker : askers) asker.join();
  for (int j = 0; j < 4; ++j) {
    ASSERT_TRUE(statuses[j].ok()) << statuses[j].error_message();
    EXPECT_EQ(got[j], concurrent[j]) << "sample " << 10 + j;
  }
  const TeacherCore::Stats after = server_->core().stats();
  const int64_t steps = after.answer_steps - stats.answer_steps;
  const int64_t rows = after.answer_step_rows - stats.answer_step_rows;
  EXPECT_GT(rows, steps) << rows << " answer rows in " << steps << " steps";
  std::cout << "4 answers at once: " << rows << " rows in " << steps << " batched steps\n";

  const std::vector<std::tuple<std::vector<int32_t>, int64_t, double, std::string>> bad = {
      {{}, 16, 0, "prompt_ids: 0 ids"},
      {{1, kVocab, 2}, 16, 0, "prompt_ids[1]: 128 is outside the vocabulary"},
      {std::vector<int32_t>(64, 1), 16, 0, "prompt_ids: 64 ids"},
      {prompt, 0, 0, "max_new_tokens: 0 must be >= 1"},
      {prompt, 16, -1, "temperature: -1 must be finite"},
  };
  for (const auto& [ids, max_new, temperature, message] : bad) {
    const grpc::Status status = ask(ids, max_new, temperature, nullptr);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_NE(status.error_message().find(message), std::string::npos) << status.error_message();
  }
}

// A runtime that does not decode (here one wrapping the hf runtime; TP and
// sglang runtimes alike) says so in Describe and answers UNIMPLEMENTED.
TEST_F(TeacherServiceTest, AnswerIsUnimplementedWhereTheRuntimeDoesNotDecode) {
  StartServer(Options());
  EXPECT_FALSE(server_->core().description().answers());
  v1::AnswerRequest request;
  request.add_prompt_ids(1);
  request.set_max_new_tokens(4);
  grpc::ClientContext context;
  v1::AnswerResponse response;
  const grpc::Status status = stub_->Answer(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(status.error_message().find("--runtime hf"), std::string::npos)
      << status.error_message();
}

TEST_F(TeacherServiceTest, NcclDeviceIsCheckedAndAdvertised) {
  Store("bfloat16");
  TeacherServerOptions server_options;
#if SPECSTREAM_WITH_NCCL
  const int devices = CudaDeviceCount();
  server_options.service.nccl_device = devices;  // one past the last
  auto refused = TeacherServer::Start(*recording_, server_options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(absl::StrCat("nccl_device: CUDA device ", devices)),
            std::string::npos)
      << refused.status();
  if (devices == 0) return;
  server_options.service.nccl_device = 0;
  auto server = TeacherServer::Start(*recording_, server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto& transports = (*server)->core().description().transports();
  EXPECT_EQ(transports.Get(transports.size() - 1), v1::TRANSPORT_NCCL);
#else
  server_options.service.nccl_device = 0;
  auto refused = TeacherServer::Start(*recording_, server_options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("nccl_device: this teacher was built without NCCL"),
            std::string::npos)
      << refused.status();
#endif
}

// TRANSPORT_NCCL's Open (over the in-process test channel, so without a
// GPU): the id is checked, Opened comes only after the student joined, and
// nothing (not even a SampleError) is written before it; a student that
// never joins ends the stream after nccl_timeout.
TEST_F(TeacherServiceTest, NcclOpenAnswersOnlyAfterTheJoin) {
  const PayloadChannelFactory channel = specstream::testing::LoopbackChannelFactory();
  TeacherServiceOptions options = Options();
  options.nccl_channel_for_testing = channel.join;
  options.nccl_timeout = absl::Seconds(1);
  StartServer(options);
  EXPECT_EQ(server_->core().description().transports(2), v1::TRANSPORT_NCCL);
  auto open_nccl = [&](TestStream& stream, const std::string& id) {
    StreamRequest request;
    request.mutable_open()->set_transport(v1::TRANSPORT_NCCL);
    request.mutable_open()->set_nccl_unique_id(id);
    stream.Write(request);
    StreamRequest bad;  // answered with a SampleError, after Opened
    bad.mutable_sample()->set_request_id(7);
    bad.mutable_sample()->add_token_ids(kVocab + 5);
    stream.Write(bad);
    stream.StartReading();
  };
  {
    TestStream stream(stub_.get());
    open_nccl(stream, "short");
    const grpc::Status status = stream.AwaitEnd();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("open.nccl_unique_id: 5 bytes"), std::string::npos)
        << status.error_message();
  }
  {  // nobody joins
    TestStream stream(stub_.get());
    absl::StatusOr<std::string> id = channel.new_id();
    ASSERT_TRUE(id.ok());
    const absl::Time start = absl::Now();
    open_nccl(stream, *id);
    const grpc::Status status = stream.AwaitEnd();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
    EXPECT_NE(status.error_message().find("open.nccl_unique_id"), std::string::npos)
        << status.error_message();
    EXPECT_LT(absl::Now() - start, absl::Seconds(30));
    const StreamState state = stream.state();
    EXPECT_FALSE(state.opened.has_value());
    EXPECT_TRUE(state.errors.empty());
  }
  {  // the student joins late: Opened, then the SampleError
    TestStream stream(stub_.get());
    absl::StatusOr<std::string> id = channel.new_id();
    ASSERT_TRUE(id.ok());
    open_nccl(stream, *id);
    // Not a wait: the student stays away 300 ms, and Opened must wait for it.
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_FALSE(stream.state().opened.has_value());
    PayloadChannelOptions student;
    student.rank = 1;
    student.timeout = absl::Seconds(10);
    auto joined = channel.join(*id, student);
    ASSERT_TRUE(joined.ok()) << joined.status();
    ASSERT_TRUE(stream.Await([](const StreamState& s) { return !s.errors.empty() || s.ended; }));
    const StreamState state = stream.state();
    ASSERT_TRUE(state.opened.has_value())
        << "ended: " << state.ended << ", errors: " << state.errors.size()
        << ", protocol: " << state.protocol_error;
    EXPECT_EQ(state.opened->transport(), v1::TRANSPORT_NCCL);
    EXPECT_TRUE(state.protocol_error.empty()) << state.protocol_error;
    ASSERT_EQ(state.errors.count(7), 1u);
    EXPECT_EQ(state.errors.at(7).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(stream.Finish().ok());
  }
}

class TeacherServicePayloadTest : public TeacherServiceTest,
                                  public ::testing::WithParamInterface<std::string> {};

TEST_P(TeacherServicePayloadTest, InlinePayloadsAreTheDumpsBytes) {
  StartServer(Options(GetParam()));
  TestStream stream(stub_.get());
  stream.Open(v1::TRANSPORT_INLINE, /*max_chunk_bytes=*/1000);
  StreamAllAndCompare(stream, GetParam(), /*credits=*/3);
  ASSERT_TRUE(stream.state().opened.has_value());
  EXPECT_EQ(stream.state().opened->transport(), v1::TRANSPORT_INLINE);
  EXPECT_EQ(stream.state().opened->chunk_bytes(), 1000u);
}

TEST_P(TeacherServicePayloadTest, ShmPayloadsAreTheDumpsBytes) {
  StartServer(Options(GetParam()));
  TestStream stream(stub_.get());
  // A ring far smaller than most payloads: records wrap and the teacher
  // waits for the student to release space.
  stream.CreateRing(4096);
  stream.Open(v1::TRANSPORT_SHM);
  StreamAllAndCompare(stream, GetParam(), /*credits=*/2);
  ASSERT_TRUE(stream.state().opened.has_value());
  EXPECT_EQ(stream.state().opened->transport(), v1::TRANSPORT_SHM);
  EXPECT_EQ(stream.state().opened->chunk_bytes(), 2048u);  // half the ring
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TeacherServicePayloadTest,
                         ::testing::Values("bfloat16", "float32", "float16"));

TEST_F(TeacherServiceTest, ContextParallelSlicesCarryTheirHalos) {
  StartServer(Options("float32"));
  // Sample 4 has 4 + 28 = 32 tokens; three CP shards with TTT halos.
  ASSERT_EQ(SampleIds(4).size(), 32u);
  struct Slice {
    int64_t begin, end, halo_before, halo_after, row_begin, row_end;
  };
  const std::vector<Slice> slices = {
      {0, 11, 0, 3, 0, 14}, {11, 22, 2, 3, 9, 25}, {22, 32, 2, 7, 20, 32}, {5, 6, 50, 50, 0, 32}};
  for (const bool shm : {false, true}) {
    TestStream stream(stub_.get());
    if (shm) stream.CreateRing(8192);
    stream.Open(shm ? v1::TRANSPORT_SHM : v1::TRANSPORT_INLINE, shm ? 0 : 700);
    stream.Credit(static_cast<uint32_t>(slices.size()));
    for (size_t k = 0; k < slices.size(); ++k) {
      const Slice& s = slices[k];
      stream.Request(k + 1, 4, s.begin, s.end, s.halo_before, s.halo_after);
    }
    ASSERT_TRUE(stream.AwaitSamples(slices.size()));
    StreamState state = stream.state();
    ASSERT_EQ(state.protocol_error, "");
    ASSERT_EQ(state.samples.size(), slices.size());
    for (const ReceivedSample& r : state.samples) {
      const Slice& s = slices[r.header.request_id() - 1];
      EXPECT_EQ(r.header.row_begin(), s.row_begin);
      EXPECT_EQ(r.header.row_end(), s.row_end);
      for (const v1::TensorSpec& spec : r.header.contract().tensors()) {
        EXPECT_EQ(spec.shape(0), s.row_end - s.row_begin) << spec.name();
      }
      EXPECT_TRUE(r.payload ==
                  Expected(Store("float32"), 4, r.header.contract(), s.row_begin, s.row_end))
          << "slice " << r.header.request_id() << (shm ? " (shm)" : " (inline)");
    }
    EXPECT_TRUE(stream.Finish().ok());
  }
}

TEST_F(TeacherServiceTest, BadRequestsGetInvalidArgumentAndTheStreamContinues) {
  StartServer(Options());
  TestStream stream(stub_.get());
  stream.Open(v1::TRANSPORT_INLINE);
  auto send = [&](uint64_t request_id, std::vector<int32_t> ids, std::string mask,
                  int64_t slice_begin = 0, int64_t slice_end = 0, int64_t halo_before = 0,
                  int64_t halo_after = 0) {
    StreamRequest request;
    StreamRequest::SampleRequest* s = request.mutable_sample();
    s->set_request_id(request_id);
    s->set_sample_id(static_cast<int64_t>(request_id));
    for (int32_t id : ids) s->add_token_ids(id);
    s->set_loss_mask(mask);
    s->set_slice_begin(slice_begin);
    s->set_slice_end(slice_end);
    s->set_halo_before(halo_before);
    s->set_halo_after(halo_after);
    stream.Write(request);
  };
  const std::vector<int32_t> ok = {1, 2, 3, 4, 5};
  // Waits for a credit, so its request id is in use below.
  send(50, ok, "");
  std::map<uint64_t, std::string> expected = {
      {1, "sample.token_ids[3]: id 128 is outside the vocab [0, 128)"},
      {2, "sample.token_ids[0]: id -1 is outside the vocab"},
      {3, "sample.token_ids: 65 tokens, over max_tokens 64"},
      {4, "sample.token_ids: empty"},
      {5, "sample.loss_mask: 3 bytes for 5 tokens"},
      {6, "sample.loss_mask[1]: 2 is not 0 or 1"},
      {7, "sample.slice_begin/slice_end: [3, 3)"},
      {8, "sample.slice_begin/slice_end: [2, 6)"},
      {9, "sample.slice_begin: 1 with slice_end 0"},
      {10, "sample.halo_before: -1 < 0"},
      {11, "sample.halo_after: 2 with slice_end 0"},
      {50, "sample.request_id: 50 is already in use on this stream"},
      {0, "sample.request_id: must be > 0"},
  };
  send(1, {1, 2, 3, 128, 4}, "");
  send(2, {-1, 2}, "");
  send(3, std::vector<int32_t>(65, 7), "");
  send(4, {}, "");
  send(5, ok, std::string(3, '\1'));
  send(6, ok, std::string("\1\2\1\1\1", 5));
  send(7, ok, "", 3, 3);
  send(8, ok, "", 2, 6);
  send(9, ok, "", 1, 0);
  send(10, ok, "", 1, 3, -1, 0);
  send(11, ok, "", 0, 0, 0, 2);
  send(50, ok, "");
  send(0, ok, "");
  ASSERT_TRUE(stream.Await([&](const StreamState& s) {
    return s.errors.size() >= expected.size();
  })) << stream.state().errors.size();
  StreamState state = stream.state();
  ASSERT_EQ(state.errors.size(), expected.size());
  for (const auto& [request_id, message] : expected) {
    ASSERT_EQ(state.errors.count(request_id), 1u) << request_id;
    const StreamResponse::SampleError& error = state.errors[request_id];
    EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << request_id;
    EXPECT_NE(error.message().find(message), std::string::npos)
        << "request " << request_id << ": " << error.message();
  }
  EXPECT_EQ(state.headers, 0);
  // The stream still serves: the waiting request and a new one.
  stream.Credit(2);
  stream.Request(60, 1);
  ASSERT_TRUE(stream.AwaitSamples(2));
  state = stream.state();
  ASSERT_EQ(state.samples.size(), 2u);
  EXPECT_EQ(state.samples[0].header.request_id() + state.samples[1].header.request_id(), 110u);
  EXPECT_TRUE(stream.Finish().ok());
}

TEST_F(TeacherServiceTest, BadOpensEndTheStreamWithTheirReasons) {
  StartServer(Options());
  struct Case {
    std::function<void(TestStream&)> send;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
    {[](TestStream& s) { s.Credit(1); }, grpc::StatusCode::INVALID_ARGUMENT,
     "the first StreamRequest must be Open"},
    {[](TestStream& s) { s.Request(1, 0); }, grpc::StatusCode::INVALID_ARGUMENT,
     "the first StreamRequest must be Open"},
#if SPECSTREAM_WITH_NCCL
    // Options() offers no NCCL device.
    {[](TestStream& s) { s.Open(v1::TRANSPORT_NCCL); }, grpc::StatusCode::FAILED_PRECONDITION,
     "open.transport: TRANSPORT_NCCL: this teacher has no CUDA device for NCCL"},
#else
    {[](TestStream& s) { s.Open(v1::TRANSPORT_NCCL); }, grpc::StatusCode::UNIMPLEMENTED,
     "open.transport: TRANSPORT_NCCL: this teacher was built without NCCL"},
#endif
    {[](TestStream& s) { s.Open(v1::TRANSPORT_UNSPECIFIED); }, grpc::StatusCode::INVALID_ARGUMENT,
     "open.transport: TRANSPORT_UNSPECIFIED"},
    {[](TestStream& s) { s.Open(v1::TRANSPORT_INLINE, 0, v1::DTYPE_F32); },
     grpc::StatusCode::FAILED_PRECONDITION,
     "open.contract_dtype: the student expects DTYPE_F32, this teacher sends DTYPE_BF16"},
    {[](TestStream& s) { s.Open(v1::TRANSPORT_SHM); }, grpc::StatusCode::INVALID_ARGUMENT,
     "open.shm_name: empty"},
    {[](TestStream& s) {
       StreamRequest request;
       request.mutable_open()->set_transport(v1::TRANSPORT_SHM);
       request.mutable_open()->set_shm_name("/specstream-test-no-such-ring");
       s.Write(request);
     },
     grpc::StatusCode::NOT_FOUND, "open.shm_name \"/specstream-test-no-such-ring\""},
    {[](TestStream& s) {
       s.Open(v1::TRANSPORT_INLINE);
       s.Open(v1::TRANSPORT_INLINE);
     },
     grpc::StatusCode::INVALID_ARGUMENT, "open: sent twice"},
    {[](TestStream& s) {
       s.Open(v1::TRANSPORT_INLINE);
       s.Credit(0);
     },
     grpc::StatusCode::INVALID_ARGUMENT, "credit.n: must be > 0"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    TestStream stream(stub_.get());
    cases[i].send(stream);
    grpc::Status status = stream.AwaitEnd();
    EXPECT_EQ(status.error_code(), cases[i].code) << "case " << i << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(cases[i].message), std::string::npos)
        << "case " << i << ": " << status.error_message();
  }
  // The server keeps serving.
  TestStream stream(stub_.get());
  stream.Open(v1::TRANSPORT_INLINE);
  stream.Credit(1);
  stream.Request(1, 3);
  ASSERT_TRUE(stream.AwaitSamples(1));
  EXPECT_EQ(stream.state().samples.size(), 1u);
  EXPECT_TRUE(stream.Finish().ok());
}

TEST_F(TeacherServiceTest, OneCreditWithoutAckAllowsOneSampleInFlight) {
  StartServer(Options());
  TestStream stream(stub_.get());
  stream.Open(v1::TRANSPORT_INLINE);
  stream.Credit(1);
  for (int i = 0; i < 3; ++i) stream.Request(i + 1, i);
  ASSERT_TRUE(stream.AwaitSamples(1));
  stream.Ack({77});  // never sent: ignored, returns no credit
  // Not a wait: for half a second no second sample may come.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(stream.state().headers, 1);
  // The compute thread saw one sample only: nothing more was materialised.
  EXPECT_EQ(recording_->batches().size(), 1u);
  stream.Ack({0});
  ASSERT_TRUE(stream.AwaitSamples(2));
  // Not a wait: a window in which no third sample may come.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(stream.state().headers, 2);
  stream.Ack({1});
  ASSERT_TRUE(stream.AwaitSamples(3));
  StreamState state = stream.state();
  ASSERT_EQ(state.samples.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(state.samples[i].header.sample_id(), i);
  EXPECT_TRUE(stream.Finish().ok());
}

TEST_F(TeacherServiceTest, PendingRequestsAreBatchedIntoOneForward) {
  TeacherServiceOptions options = Options("float32");
  options.max_batch_tokens = 4096;
  StartServer(options);
  recording_->SetGate(false);
  TestStream stream(stub_.get());
  stream.Open(v1::TRANSPORT_INLINE);
  stream.Credit(4);
  stream.Request(1, 0);
  ASSERT_TRUE(recording_->AwaitCalls(1));  // sample 0 is held at the gate
  for (int i = 1; i < 4; ++i) stream.Request(i + 1, i);
  ASSERT_TRUE(testing::WaitUntil([&] { return server_->core().stats().queued_jobs == 3; },
                                 absl::Seconds(20)));  // all three wait behind the gate
  recording_->SetGate(true);
  ASSERT_TRUE(stream.AwaitSamples(4));
  EXPECT_EQ(recording_->batches(), (std::vector<size_t>{1, 3}));
  StreamState state = stream.state();
  ASSERT_EQ(state.protocol_error, "");
  for (const ReceivedSample& s : state.samples) {
    EXPECT_TRUE(VerifyPayload(s.header.contract(), s.payload).ok());
    // Ids and masks are exact; hidden states are the same computation on a
    // padded batch (equal up to float rounding).
    const std::string expected = Expected(Store("float32"), s.header.sample_id(),
                                          s.header.contract(), 0, s.header.row_end());
    ASSERT_EQ(s.payload.size(), expected.size());
    for (const v1::TensorSpec& spec : s.header.contract().tensors()) {
      const std::string got = s.payload.substr(spec.offset(), spec.nbytes());
      const std::string want = expected.substr(spec.offset(), spec.nbytes());
      if (spec.dtype() != v1::DTYPE_F32) {
        if (spec.name() != "target_ids") {
          EXPECT_EQ(got, want) << spec.name();
        }
        continue;
      }
      std::vector<float> a(spec.nbytes() / 4), b(spec.nbytes() / 4);
      std::memcpy(a.data(), got.data(), spec.nbytes());
      std::memcpy(b.data(), want.data(), spec.nbytes());
      for (size_t k = 0; k < a.size(); ++k) {
        ASSERT_NEAR(a[k], b[k], 1e-4 + 1e-4 * std::abs(b[k])) << spec.name() << "[" << k << "]";
      }
    }
  }
  EXPECT_TRUE(stream.Finish().ok());
}

TEST_F(TeacherServiceTest, EightConcurrentStreamsAllComplete) {
  TeacherServiceOptions options = Options("bfloat16");
  options.max_batch_tokens = 4096;
  options.chunk_bytes = 4096;
  StartServer(options);
  Store("bfloat16");  // dumped before the streams start (the runtime is single-threaded)
  constexpr int kStreams = 8;
  std::vector<std::thread> students;
  std::vector<std::string> failures(kStreams);
  std::vector<int> received(kStreams, 0);
  for (int k = 0; k < kStreams; ++k) {
    students.emplace_back([&, k] {
      TestStream stream(stub_.get());
      if (k % 2 == 1) stream.CreateRing(8192);
      stream.Open(k % 2 == 1 ? v1::TRANSPORT_SHM : v1::TRANSPORT_INLINE);
      stream.Credit(2);
      for (int i = 0; i < kSamples; ++i) stream.Request(i + 1, (i + k) % kSamples);
      size_t acked = 0;
      while (acked < kSamples) {
        if (!stream.AwaitSamples(acked + 1)) break;
        StreamState state = stream.state();
        if (!state.protocol_error.empty()) {
          failures[k] = state.protocol_error;
          break;
        }
        if (state.samples.size() <= acked) break;  // ended early
        for (; acked < state.samples.size(); ++acked) {
          const ReceivedSample& s = state.samples[acked];
          if (!VerifyPayload(s.header.contract(), s.payload).ok()) failures[k] = "bad crc";
          stream.Ack({s.header.sample_id()});
        }
      }
      received[k] = static_cast<int>(acked);
      grpc::Status status = stream.Finish();
      if (!status.ok()) failures[k] = status.error_message();
    });
  }
  for (std::thread& t : students) t.join();
  for (int k = 0; k < kStreams; ++k) {
    EXPECT_EQ(failures[k], "") << "stream " << k;
    EXPECT_EQ(received[k], kSamples) << "stream " << k;
  }
  EXPECT_EQ(server_->core().stats().samples_sent, kStreams * kSamples);
  EXPECT_EQ(server_->core().stats().streams, kStreams);
}

// The bytes of tensor `name` in a received payload.
std::string TensorBytes(const ReceivedSample& s, const std::string& name) {
  for (const v1::TensorSpec& spec : s.header.contract().tensors()) {
    if (spec.name() == name) return s.payload.substr(spec.offset(), spec.nbytes());
  }
  ADD_FAILURE() << "no tensor " << name;
  return "";
}

std::vector<int64_t> TensorShape(const ReceivedSample& s, const std::string& name) {
  for (const v1::TensorSpec& spec : s.header.contract().tensors()) {
    if (spec.name() == name) return {spec.shape().begin(), spec.shape().end()};
  }
  return {};
}

// P14 item 2: each stream names its own capture layers. Two streams with
// different sets ({1, 3} and {2, 4, 6}: no layer sits at its own index in
// the union), batched into one forward (the gate makes the batch
// [A:3, A:5, B:3, B:5]), each get exactly their layers' columns, bitwise
// what a stream capturing every layer gets for the same batch; the forward
// captured the union once.
TEST_F(TeacherServiceTest, StreamsWithTheirOwnCaptureLayersShareOneForward) {
  TeacherServiceOptions options = Options("float32");
  options.max_batch_tokens = 4096;
  StartServer(options);
  const int64_t hidden = runtime_->Describe().hidden_size;
  const std::vector<int32_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<int32_t> set_a = {1, 3};
  const std::vector<int32_t> set_b = {2, 4, 6};

  // Holds a plug sample at the gate, queues `requests` (stream, request id,
  // sample) in order, each one behind the last, then opens the gate.
  auto run_batch = [&](TestStream& plug,
                       const std::vector<std::tuple<TestStream*, uint64_t, int>>& requests) {
    const size_t calls = recording_->batches().size();
    recording_->SetGate(false);
    plug.Request(900 + calls, 0);
    ASSERT_TRUE(recording_->AwaitCalls(calls + 1));
    for (size_t i = 0; i < requests.size(); ++i) {
      auto [stream, request_id, sample] = requests[i];
      stream->Request(request_id, sample);
      ASSERT_TRUE(testing::WaitUntil(
          [&] { return server_->core().stats().queued_jobs == static_cast<int64_t>(i + 1); },
          absl::Seconds(20)));
    }
    recording_->SetGate(true);
  };
  auto by_request = [](TestStream& stream, uint64_t request_id) {
    for (const ReceivedSample& s : stream.state().samples) {
      if (s.header.request_id() == request_id) return s;
    }
    ADD_FAILURE() << "no sample for request " << request_id;
    return ReceivedSample{};
  };

  // The reference: one stream capturing every layer, same batch layout.
  TestStream full(stub_.get());
  full.Open(v1::TRANSPORT_INLINE, 0, v1::DTYPE_UNSPECIFIED, all);
  full.Credit(8);
  run_batch(full, {{&full, 1, 3}, {&full, 2, 5}, {&full, 3, 3}, {&full, 4, 5}});
  ASSERT_TRUE(full.AwaitSamples(5));

  TestStream a(stub_.get());
  TestStream b(stub_.get());
  b.CreateRing(1 << 16);
  a.Open(v1::TRANSPORT_INLINE, 0, v1::DTYPE_UNSPECIFIED, set_a);
  b.Open(v1::TRANSPORT_SHM, 0, v1::DTYPE_UNSPECIFIED, set_b);
  a.Credit(8);
  b.Credit(8);
  run_batch(a, {{&a, 1, 3}, {&a, 2, 5}, {&b, 1, 3}, {&b, 2, 5}});
  ASSERT_TRUE(a.AwaitSamples(3));
  ASSERT_TRUE(b.AwaitSamples(2));
  EXPECT_EQ(recording_->batches(), (std::vector<size_t>{1, 4, 1, 4}));
  const std::vector<std::vector<int>> captured = recording_->capture_requests();
  ASSERT_EQ(captured.size(), 4u);
  EXPECT_EQ(captured[1], std::vector<int>(all.begin(), all.end()));
  EXPECT_EQ(captured[3], (std::vector<int>{1, 2, 3, 4, 6}));  // the union, once

  // Stream `stream`'s request `id` against the reference's request `ref_id`.
  auto check = [&](TestStream& stream, uint64_t id, uint64_t ref_id,
                   const std::vector<int32_t>& layers) {
    const ReceivedSample got = by_request(stream, id);
    const ReceivedSample ref = by_request(full, ref_id);
    const int64_t t = ref.header.row_end();
    ASSERT_TRUE(VerifyPayload(got.header.contract(), got.payload).ok());
    EXPECT_EQ(TensorShape(got, "aux_hidden"),
              (std::vector<int64_t>{t, static_cast<int64_t>(layers.size()) * hidden}));
    EXPECT_EQ(TensorShape(ref, "aux_hidden"), (std::vector<int64_t>{t, 8 * hidden}));
    const std::string ref_aux = TensorBytes(ref, "aux_hidden");
    const size_t layer_bytes = hidden * sizeof(float);
    std::string expected;
    for (int64_t row = 0; row < t; ++row) {
      for (int32_t k : layers) expected += ref_aux.substr((row * 8 + k) * layer_bytes, layer_bytes);
    }
    EXPECT_TRUE(TensorBytes(got, "aux_hidden") == expected)
        << "request " << id << ": aux_hidden is not the columns of layers "
        << absl::StrJoin(layers, ",");
    for (const char* name : {"input_ids", "loss_mask", "last_hidden", "target_ids"}) {
      EXPECT_TRUE(TensorBytes(got, name) == TensorBytes(ref, name)) << name;
    }
  };
  check(a, 1, 1, set_a);
  check(a, 2, 2, set_a);
  check(b, 1, 3, set_b);
  check(b, 2, 4, set_b);
  for (TestStream* stream : {&full, &a, &b}) {
    EXPECT_EQ(stream->state().protocol_error, "");
    EXPECT_TRUE(stream->state().errors.empty());
    EXPECT_TRUE(stream->Finish().ok());
  }

  // Describe still reports the teacher's own set, and that streams may ask.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::DescribeResponse d;
  ASSERT_TRUE(stub_->Describe(&context, v1::DescribeRequest(), &d).ok());
  EXPECT_EQ(std::vector<int>(d.capture_layer_ids().begin(), d.capture_layer_ids().end()),
            (std::vector<int>{1, 3, 4}));
  EXPECT_TRUE(d.per_stream_capture_layers());
}

// A stream asking for the teacher's own layers gets the default stream's
// bytes; sets that are not ascending, distinct and within the model are
// refused at Open naming the field, and the teacher keeps serving.
TEST_F(TeacherServiceTest, CaptureLayerIdsAreCheckedAtOpen) {
  StartServer(Options());
  struct Case {
    std::vector<int32_t> ids;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{3, 1}, "open.capture_layer_ids[1]: 1 follows 3 (not ascending)"},
      {{0, 2, 2}, "open.capture_layer_ids[2]: 2 repeats"},
      {{1, 8}, "open.capture_layer_ids[1]: 8 is outside [0, 8)"},
      {{-1, 3}, "open.capture_layer_ids[0]: -1 is outside [0, 8)"},
  };
  for (const Case& c : cases) {
    TestStream stream(stub_.get());
    stream.Open(v1::TRANSPORT_INLINE, 0, v1::DTYPE_UNSPECIFIED, c.ids);
    grpc::Status status = stream.AwaitEnd();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_NE(status.error_message().find(c.message), std::string::npos) << status.error_message();
    EXPECT_FALSE(stream.state().opened.has_value()) << c.message;
  }
  std::string payloads[2];
  for (int k = 0; k < 2; ++k) {
    TestStream stream(stub_.get());
    if (k == 0) {
      stream.Open(v1::TRANSPORT_INLINE);
    } else {
      stream.Open(v1::TRANSPORT_INLINE, 0, v1::DTYPE_UNSPECIFIED, {1, 3, 4});
    }
    stream.Credit(1);
    stream.Request(1, 3);
    ASSERT_TRUE(stream.AwaitSamples(1));
    ASSERT_EQ(stream.state().samples.size(), 1u);
    payloads[k] = stream.state().samples[0].payload;
    EXPECT_TRUE(stream.Finish().ok());
  }
  EXPECT_FALSE(payloads[0].empty());
  EXPECT_TRUE(payloads[0] == payloads[1]);
}

TEST_F(TeacherServiceTest, CorruptionHookMakesTheStudentsCrcCheckFail) {
  TeacherServiceOptions options = Options();
  options.corrupt_payload_for_testing = [](int64_t sample_id, std::string& payload) {
    if (sample_id == 3) payload[payload.size() / 2] ^= 0x40;
  };
  StartServer(options);
  for (const bool shm : {false, true}) {
    TestStream stream(stub_.get());
    if (shm) stream.CreateRing(16384);
    stream.Open(shm ? v1::TRANSPORT_SHM : v1::TRANSPORT_INLINE);
    stream.Credit(5);
    for (int i = 0; i < 5; ++i) stream.Request(i + 1, i);
    ASSERT_TRUE(stream.AwaitSamples(5));
    for (const ReceivedSample& s : stream.state().samples) {
      absl::Status verified = VerifyPayload(s.header.contract(), s.payload);
      if (s.header.sample_id() == 3) {
        EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
        EXPECT_NE(verified.message().find("crc32c"), std::string::npos) << verified;
        // Only the bytes changed: the rest of the sample matches the store.
        EXPECT_NE(s.payload,
                  Expected(Store("bfloat16"), 3, s.header.contract(), 0, s.header.row_end()));
      } else {
        EXPECT_TRUE(verified.ok()) << verified;
      }
    }
    EXPECT_TRUE(stream.Finish().ok());
  }
}

// grpc.health.v1.Health/Check by hand: HealthCheckRequest{service = 1} and
// HealthCheckResponse{status = 1 (enum, SERVING = 1)}.
std::string HealthStatus(const std::shared_ptr<grpc::Channel>& channel, const std::string& name) {
  grpc::GenericStub stub(channel);
  std::string request;
  if (!name.empty()) request = std::string("\x0a", 1) + static_cast<char>(name.size()) + name;
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1), response_buffer;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer,
                 &response_buffer, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) return "error: dump";
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes == std::string("\x08\x01", 2)) return "SERVING";
  if (bytes == std::string("\x08\x02", 2)) return "NOT_SERVING";
  return "unknown";
}

// One raw bidirectional call: writes `request`, half-closes, and collects
// every response's bytes.
class RawBidiCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawBidiCall(grpc::GenericStub* stub, const std::string& method, const std::string& request) {
    grpc::Slice slice(request);
    request_ = grpc::ByteBuffer(&slice, 1);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    stub->PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (ok) StartWritesDone();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    std::vector<grpc::Slice> slices;
    if (response_.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        bytes_.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  // The responses' bytes, or the error.
  std::string Await() {
    done_.WaitForNotification();
    return status_.ok() ? bytes_ : "error: " + status_.error_message();
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_, response_;
  std::string bytes_;  // touched by reads only, which are serialized
  grpc::Status status_;
  absl::Notification done_;
};

TEST_F(TeacherServiceTest, HealthIsServingAndReflectionListsTheService) {
  StartServer(Options());
  EXPECT_EQ(HealthStatus(channel_, ""), "SERVING");
  EXPECT_EQ(HealthStatus(channel_, kTeacherServiceName), "SERVING");
  // ServerReflectionRequest{list_services: ""} (field 7); the answer lists
  // the service names.
  grpc::GenericStub stub(channel_);
  RawBidiCall call(&stub, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                   std::string("\x3a\x00", 2));
  const std::string answer = call.Await();
  EXPECT_NE(answer.find(kTeacherServiceName), std::string::npos) << answer;
  EXPECT_NE(answer.find("grpc.health.v1.Health"), std::string::npos) << answer;
}

TEST_F(TeacherServiceTest, ShutdownFinishesInFlightSamplesAndRefusesTheRest) {
  StartServer(Options());
  recording_->SetGate(false);
  TestStream stream(stub_.get());
  stream.Open(v1::TRANSPORT_INLINE);
  stream.Credit(1);
  for (int i = 0; i < 3; ++i) stream.Request(i + 1, i);
  ASSERT_TRUE(recording_->AwaitCalls(1));  // sample 0 is in the runtime
  std::thread shutdown([&] { server_->Shutdown(absl::Seconds(20)); });
  ASSERT_TRUE(
      testing::WaitUntil([&] { return server_->core().stats().draining; }, absl::Seconds(20)));
  recording_->SetGate(true);
  grpc::Status status = stream.AwaitEnd();
  shutdown.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  StreamState state = stream.state();
  ASSERT_EQ(state.samples.size(), 1u);  // the in-flight sample, whole
  EXPECT_TRUE(VerifyPayload(state.samples[0].header.contract(), state.samples[0].payload).ok());
  ASSERT_EQ(state.errors.size(), 2u);  // the waiting ones
  for (const auto& [id, error] : state.errors) {
    EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  }
  // New streams are refused.
  TestStream late(stub_.get());
  late.Open(v1::TRANSPORT_INLINE);
  EXPECT_NE(late.AwaitEnd().error_code(), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace specstream::teacher
