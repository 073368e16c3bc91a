#include "services/student/grpc_teacher_connection.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/env.h"
#include "common/grpc/auth.h"
#include "common/grpc/byte_buffer.h"
#include "common/grpc/channel_args.h"
#include "common/grpc/status.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/device_checksum.h"
#include "common/torch/tensor_util.h"
#include "common/transport/contract.h"
#include "common/transport/shm_ring.h"
#include "grpcpp/generic/generic_stub.h"
#if SPECSTREAM_WITH_NCCL
#include "common/transport/nccl_channel.h"
#include "common/transport/nccl_util.h"
#endif
#include "grpcpp/grpcpp.h"
#include "specstream/v1/teacher.grpc.pb.h"

namespace specstream::services {
namespace {

constexpr char kStreamMethod[] = "/specstream.v1.TeacherService/StreamHiddenStates";

// How one stream's payloads travel (TeacherStreamOptions::transport).
struct StreamTransport {
  v1::Transport kind = v1::TRANSPORT_INLINE;
  std::unique_ptr<ShmRing> ring;  // TRANSPORT_SHM
  std::string nccl_unique_id;     // TRANSPORT_NCCL: the communicator this student created
  int nccl_device = -1;           // TRANSPORT_NCCL: the CUDA device receiving
};

// A TRANSPORT_NCCL stream to `address`, or why there cannot be one.
absl::StatusOr<StreamTransport> NcclTransport(const std::string& address, bool offered,
                                              const student::TeacherStreamOptions& options) {
  const PayloadChannelFactory& test_channel = options.nccl_channel_for_testing;
  if (!SPECSTREAM_WITH_NCCL && test_channel.join == nullptr) {
    return absl::FailedPreconditionError(
        "data.transport nccl: this student was built without NCCL (SPECSTREAM_WITH_NCCL=0)");
  }
  if (!offered) {
    return absl::FailedPreconditionError(
        absl::StrCat("data.transport nccl: teacher ", address,
                     " does not offer NCCL (built without it, or started without a CUDA device)"));
  }
  StreamTransport nccl;
  nccl.kind = v1::TRANSPORT_NCCL;
  if (test_channel.join != nullptr) {
    ASSIGN_OR_RETURN(nccl.nccl_unique_id, test_channel.new_id());
    return nccl;
  }
#if SPECSTREAM_WITH_NCCL
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError("data.transport nccl: this student sees no CUDA device");
  }
  // The trainer's own GPU when it trains on one (payloads land in its
  // memory), else spread over the visible ones.
  nccl.nccl_device = options.device.is_cuda() ? options.device.index() : options.rank % devices;
  ASSIGN_OR_RETURN(nccl.nccl_unique_id, NewNcclUniqueId());
#endif
  return nccl;
}

// How payloads from the teacher at `address` travel (see
// TeacherStreamOptions::transport): "auto" takes shared memory with a
// teacher on this host and inline otherwise (a ring that cannot be made
// falls back to inline with a warning); NCCL only when asked for, since a
// pair that cannot connect would lose the teacher. A forced transport the
// pair cannot use is FailedPrecondition naming data.transport.
absl::StatusOr<StreamTransport> TransportFor(const std::string& address,
                                             const v1::DescribeResponse& teacher,
                                             const student::TeacherStreamOptions& options) {
  const std::string& mode = options.transport;
  StreamTransport inline_transport;
  if (mode == "inline") return inline_transport;
  if (mode != "auto" && mode != "shm" && mode != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.transport: \"", mode, "\" is not auto, inline, shm or nccl"));
  }
  auto offers = [&](v1::Transport t) {
    return std::find(teacher.transports().begin(), teacher.transports().end(), t) !=
           teacher.transports().end();
  };
  const bool same_host = !teacher.hostname().empty() && teacher.hostname() == LocalHostname() &&
                         !teacher.boot_id().empty() && teacher.boot_id() == LocalBootId();
  if (mode == "shm" || (mode == "auto" && same_host && offers(v1::TRANSPORT_SHM))) {
    if (!offers(v1::TRANSPORT_SHM) || !same_host) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data.transport shm: teacher ", address,
          offers(v1::TRANSPORT_SHM) ? " runs on another host" : " does not offer shared memory"));
    }
    ShmRingOptions ring;
    ring.name = absl::StrCat(ShmRingPrefix(getpid()), options.rank, "-", options.stream_index, "-",
                             absl::ToUnixNanos(Env::Default().Now()) % 1000000007);
    ring.capacity = options.shm_capacity;
    absl::StatusOr<std::unique_ptr<ShmRing>> created = ShmRing::Create(ring);
    if (!created.ok()) {
      if (mode == "shm") return created.status();
      SS_LOG_WARN("online: teacher {}: no shared-memory ring ({}); payloads go inline", address,
                  created.status().ToString());
      return inline_transport;
    }
    StreamTransport shm;
    shm.kind = v1::TRANSPORT_SHM;
    shm.ring = *std::move(created);
    return shm;
  }
  if (mode == "nccl") return NcclTransport(address, offers(v1::TRANSPORT_NCCL), options);
  return inline_transport;
}

