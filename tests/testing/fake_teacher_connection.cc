#include "tests/testing/fake_teacher_connection.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "common/transport/contract.h"
#include "gtest/gtest.h"
#include "teacher/sample_request.h"
#include "teacher/sample_tensors.h"

namespace specstream::testing {

// One teacher's state, under the connector's mu_.
struct FakeTeacherConnector::Teacher {
  std::string address;
  std::unique_ptr<FakeTargetRuntime> runtime;
  bool down = false;
  bool killed = false;
  int refuse_tokens = 0;  // Describe calls still to refuse UNAUTHENTICATED
  int64_t hidden_delta = 0;
  // Open.capture_layer_ids: predates them (Describe says so, and they are
  // ignored), or ignores them although Describe says it honours them.
  bool own_capture_layers_only = false;
  bool ignores_capture_layers = false;
  std::optional<absl::Status> fail_next;
  bool corrupt_next = false;
  std::vector<v1::StreamRequest::SampleRequest> requests;
  std::vector<int64_t> acks;
  int64_t max_outstanding = 0;
  int64_t answers = 0;
  int64_t describes = 0;
};

// A stream answers its requests in order on its own thread, at most
// `granted_` samples answered and not yet acknowledged.
class FakeTeacherConnector::Stream final : public student::TeacherStream {
 public:
  Stream(FakeTeacherConnector* owner, Teacher* teacher, std::vector<int> capture_layer_ids,
         absl::Mutex& mu, student::TeacherStreamEvents& events)
      : owner_(owner),
        teacher_(teacher),
        capture_layer_ids_(std::move(capture_layer_ids)),
        mu_(mu),
        events_(events) {}

  ~Stream() override {
    {
      absl::MutexLock lock(&owner_->mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  const std::string& address() const override { return teacher_->address; }
  v1::Transport transport() const override { return v1::TRANSPORT_INLINE; }
  bool alive() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return alive_; }
  bool Owes(uint64_t) const override { return false; }

  void Start(int64_t credits) override {
    {
      absl::MutexLock lock(&owner_->mu_);
      granted_ = credits;
    }
    thread_ = std::thread([this] { Loop(); });
  }

  void GrantUpTo(int64_t credits) override {
    absl::MutexLock lock(&owner_->mu_);
    granted_ = std::max(granted_, credits);
  }

  void Send(const v1::StreamRequest& request) override {
    absl::MutexLock lock(&owner_->mu_);
    if (request.has_sample()) {
      teacher_->requests.push_back(request.sample());
      queue_.push_back(request.sample());
    }
    if (request.has_ack()) {
      for (int64_t id : request.ack().sample_ids()) {
        teacher_->acks.push_back(id);
        auto it = unacked_.find(id);
        if (it == unacked_.end()) continue;  // never counted: ignored, as a teacher does
        if (--it->second == 0) unacked_.erase(it);
        --outstanding_;
      }
    }
  }

  void Cancel() override {
    absl::MutexLock lock(&owner_->mu_);
    stop_ = true;
  }

  void WaitDone() override {
    absl::MutexLock lock(&owner_->mu_);
    if (!thread_.joinable()) return;  // never started
    owner_->mu_.Await(absl::Condition(&done_));
  }

 private:
  struct Answer {
    v1::TensorContract contract;
    int64_t row_begin = 0;
    torch::Tensor payload;
  };

  void Loop() {
    while (true) {
      v1::StreamRequest::SampleRequest request;
      std::optional<absl::Status> fail;
      bool corrupt = false;
      {
        absl::MutexLock lock(&owner_->mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
          return stop_ || teacher_->killed || (!queue_.empty() && outstanding_ < granted_);
        };
        owner_->mu_.Await(absl::Condition(&ready));
        if (stop_ || teacher_->killed) break;
        request = std::move(queue_.front());
        queue_.pop_front();
        ++outstanding_;
        ++unacked_[request.sample_id()];
        teacher_->max_outstanding = std::max(teacher_->max_outstanding, outstanding_);
        ++teacher_->answers;
        fail = std::exchange(teacher_->fail_next, std::nullopt);
        corrupt = std::exchange(teacher_->corrupt_next, false);
      }
      absl::StatusOr<Answer> answer =
          fail.has_value() ? absl::StatusOr<Answer>(*fail) : Compute(request, corrupt);
      absl::MutexLock lock(&mu_);
      if (answer.ok()) {
        events_.Arrived(request.request_id(), answer->contract, answer->row_begin, answer->payload);
      } else {
        events_.Failed(request.request_id(),
                       Annotate(answer.status(), absl::StrCat("teacher ", teacher_->address)));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      alive_ = false;
      events_.StreamLost(this);
    }
    absl::MutexLock done(&owner_->mu_);
    done_ = true;
  }

  // The payload as a teacher builds it (SampleTensors, MakeContract), then
  // checked as a receiver checks it (VerifyPayload).
  absl::StatusOr<Answer> Compute(const v1::StreamRequest::SampleRequest& request, bool corrupt) {
    const FakeTeacherOptions& options = owner_->options_;
    RETURN_IF_ERROR(
        teacher::ValidateSampleRequest(request, options.max_tokens, options.model.vocab_size));
    std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
    teacher::ForwardRequest forward;
    forward.sequences = {ids};
    forward.want_target_ids = options.keep_target_ids;
    forward.capture_layer_ids = capture_layer_ids_;
    ASSIGN_OR_RETURN(std::vector<teacher::SequenceCapture> captures,
                     teacher_->runtime->Forward(forward));
    const auto [row_begin, row_end] = teacher::RequestRows(request);
    teacher::SampleTensorsOptions tensor_options;
    tensor_options.hidden_dtype = options.payload_dtype;
    tensor_options.keep_target_ids = options.keep_target_ids;
    const std::string& mask = request.loss_mask();
    ASSIGN_OR_RETURN(
        std::vector<teacher::NamedTensor> tensors,
        teacher::SampleTensors(
            ids, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(mask.data()), mask.size()),
            captures[0], tensor_options, row_begin, row_end));
    std::vector<PayloadTensor> views;
    for (const teacher::NamedTensor& t : tensors) {
      ASSIGN_OR_RETURN(DType dtype, FromTorchDtype(t.tensor.scalar_type()));
      views.push_back(
          {t.name, dtype, ShapeOf(t.tensor),
           absl::string_view(static_cast<const char*>(t.tensor.data_ptr()), t.tensor.nbytes())});
    }
    Answer answer;
    answer.row_begin = row_begin;
    ASSIGN_OR_RETURN(answer.contract, MakeContract(views));
    auto* packed = new std::string(answer.contract.payload_bytes(), '\0');
    answer.payload = torch::from_blob(
        packed->data(), {static_cast<int64_t>(packed->size())}, [packed](void*) { delete packed; },
        torch::kUInt8);
    RETURN_IF_ERROR(PackPayload(views, absl::MakeSpan(*packed)));
    if (corrupt && !packed->empty()) (*packed)[packed->size() / 2] ^= 0x01;
    if (absl::Status s = VerifyPayload(answer.contract, *packed); !s.ok()) {
      return absl::DataLossError(s.message());
    }
    return answer;
  }

  FakeTeacherConnector* const owner_;
  Teacher* const teacher_;
  const std::vector<int> capture_layer_ids_;  // what Open asked for, if honoured
  absl::Mutex& mu_;                           // the source's
  student::TeacherStreamEvents& events_;
  std::thread thread_;
  bool alive_ ABSL_GUARDED_BY(mu_) = true;

  // Under owner_->mu_.
  bool stop_ = false;
  bool done_ = false;
  int64_t granted_ = 0;
  int64_t outstanding_ = 0;
  std::map<int64_t, int> unacked_;  // sample id -> answers not yet acknowledged
  std::deque<v1::StreamRequest::SampleRequest> queue_;
};

FakeTeacherConnector::FakeTeacherConnector(const std::vector<std::string>& addresses,
                                           FakeTeacherOptions options)
    : options_(std::move(options)) {
  for (const std::string& address : addresses) {
    auto teacher = std::make_unique<Teacher>();
    teacher->address = address;
    teacher->runtime = std::make_unique<FakeTargetRuntime>(options_.model);
    teachers_[address] = std::move(teacher);
  }
}

FakeTeacherConnector::~FakeTeacherConnector() = default;

FakeTeacherConnector::Teacher& FakeTeacherConnector::TeacherAt(const std::string& address) const {
  auto it = teachers_.find(address);
  if (it == teachers_.end()) {
    ADD_FAILURE() << "no fake teacher at " << address;
    std::abort();
  }
  return *it->second;
}

absl::StatusOr<std::vector<int32_t>> FakeTeacherConnector::Answer(
    const std::string& address, const v1::AnswerRequest& /*request*/, absl::Duration /*timeout*/) {
  return absl::UnimplementedError(absl::StrCat("fake teacher ", address, " does not answer"));
}

absl::StatusOr<v1::DescribeResponse> FakeTeacherConnector::Describe(const std::string& address,
                                                                    absl::Duration) {
  if (teachers_.find(address) == teachers_.end()) {
    return absl::UnavailableError(absl::StrCat(address, ": no teacher there"));
  }
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  ++teacher.describes;
  if (teacher.down || teacher.killed) {
    return absl::UnavailableError(absl::StrCat(address, ": teacher is down"));
  }
  if (teacher.refuse_tokens > 0) {
    --teacher.refuse_tokens;
    return absl::UnauthenticatedError(absl::StrCat(address, ": no running job has this token"));
  }
  const teacher::ModelDescription& model = teacher.runtime->Describe();
  v1::DescribeResponse response;
  response.set_model_type(model.model_type);
  response.set_hidden_size(model.hidden_size + teacher.hidden_delta);
  response.set_vocab_size(model.vocab_size);
  response.set_num_layers(model.num_layers);
  for (int id : model.capture_layer_ids) response.add_capture_layer_ids(id);
  response.set_dtype(ToProtoDType(options_.payload_dtype));
  response.set_max_tokens(options_.max_tokens);
  response.add_transports(v1::TRANSPORT_INLINE);
  response.set_hostname(absl::StrCat("fake-", address));
  response.set_per_stream_capture_layers(!teacher.own_capture_layers_only);
  return response;
}

absl::StatusOr<std::unique_ptr<student::TeacherStream>> FakeTeacherConnector::NewStream(
    const std::string& address, const v1::DescribeResponse&,
    const student::TeacherStreamOptions& options, absl::Mutex& mu,
    student::TeacherStreamEvents& events) {
  if (options.transport != "auto" && options.transport != "inline") {
    return absl::FailedPreconditionError(
        absl::StrCat("data.transport ", options.transport, ": fake teachers serve inline only"));
  }
  Teacher& teacher = TeacherAt(address);
  std::vector<int> capture(options.capture_layer_ids.begin(), options.capture_layer_ids.end());
  {
    absl::MutexLock lock(&mu_);
    if (teacher.own_capture_layers_only || teacher.ignores_capture_layers) capture.clear();
  }
  return std::make_unique<Stream>(this, &teacher, std::move(capture), mu, events);
}

void FakeTeacherConnector::SetDown(const std::string& address) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.down = true;
}

void FakeTeacherConnector::RefuseTokens(const std::string& address, int n) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.refuse_tokens = n;
}

void FakeTeacherConnector::ServeAnotherModel(const std::string& address) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.hidden_delta = 1;
}