// Joins a stream's channel as rank 1 (NcclChannel, or the test channel).
absl::StatusOr<std::unique_ptr<PayloadChannel>> JoinNccl(
    const student::TeacherStreamOptions& stream, absl::string_view unique_id,
    PayloadChannelOptions options) {
  if (stream.nccl_channel_for_testing.join != nullptr) {
    return stream.nccl_channel_for_testing.join(unique_id, std::move(options));
  }
#if SPECSTREAM_WITH_NCCL
  return JoinNcclChannel(unique_id, std::move(options));
#else
  return absl::UnimplementedError("this student was built without NCCL");
#endif
}

// One TeacherService stream (callback reactor). All state changes happen
// under the source's mutex (mu_). A TRANSPORT_NCCL stream also has a receiver thread:
// it joins the communicator, then receives the payloads whose headers
// have arrived, in header order (the teacher sends them in that order).
class GrpcTeacherStream final : public student::TeacherStream,
                                public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  GrpcTeacherStream(std::string address, std::shared_ptr<grpc::Channel> channel,
                    StreamTransport transport, const student::TeacherStreamOptions& options,
                    absl::Mutex& mu, student::TeacherStreamEvents& events)
      : mu_(mu),
        events_(events),
        options_(options),
        address_(std::move(address)),
        stub_(std::move(channel)),
        transport_(transport.kind),
        ring_(std::move(transport.ring)),
        nccl_unique_id_(std::move(transport.nccl_unique_id)),
        nccl_device_(transport.nccl_device) {}

  // Stops and joins the NCCL receiver (after the call is done).
  ~GrpcTeacherStream() override {
    {
      absl::MutexLock lock(&mu_);
      nccl_stop_ = true;
      nccl_cv_.SignalAll();
    }
    if (nccl_thread_.joinable()) nccl_thread_.join();
  }

  const std::string& address() const override { return address_; }
  v1::Transport transport() const override { return transport_; }
  bool alive() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return alive_; }
  // True while the NCCL receiver owes this request's payload (its header
  // came): a lost stream does not fail it over.
  bool Owes(uint64_t request_id) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return nccl_owed_.contains(request_id);
  }

  // Grants more credits so that at least `credits` are outstanding in
  // total.
  void GrantUpTo(int64_t credits) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (credits <= granted_) return;
    v1::StreamRequest credit;
    credit.mutable_credit()->set_n(static_cast<uint32_t>(credits - granted_));
    granted_ = credits;
    Enqueue(credit);
  }

  // Starts the call: Open and the stream's credits (and, for NCCL, the
  // receiver thread, which joins while the teacher does).
  void Start(int64_t credits) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    granted_ = credits;
    v1::StreamRequest open;
    open.mutable_open()->set_transport(transport_);
    open.mutable_open()->mutable_capture_layer_ids()->Add(options_.capture_layer_ids.begin(),
                                                          options_.capture_layer_ids.end());
    if (transport_ == v1::TRANSPORT_SHM) {
      open.mutable_open()->set_shm_name(ring_->name());
      open.mutable_open()->set_shm_capacity(ring_->capacity());
    } else if (transport_ == v1::TRANSPORT_NCCL) {
      open.mutable_open()->set_nccl_unique_id(nccl_unique_id_);
      nccl_thread_ = std::thread([this] { NcclReceiveLoop(); });
    }
    Enqueue(open);
    v1::StreamRequest credit;
    credit.mutable_credit()->set_n(static_cast<uint32_t>(credits));
    Enqueue(credit);
    AddBearer(context_, options_.token);
    stub_.PrepareBidiStreamingCall(&context_, kStreamMethod, grpc::StubOptions(), this);
    call_started_ = true;
    prepared_ = true;
    WriteNext();
    StartRead(&in_);
    StartCall();
  }

  // Queues a message; writes are issued one at a time.
  void Enqueue(const google::protobuf::MessageLite& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto buffer = SerializeToByteBuffer(message);
    if (!buffer.ok()) {
      // Reported here, with its reason: the stream ends and its requests
      // fail over (a silent drop would surface as a sample timeout).
      return Break(Annotate(buffer.status(), "a request that cannot be serialized"));
    }
    outgoing_.push_back(*std::move(buffer));
    WriteNext();
  }

  // Queues a request.
  void Send(const v1::StreamRequest& request) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Enqueue(request);
  }

  void Cancel() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cancelled_ = true;
    context_.TryCancel();
  }

  void WaitDone() override {
    if (!call_started_) return;
    done_.WaitForNotification();
  }

  // gRPC callbacks.
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return;  // OnDone reports the failure
    outgoing_.pop_front();
    WriteNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The stream is ending: no new writes from here on (a write started
      // after this could race with OnDone; OnDone waits for this read).
      absl::MutexLock lock(&mu_);
      alive_ = false;
      return;
    }
    v1::StreamResponse message;
    ReceivedChunk chunk;
    absl::StatusOr<bool> is_chunk = DecodeStreamResponse(in_, &message, &chunk);
    {
      absl::MutexLock lock(&mu_);
      if (!is_chunk.ok()) {
        Break(is_chunk.status());
      } else if (*is_chunk) {
        OnChunk(chunk);
      } else if (message.has_header()) {
        OnHeader(message.header());
      } else if (message.has_error()) {
        events_.Failed(
            message.error().request_id(),
            absl::Status(static_cast<absl::StatusCode>(message.error().code()),
                         absl::StrCat("teacher ", address_, ": ", message.error().message())));
      }
    }
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      alive_ = false;
      // The NCCL receiver still takes the payloads whose headers came (a
      // draining teacher sends them before it ends the stream); the rest
      // of this stream's requests fail over now.
      call_done_ = true;
      nccl_cv_.SignalAll();
      const absl::Status why =
          status.ok()
              ? absl::UnavailableError(absl::StrCat("teacher ", address_, " ended the stream"))
              : Annotate(FromGrpcStatus(status), absl::StrCat("teacher ", address_));
      if (!cancelled_) SS_LOG_WARN("online: stream lost: {}", why.ToString());
      events_.StreamLost(this);
    }
    // The last callback: WaitDone may return, and the source destroy this
    // stream, once it is made (which Notification allows).
    done_.Notify();
  }

 private:
  // An incoming payload: in `payload` on the host, or (an NCCL stream of
  // a student on a CUDA device) in `device_payload`, uint8 [payload_bytes]
  // on that device.
  struct Incoming {
    v1::TensorContract contract;
    int64_t row_begin = 0;
    std::string payload;
    torch::Tensor device_payload;
    uint64_t received = 0;
  };

  // NCCL payloads go straight to the trainer's device when the channel is
  // on it.
  bool ReceivesOnDevice() const {
    const torch::Device device = options_.device;
    return transport_ == v1::TRANSPORT_NCCL && device.is_cuda() && device.index() == nccl_device_;
  }

  void WriteNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!prepared_ || writing_ || outgoing_.empty() || !alive_) return;
    writing_ = true;
    StartWrite(&outgoing_.front());
  }

  // Ends the stream on a protocol violation; its requests fail over.
  void Break(const absl::Status& why) {
    SS_LOG_WARN("online: teacher {}: {}", address_, why.ToString());
    context_.TryCancel();
  }

  void OnHeader(const v1::StreamResponse::SampleHeader& header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The teacher attached the ring when it took the Open, before its first
    // header: the name can go, so a student killed from here on leaves no
    // ring in /dev/shm.
    if (ring_ != nullptr && ring_->linked()) {
      if (absl::Status s = ring_->Unlink(); !s.ok()) SS_LOG_WARN("online: {}", s.ToString());
    }
    if (absl::Status s = ValidateContract(header.contract()); !s.ok()) {
      const absl::Status why =
          absl::DataLossError(absl::StrCat("teacher ", address_, ": bad contract: ", s.message()));
      // Over NCCL the payload comes anyway: skipping its receive would pair
      // the next header with this payload, so the whole stream fails over.
      if (transport_ == v1::TRANSPORT_NCCL) return Break(why);
      return events_.Failed(header.request_id(), why);
    }
    Incoming in;
    in.contract = header.contract();
    in.row_begin = header.row_begin();
    // A device payload's buffer is allocated by the receiver thread.
    if (!ReceivesOnDevice()) in.payload.resize(header.contract().payload_bytes());
    if (header.contract().payload_bytes() == 0) {
      return Complete(header.request_id(), std::move(in));
    }
    if (transport_ == v1::TRANSPORT_NCCL) {
      // The buffer is sized from the checked contract; the receiver thread
      // posts the receive for exactly its bytes.
      nccl_owed_.insert(header.request_id());
      nccl_pending_.emplace_back(header.request_id(), std::move(in));
      nccl_cv_.SignalAll();
      return;
    }
    incoming_[header.request_id()] = std::move(in);
  }

  void OnChunk(const ReceivedChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = incoming_.find(chunk.request_id());
    const v1::StreamResponse::ShmLocator* shm = chunk.shm();
    const uint64_t size = shm != nullptr ? shm->length() : chunk.size();
    if (it == incoming_.end() || (shm != nullptr) != (ring_ != nullptr) ||
        chunk.offset() != it->second.received ||
        size > it->second.payload.size() - it->second.received) {
      return Break(absl::DataLossError("payload chunk out of order or past its payload"));
    }
    char* dest = it->second.payload.data() + chunk.offset();
    if (shm != nullptr) {
      // Copy the record out of the ring (DataLoss, not SIGBUS, when someone
      // truncated it), then free it for the teacher.
      if (absl::Status s = ring_->CopyOut(shm->position(), absl::Span<char>(dest, size)); !s.ok()) {
        return Break(s);
      }
      if (absl::Status s = ring_->Release(shm->position() + size); !s.ok()) return Break(s);
    } else {
      chunk.CopyTo(dest);
    }
    it->second.received += size;
    if (it->second.received == it->second.payload.size()) {
      Incoming in = std::move(it->second);
      incoming_.erase(it);
      Complete(chunk.request_id(), std::move(in));
    }
  }

  // A whole payload: checked against its CRC32C or device checksum, then
  // handed over as uint8 [payload_bytes] where it is.
  void Complete(uint64_t request_id, Incoming in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<torch::Tensor> bytes = in.device_payload.defined()
                                              ? CheckedOnDevice(in.contract, in.device_payload)
                                              : CheckedOnHost(in.contract, std::move(in.payload));
    if (!bytes.ok()) {
      return events_.Failed(request_id, absl::DataLossError(absl::StrCat(
                                            "teacher ", address_, ": ", bytes.status().message())));
    }
    events_.Arrived(request_id, in.contract, in.row_begin, *std::move(bytes));
  }

  static absl::StatusOr<torch::Tensor> CheckedOnHost(const v1::TensorContract& contract,
                                                     std::string payload) {
    RETURN_IF_ERROR(VerifyPayload(contract, payload));
    // The tensor owns the string's bytes.
    auto* owned = new std::string(std::move(payload));
    return torch::from_blob(
        owned->data(), {static_cast<int64_t>(owned->size())}, [owned](void*) { delete owned; },
        torch::kUInt8);
  }

  static absl::StatusOr<torch::Tensor> CheckedOnDevice(const v1::TensorContract& contract,
                                                       const torch::Tensor& payload) {
    if (!contract.has_device_checksum()) {
      return absl::DataLossError("an NCCL payload without contract.device_checksum");
    }
    int64_t sum = 0;
    RETURN_IF_ERROR(
        CatchTorch("payload checksum", [&] { sum = DeviceChecksum(payload).item<int64_t>(); }));
    if (static_cast<uint64_t>(sum) != contract.device_checksum()) {
      return absl::DataLossError(
          absl::StrFormat("payload: device checksum 0x%016x != contract.device_checksum 0x%016x",
                          static_cast<uint64_t>(sum), contract.device_checksum()));
    }
    return payload;
  }

  // The NCCL receiver thread: joins (rank 1) within connect_timeout, then
  // receives pending payloads one by one, each within sample_timeout,
  // until the call is done and nothing is pending. A failure fails every
  // owed request over and breaks the stream; destroying the stream stops
  // (and aborts) whatever it waits for.
  void NcclReceiveLoop() {
    PayloadChannelOptions options;
    options.rank = 1;
    options.device = nccl_device_;
    options.timeout = options_.connect_timeout;
    options.stopped = [this] { return nccl_stop_.load(); };
    absl::StatusOr<std::unique_ptr<PayloadChannel>> channel =
        JoinNccl(options_, nccl_unique_id_, std::move(options));
    if (!channel.ok()) return NcclFailed(channel.status());
    (*channel)->set_timeout(options_.sample_timeout);
    while (true) {
      std::pair<uint64_t, Incoming> next;
      {
        absl::MutexLock lock(&mu_);
        while (!nccl_stop_ && nccl_pending_.empty() && !call_done_) nccl_cv_.Wait(&mu_);
        if (nccl_stop_ || nccl_pending_.empty()) return;
        next = std::move(nccl_pending_.front());
        nccl_pending_.pop_front();
      }
      Incoming& in = next.second;
      absl::Status received;
      if (ReceivesOnDevice()) {
        const int64_t size = static_cast<int64_t>(in.contract.payload_bytes());
        received = CatchTorch("payload buffer", [&] {
          in.device_payload =
              torch::empty({size}, torch::TensorOptions(torch::kUInt8).device(options_.device));
        });
        if (received.ok()) {
          received = (*channel)->RecvDevice(in.device_payload.data_ptr(), size);
        }
      } else {
        received = (*channel)->Recv(in.payload.data(), in.payload.size());
      }
      if (!received.ok()) return NcclFailed(received);
      absl::MutexLock lock(&mu_);
      if (nccl_stop_) return;
      nccl_owed_.erase(next.first);
      Complete(next.first, std::move(in));
    }
  }

  // The channel failed: every owed request fails over (UNAVAILABLE, so it
  // is re-requested elsewhere) and the stream ends.
  void NcclFailed(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (nccl_stop_) return;  // the source is closing
    const absl::Status lost = absl::UnavailableError(
        absl::StrCat("teacher ", address_, ": NCCL payload transport: ", why.ToString()));
    std::vector<uint64_t> owed(nccl_owed_.begin(), nccl_owed_.end());
    nccl_owed_.clear();
    nccl_pending_.clear();
    for (uint64_t request_id : owed) events_.Failed(request_id, lost);
    if (!call_done_) Break(lost);
  }

  absl::Mutex& mu_;  // the source's
  student::TeacherStreamEvents& events_;
  const student::TeacherStreamOptions options_;
  std::string address_;
  grpc::GenericStub stub_;
  const v1::Transport transport_;
  grpc::ClientContext context_;
  grpc::ByteBuffer in_;
  std::deque<grpc::ByteBuffer> outgoing_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;  // the call exists; writes may start
  // OnDone will come (WaitDone waits for it). Set by Start, which the
  // source calls before it ever calls WaitDone.
  std::atomic<bool> call_started_{false};
  int64_t granted_ ABSL_GUARDED_BY(mu_) = 0;  // the credit window (an Ack returns its credit)
  std::unique_ptr<ShmRing> ring_;
  const std::string nccl_unique_id_;
  const int nccl_device_;
  std::thread nccl_thread_;
  absl::CondVar nccl_cv_;  // with mu_: work for the NCCL receiver, or its end
  // Headers read, payload not yet.
  std::deque<std::pair<uint64_t, Incoming>> nccl_pending_ ABSL_GUARDED_BY(mu_);
  // Request ids in nccl_pending_ or being received.
  absl::flat_hash_set<uint64_t> nccl_owed_ ABSL_GUARDED_BY(mu_);
  bool call_done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  std::atomic<bool> nccl_stop_{false};           // set under mu_ (for nccl_cv_), read anywhere
  bool alive_ ABSL_GUARDED_BY(mu_) = true;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // Cancel() ran: the end is ours, not a loss
  std::map<uint64_t, Incoming> incoming_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;  // OnDone ran
};

}  // namespace