void FakeTeacherConnector::ServeOwnCaptureLayersOnly(const std::string& address) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.own_capture_layers_only = true;
}

void FakeTeacherConnector::IgnoreCaptureLayers(const std::string& address) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.ignores_capture_layers = true;
}

void FakeTeacherConnector::Kill(const std::string& address) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.killed = true;
}

void FakeTeacherConnector::Restart(const std::string& address) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.killed = false;
  teacher.down = false;
}

void FakeTeacherConnector::FailNext(const std::string& address, absl::Status status) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.fail_next = std::move(status);
}

void FakeTeacherConnector::CorruptNext(const std::string& address) {
  Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  teacher.corrupt_next = true;
}

void FakeTeacherConnector::Hold(const std::string& address) { TeacherAt(address).runtime->Hold(); }
void FakeTeacherConnector::Release(const std::string& address) {
  TeacherAt(address).runtime->Release();
}

std::vector<v1::StreamRequest::SampleRequest> FakeTeacherConnector::requests(
    const std::string& address) const {
  const Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  return teacher.requests;
}

std::vector<int64_t> FakeTeacherConnector::acks(const std::string& address) const {
  const Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  return teacher.acks;
}

int64_t FakeTeacherConnector::max_outstanding(const std::string& address) const {
  const Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  return teacher.max_outstanding;
}

int64_t FakeTeacherConnector::answers(const std::string& address) const {
  const Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  return teacher.answers;
}

int64_t FakeTeacherConnector::describes(const std::string& address) const {
  const Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  return teacher.describes;
}

bool FakeTeacherConnector::AwaitDescribes(const std::string& address, int64_t n,
                                          absl::Duration timeout) const {
  const Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  auto described = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return teacher.describes >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&described), timeout);
}

bool FakeTeacherConnector::AwaitAnswers(const std::string& address, int64_t n,
                                        absl::Duration timeout) const {
  const Teacher& teacher = TeacherAt(address);
  absl::MutexLock lock(&mu_);
  auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return teacher.answers >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&answered), timeout);
}

FakeTargetRuntime& FakeTeacherConnector::runtime(const std::string& address) {
  return *TeacherAt(address).runtime;
}

}  // namespace specstream::testing