absl::StatusOr<std::shared_ptr<GrpcTeacherConnector>> GrpcTeacherConnector::Create(
    GrpcTeacherConnectorOptions options) {
  auto connector = std::make_shared<GrpcTeacherConnector>();
  connector->token_ = std::move(options.token);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.tls);
  if (!credentials.ok()) {
    // The flags students give: --teacher-tls-ca, -cert, -key.
    return absl::InvalidArgumentError(absl::StrCat("teacher ", credentials.status().message()));
  }
  connector->credentials_ = *std::move(credentials);
  return connector;
}

std::shared_ptr<grpc::Channel> GrpcTeacherConnector::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = grpc::CreateCustomChannel(
        address, credentials_ != nullptr ? credentials_ : grpc::InsecureChannelCredentials(),
        TeacherChannelArguments());
  }
  return channel;
}

absl::StatusOr<v1::DescribeResponse> GrpcTeacherConnector::Describe(const std::string& address,
                                                                    absl::Duration timeout) {
  v1::TeacherService::Stub stub(ChannelTo(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(Env::Default().Now() + timeout));
  context.set_wait_for_ready(true);
  AddBearer(context, token_);
  v1::DescribeRequest request;
  v1::DescribeResponse response;
  const grpc::Status status = stub.Describe(&context, request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), address);
  return response;
}

absl::StatusOr<std::vector<int32_t>> GrpcTeacherConnector::Answer(const std::string& address,
                                                                  const v1::AnswerRequest& request,
                                                                  absl::Duration timeout) {
  v1::TeacherService::Stub stub(ChannelTo(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(Env::Default().Now() + timeout));
  AddBearer(context, token_);
  v1::AnswerResponse response;
  const grpc::Status status = stub.Answer(&context, request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), address);
  return std::vector<int32_t>(response.answer_ids().begin(), response.answer_ids().end());
}

absl::StatusOr<std::unique_ptr<student::TeacherStream>> GrpcTeacherConnector::NewStream(
    const std::string& address, const v1::DescribeResponse& teacher,
    const student::TeacherStreamOptions& options, absl::Mutex& mu,
    student::TeacherStreamEvents& events) {
  ASSIGN_OR_RETURN(StreamTransport transport, TransportFor(address, teacher, options));
  return std::make_unique<GrpcTeacherStream>(address, ChannelTo(address), std::move(transport),
                                             options, mu, events);
}

}  // namespace specstream::services
