#include "student/online_source.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/chat_template.h"
#include "common/grpc/auth.h"
#include "common/grpc/byte_buffer.h"
#include "common/jsonl.h"
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

namespace specstream::student {
namespace {

constexpr char kStreamMethod[] = "/specstream.v1.TeacherService/StreamHiddenStates";

bool SameRows(const RowRange& a, const RowRange& b) {
  return a.begin == b.begin && a.end == b.end && a.halo_end == b.halo_end;
}

}  // namespace

class OnlineSource::Impl {
 public:
  class Stream;

  // One sample's progress, keyed by dataset index.
  struct Slot {
    RowRange rows;
    uint64_t request_id = 0;   // outstanding request, 0 when none
    Stream* stream = nullptr;  // the stream serving (or that delivered) it
    absl::StatusOr<TrainingSample> sample = absl::UnavailableError("pending");
    bool ready = false;
    bool delivered = false;  // handed to the trainer; awaiting Commit
  };

  // How one stream's payloads travel (OnlineSourceOptions::transport).
  struct StreamTransport {
    v1::Transport kind = v1::TRANSPORT_INLINE;
    std::unique_ptr<ShmRing> ring;  // TRANSPORT_SHM
    std::string nccl_unique_id;     // TRANSPORT_NCCL: the communicator this student created
    int nccl_device = -1;           // TRANSPORT_NCCL: the CUDA device receiving
  };

  // One TeacherService stream (callback reactor). All state changes happen
  // under Impl::mu_. A TRANSPORT_NCCL stream also has a receiver thread:
  // it joins the communicator, then receives the payloads whose headers
  // have arrived, in header order (the teacher sends them in that order).
  class Stream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    Stream(Impl* owner, std::string address, std::shared_ptr<grpc::Channel> channel,
           StreamTransport transport)
        : owner_(owner),
          address_(std::move(address)),
          stub_(std::move(channel)),
          transport_(transport.kind),
          ring_(std::move(transport.ring)),
          nccl_unique_id_(std::move(transport.nccl_unique_id)),
          nccl_device_(transport.nccl_device) {}

    // Stops and joins the NCCL receiver (after the call is done).
    ~Stream() {
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        nccl_stop_ = true;
      }
      nccl_cv_.notify_all();
      if (nccl_thread_.joinable()) nccl_thread_.join();
    }

    const std::string& address() const { return address_; }
    bool alive() const { return alive_; }
    // True while the NCCL receiver owes this request's payload (its header
    // came): a lost stream does not fail it over. Called under mu_.
    bool Owes(uint64_t request_id) const { return nccl_owed_.contains(request_id); }

    // Grants more credits so that at least `credits` are outstanding in
    // total. Called under mu_.
    void GrantUpTo(int64_t credits) {
      if (credits <= granted_) return;
      v1::StreamRequest credit;
      credit.mutable_credit()->set_n(static_cast<uint32_t>(credits - granted_));
      granted_ = credits;
      Enqueue(credit);
    }

    // Starts the call: Open and the stream's credits (and, for NCCL, the
    // receiver thread, which joins while the teacher does). Called under mu_.
    void Start(int64_t credits) {
      granted_ = credits;
      v1::StreamRequest open;
      open.mutable_open()->set_transport(transport_);
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
      AddBearer(context_, owner_->options_.token);
      stub_.PrepareBidiStreamingCall(&context_, kStreamMethod, grpc::StubOptions(), this);
      call_started_ = true;
      prepared_ = true;
      WriteNext();
      StartRead(&in_);
      StartCall();
    }

    // Queues a message; writes are issued one at a time. Called under mu_.
    void Enqueue(const google::protobuf::MessageLite& message) {
      auto buffer = SerializeToByteBuffer(message);
      if (!buffer.ok()) return;
      outgoing_.push_back(*std::move(buffer));
      WriteNext();
    }

    void Cancel() { context_.TryCancel(); }

    void WaitDone() {
      if (!call_started_) return;
      std::unique_lock<std::mutex> lock(done_mu_);
      done_cv_.wait(lock, [&] { return done_; });
    }

    // gRPC callbacks.
    void OnWriteDone(bool ok) override {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      writing_ = false;
      if (!ok) return;  // OnDone reports the failure
      outgoing_.pop_front();
      WriteNext();
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        // The stream is ending: no new writes from here on (a write started
        // after this could race with OnDone; OnDone waits for this read).
        std::lock_guard<std::mutex> lock(owner_->mu_);
        alive_ = false;
        return;
      }
      v1::StreamResponse message;
      ReceivedChunk chunk;
      absl::StatusOr<bool> is_chunk = DecodeStreamResponse(in_, &message, &chunk);
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        if (!is_chunk.ok()) {
          Break(is_chunk.status());
        } else if (*is_chunk) {
          OnChunk(chunk);
        } else if (message.has_header()) {
          OnHeader(message.header());
        } else if (message.has_error()) {
          owner_->Failed(
              message.error().request_id(),
              absl::Status(static_cast<absl::StatusCode>(message.error().code()),
                           absl::StrCat("teacher ", address_, ": ", message.error().message())));
        }
      }
      StartRead(&in_);
    }

    void OnDone(const grpc::Status& status) override {
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        alive_ = false;
        // The NCCL receiver still takes the payloads whose headers came (a
        // draining teacher sends them before it ends the stream); the rest
        // of this stream's requests fail over now.
        call_done_ = true;
        nccl_cv_.notify_all();
        const absl::Status why =
            status.ok()
                ? absl::UnavailableError(absl::StrCat("teacher ", address_, " ended the stream"))
                : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                               absl::StrCat("teacher ", address_, ": ", status.error_message()));
        if (!owner_->closing_) SS_LOG_WARN("online: stream lost: {}", why.ToString());
        owner_->StreamLost(this);
      }
      {
        std::lock_guard<std::mutex> lock(done_mu_);
        done_ = true;
      }
      done_cv_.notify_all();
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
      const torch::Device device = owner_->options_.device;
      return transport_ == v1::TRANSPORT_NCCL && device.is_cuda() && device.index() == nccl_device_;
    }

    void WriteNext() {
      if (!prepared_ || writing_ || outgoing_.empty() || !alive_) return;
      writing_ = true;
      StartWrite(&outgoing_.front());
    }

    // Ends the stream on a protocol violation; its requests fail over.
    void Break(const absl::Status& why) {
      SS_LOG_WARN("online: teacher {}: {}", address_, why.ToString());
      context_.TryCancel();
    }

    void OnHeader(const v1::StreamResponse::SampleHeader& header) {
      if (absl::Status s = ValidateContract(header.contract()); !s.ok()) {
        const absl::Status why = absl::DataLossError(
            absl::StrCat("teacher ", address_, ": bad contract: ", s.message()));
        // Over NCCL the payload comes anyway: skipping its receive would pair
        // the next header with this payload, so the whole stream fails over.
        if (transport_ == v1::TRANSPORT_NCCL) return Break(why);
        return owner_->Failed(header.request_id(), why);
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
        nccl_cv_.notify_all();
        return;
      }
      incoming_[header.request_id()] = std::move(in);
    }

    void OnChunk(const ReceivedChunk& chunk) {
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
        // Copy the record out of the ring, then free it for the teacher.
        absl::StatusOr<absl::Span<const char>> record = ring_->Read(shm->position(), size);
        if (!record.ok()) return Break(record.status());
        std::memcpy(dest, record->data(), size);
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
    void Complete(uint64_t request_id, Incoming in) {
      absl::StatusOr<torch::Tensor> bytes = in.device_payload.defined()
                                                ? CheckedOnDevice(in.contract, in.device_payload)
                                                : CheckedOnHost(in.contract, std::move(in.payload));
      if (!bytes.ok()) {
        return owner_->Failed(
            request_id, absl::DataLossError(
                            absl::StrCat("teacher ", address_, ": ", bytes.status().message())));
      }
      owner_->Arrived(request_id, in.contract, in.row_begin, *std::move(bytes));
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
      options.timeout = owner_->options_.connect_timeout;
      options.stopped = [this] { return nccl_stop_.load(); };
      absl::StatusOr<std::unique_ptr<PayloadChannel>> channel =
          owner_->JoinNccl(nccl_unique_id_, std::move(options));
      if (!channel.ok()) return NcclFailed(channel.status());
      (*channel)->set_timeout(owner_->options_.sample_timeout);
      while (true) {
        std::pair<uint64_t, Incoming> next;
        {
          std::unique_lock<std::mutex> lock(owner_->mu_);
          nccl_cv_.wait(lock, [&] { return nccl_stop_ || !nccl_pending_.empty() || call_done_; });
          if (nccl_stop_ || nccl_pending_.empty()) return;
          next = std::move(nccl_pending_.front());
          nccl_pending_.pop_front();
        }
        Incoming& in = next.second;
        absl::Status received;
        if (ReceivesOnDevice()) {
          const int64_t size = static_cast<int64_t>(in.contract.payload_bytes());
          received = CatchTorch("payload buffer", [&] {
            in.device_payload = torch::empty(
                {size}, torch::TensorOptions(torch::kUInt8).device(owner_->options_.device));
          });
          if (received.ok()) {
            received = (*channel)->RecvDevice(in.device_payload.data_ptr(), size);
          }
        } else {
          received = (*channel)->Recv(in.payload.data(), in.payload.size());
        }
        if (!received.ok()) return NcclFailed(received);
        std::lock_guard<std::mutex> lock(owner_->mu_);
        if (nccl_stop_) return;
        nccl_owed_.erase(next.first);
        Complete(next.first, std::move(in));
      }
    }

    // The channel failed: every owed request fails over (UNAVAILABLE, so it
    // is re-requested elsewhere) and the stream ends.
    void NcclFailed(const absl::Status& why) {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      if (nccl_stop_) return;  // the source is closing
      const absl::Status lost = absl::UnavailableError(
          absl::StrCat("teacher ", address_, ": NCCL payload transport: ", why.ToString()));
      std::vector<uint64_t> owed(nccl_owed_.begin(), nccl_owed_.end());
      nccl_owed_.clear();
      nccl_pending_.clear();
      for (uint64_t request_id : owed) owner_->Failed(request_id, lost);
      if (!call_done_) Break(lost);
    }

    Impl* owner_;
    std::string address_;
    grpc::GenericStub stub_;
    const v1::Transport transport_;
    grpc::ClientContext context_;
    grpc::ByteBuffer in_;
    std::deque<grpc::ByteBuffer> outgoing_;
    bool writing_ = false;
    bool prepared_ = false;      // the call exists; writes may start
    bool call_started_ = false;  // OnDone will come (WaitDone waits for it)
    int64_t granted_ = 0;        // the credit window (an Ack returns its credit)
    std::unique_ptr<ShmRing> ring_;
    const std::string nccl_unique_id_;
    const int nccl_device_;
    std::thread nccl_thread_;
    std::condition_variable nccl_cv_;                         // with owner_->mu_
    std::deque<std::pair<uint64_t, Incoming>> nccl_pending_;  // headers read, payload not yet
    absl::flat_hash_set<uint64_t> nccl_owed_;  // request ids in nccl_pending_ or being received
    bool call_done_ = false;                   // OnDone ran (under owner_->mu_)
    std::atomic<bool> nccl_stop_{false};  // set under owner_->mu_ (for nccl_cv_), read anywhere
    bool alive_ = true;
    std::map<uint64_t, Incoming> incoming_;
    std::mutex done_mu_;
    std::condition_variable done_cv_;
    bool done_ = false;
  };

  explicit Impl(OnlineSourceOptions options) : options_(std::move(options)) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      for (auto& stream : streams_) {
        if (stream->alive()) stream->Cancel();
      }
    }
    for (auto& stream : streams_) stream->WaitDone();
  }

  absl::Status Init() {
    RecordOptions record_options;
    RETURN_IF_ERROR(
        ForEachJsonLine(options_.data, [&](int64_t, const nlohmann::json& record) -> absl::Status {
          ASSIGN_OR_RETURN(TokenizedSample sample, SampleFromRecord(record, record_options));
          samples_.push_back(std::move(sample));
          return absl::OkStatus();
        }));
    if (samples_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.tokenized ", options_.data, " holds no samples"));
    }
    if (options_.teachers.empty()) {
      return absl::InvalidArgumentError(
          "data.teachers: at least one teacher address is required (a coordinator fills them in "
          "for jobs submitted to it)");
    }
    if (options_.in_flight < 1) {
      return absl::InvalidArgumentError("data.in_flight must be >= 1");
    }
    // Describe every teacher; they must serve the same model.
    std::vector<std::string> errors;
    for (size_t i = 0; i < options_.teachers.size(); ++i) {
      // Ranks start on different teachers.
      const std::string& address =
          options_.teachers[(i + options_.rank) % options_.teachers.size()];
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
      // A large stream window, and BDP probing left on: it is what grows the
      // connection's window with the round trip. With it off, a teacher 20 ms
      // away streamed ~5 MB/s and the student waited every step
      // (multihost_bench: 0.65x the clean link; 1.0x with it on).
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
      auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
      v1::TeacherService::Stub stub(channel);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
      context.set_wait_for_ready(true);
      v1::DescribeRequest request;
      v1::DescribeResponse response;
      const grpc::Status status = stub.Describe(&context, request, &response);
      if (!status.ok()) {
        errors.push_back(absl::StrCat(address, ": ", status.error_message()));
        SS_LOG_WARN("online: teacher {} did not answer Describe: {}", address,
                    status.error_message());
        continue;
      }
      nlohmann::json model = {
          {"model_type", response.model_type()},
          {"hidden_size", response.hidden_size()},
          {"vocab_size", response.vocab_size()},
          {"num_layers", response.num_layers()},
          {"capture_layer_ids", std::vector<int>(response.capture_layer_ids().begin(),
                                                 response.capture_layer_ids().end())}};
      if (contract_.is_null()) {
        contract_ = {{"model", model}};
        max_tokens_ = response.max_tokens();
      } else if (contract_["model"] != model) {
        return absl::FailedPreconditionError(absl::StrCat("teacher ", address, " serves ",
                                                          model.dump(), " but another serves ",
                                                          contract_["model"].dump()));
      }
      ASSIGN_OR_RETURN(StreamTransport transport, TransportFor(address, response));
      SS_LOG_INFO("online: teacher {} on host {}: payloads {} (data.transport {})", address,
                  response.hostname(), v1::Transport_Name(transport.kind), options_.transport);
      streams_.push_back(std::make_unique<Stream>(this, address, channel, std::move(transport)));
    }
    if (streams_.empty()) {
      return absl::UnavailableError(
          absl::StrCat("no teacher answered: ", absl::StrJoin(errors, "; ")));
    }
    for (int64_t i = 0; i < static_cast<int64_t>(samples_.size()); ++i) {
      const int64_t len = static_cast<int64_t>(samples_[i].input_ids.size());
      if (max_tokens_ > 0 && len > max_tokens_) {
        return absl::InvalidArgumentError(absl::StrCat(options_.data, ": sample ", i, " has ", len,
                                                       " tokens but the teachers accept at most ",
                                                       max_tokens_, " (data.max_length?)"));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& stream : streams_) stream->Start(options_.in_flight);
    }
    if (!options_.ledger.empty()) {
      ledger_.open(options_.ledger, std::ios::app);
      if (!ledger_) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot append to ledger ", options_.ledger));
      }
    }
    // Whether payloads carry target_ids: learnt from the first sample.
    ASSIGN_OR_RETURN(TrainingSample first, Fetch(0, Whole(0)));
    has_target_ids_ = first.target_ids.defined();
    hidden_dtype_ = first.aux_hidden.scalar_type();
    Release(0);
    return absl::OkStatus();
  }

  // Acknowledges delivered samples to their teachers (their credits return)
  // and forgets them. Called under mu_.
  void Release(const std::vector<int64_t>& indices) {
    std::map<Stream*, v1::StreamRequest> acks;
    for (int64_t index : indices) {
      auto it = slots_.find(index);
      if (it == slots_.end() || !it->second.delivered) continue;
      if (it->second.stream != nullptr && it->second.stream->alive()) {
        acks[it->second.stream].mutable_ack()->add_sample_ids(index);
      }
      slots_.erase(it);
    }
    for (auto& [stream, ack] : acks) stream->Enqueue(ack);
  }
  void Release(int64_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    Release(std::vector<int64_t>{index});
  }

  // How payloads from the teacher at `address` travel (see
  // OnlineSourceOptions::transport): "auto" takes shared memory with a
  // teacher on this host and inline otherwise (a ring that cannot be made
  // falls back to inline with a warning); NCCL only when asked for, since a
  // pair that cannot connect would lose the teacher. A forced transport the
  // pair cannot use is FailedPrecondition naming data.transport.
  absl::StatusOr<StreamTransport> TransportFor(const std::string& address,
                                               const v1::DescribeResponse& teacher) {
    const std::string& mode = options_.transport;
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
      ring.name = absl::StrCat("/specstream-", getpid(), "-", options_.rank, "-", streams_.size(),
                               "-", absl::ToUnixNanos(absl::Now()) % 1000000007);
      ring.capacity = options_.shm_capacity;
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
    if (mode == "nccl") return NcclTransport(address, offers(v1::TRANSPORT_NCCL));
    return inline_transport;
  }

  // A TRANSPORT_NCCL stream to `address`, or why there cannot be one.
  absl::StatusOr<StreamTransport> NcclTransport(const std::string& address, bool offered) {
    const PayloadChannelFactory& test_channel = options_.nccl_channel_for_testing;
    if (!SPECSTREAM_WITH_NCCL && test_channel.join == nullptr) {
      return absl::FailedPreconditionError(
          "data.transport nccl: this student was built without NCCL (SPECSTREAM_WITH_NCCL=0)");
    }
    if (!offered) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data.transport nccl: teacher ", address,
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
    nccl.nccl_device =
        options_.device.is_cuda() ? options_.device.index() : options_.rank % devices;
    ASSIGN_OR_RETURN(nccl.nccl_unique_id, NewNcclUniqueId());
#endif
    return nccl;
  }

  // Joins a stream's channel as rank 1 (NcclChannel, or the test channel).
  absl::StatusOr<std::unique_ptr<PayloadChannel>> JoinNccl(absl::string_view unique_id,
                                                           PayloadChannelOptions options) {
    if (options_.nccl_channel_for_testing.join != nullptr) {
      return options_.nccl_channel_for_testing.join(unique_id, std::move(options));
    }
#if SPECSTREAM_WITH_NCCL
    return JoinNcclChannel(unique_id, std::move(options));
#else
    return absl::UnimplementedError("this student was built without NCCL");
#endif
  }

  RowRange Whole(int64_t index) const {
    const int64_t len = static_cast<int64_t>(samples_[index].input_ids.size());
    return RowRange{0, len, len};
  }

  // Rows clipped to the sample (so every way of asking for the same rows
  // compares equal).
  RowRange Clip(int64_t index, const RowRange& rows) const {
    const int64_t len = static_cast<int64_t>(samples_[index].input_ids.size());
    return RowRange{rows.begin, std::min(rows.end, len), std::min(rows.halo_end, len)};
  }

  // True when the rows hold nothing of the sample (an empty CP shard).
  bool Empty(int64_t index, const RowRange& rows) const {
    return rows.begin >= static_cast<int64_t>(samples_[index].input_ids.size());
  }

  // Requests `index` (those rows) unless it is already requested or ready
  // with the same rows. Called under mu_.
  void Want(int64_t index, const RowRange& wanted) {
    if (Empty(index, wanted)) return;
    const RowRange rows = Clip(index, wanted);
    Slot& slot = slots_[index];
    if ((slot.request_id != 0 || slot.ready) && SameRows(slot.rows, rows)) return;
    if (slot.request_id != 0) requests_.erase(slot.request_id);
    slot = Slot();
    slot.rows = rows;
    Send(index, slot);
  }

  // Sends the request for a slot to the next live stream (round robin).
  // Called under mu_.
  void Send(int64_t index, Slot& slot) {
    Stream* stream = nullptr;
    for (size_t i = 0; i < streams_.size() && stream == nullptr; ++i) {
      Stream* candidate = streams_[(next_stream_ + i) % streams_.size()].get();
      if (candidate->alive()) stream = candidate;
    }
    ++next_stream_;
    if (stream == nullptr) {
      slot.sample = absl::UnavailableError("every teacher is gone");
      slot.ready = true;
      cv_.notify_all();
      return;
    }
    const TokenizedSample& s = samples_[index];
    const int64_t len = static_cast<int64_t>(s.input_ids.size());
    v1::StreamRequest request;
    auto* sample = request.mutable_sample();
    slot.request_id = ++last_request_id_;
    slot.stream = stream;
    sample->set_request_id(slot.request_id);
    sample->set_sample_id(index);
    sample->mutable_token_ids()->Add(s.input_ids.begin(), s.input_ids.end());
    sample->set_loss_mask(std::string(s.loss_mask.begin(), s.loss_mask.end()));
    const int64_t end = std::min(slot.rows.end, len);
    if (!(slot.rows.begin == 0 && end == len && slot.rows.halo_end >= len)) {
      sample->set_slice_begin(slot.rows.begin);
      sample->set_slice_end(end);
      sample->set_halo_after(std::max<int64_t>(0, std::min(slot.rows.halo_end, len) - end));
    }
    requests_[slot.request_id] = index;
    stream->Enqueue(request);
  }

  // A payload arrived whole and intact. Called under mu_.
  void Arrived(uint64_t request_id, const v1::TensorContract& contract, int64_t row_begin,
               const torch::Tensor& payload) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;  // superseded
    Slot& slot = slots_[it->second];
    requests_.erase(it);
    slot.request_id = 0;
    slot.sample = Decode(it->second, slot.rows, contract, row_begin, payload);
    slot.ready = true;
    cv_.notify_all();
  }

  // A request failed. DATA_LOSS and transient codes are retried elsewhere;
  // anything else (a bad request) is final. Called under mu_.
  void Failed(uint64_t request_id, const absl::Status& why) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;
    const int64_t index = it->second;
    requests_.erase(it);
    Slot& slot = slots_[index];
    slot.request_id = 0;
    const bool retry = why.code() == absl::StatusCode::kDataLoss ||
                       why.code() == absl::StatusCode::kUnavailable ||
                       why.code() == absl::StatusCode::kDeadlineExceeded ||
                       why.code() == absl::StatusCode::kResourceExhausted;
    if (slot.stream != nullptr && slot.stream->alive()) {
      // The failed sample's credit returns (an id the teacher never counted
      // is ignored).
      v1::StreamRequest ack;
      ack.mutable_ack()->add_sample_ids(index);
      slot.stream->Enqueue(ack);
    }
    if (retry && !closing_) {
      SS_LOG_WARN("online: sample {} re-requested: {}", index, why.ToString());
      ++refetches_;
      Send(index, slot);
      return;
    }
    slot.sample = why;
    slot.ready = true;
    cv_.notify_all();
  }

  // Every outstanding request of a lost stream goes to another teacher.
  // Called under mu_.
  void StreamLost(Stream* stream) {
    std::vector<uint64_t> lost;
    for (const auto& [request_id, index] : requests_) {
      // A payload the stream's NCCL receiver still takes is not lost.
      if (slots_[index].stream == stream && !stream->Owes(request_id)) {
        lost.push_back(request_id);
      }
    }
    for (uint64_t request_id : lost) {
      Failed(request_id,
             absl::UnavailableError(absl::StrCat("teacher ", stream->address(), " is gone")));
    }
    cv_.notify_all();
  }

  // The payload's tensors as a TrainingSample, converted exactly as
  // StoreSource does (so online and offline training agree bit for bit).
  absl::StatusOr<TrainingSample> Decode(int64_t index, const RowRange& rows,
                                        const v1::TensorContract& contract, int64_t row_begin,
                                        const torch::Tensor& payload) {
    TrainingSample sample;
    sample.id = index;
    sample.length = static_cast<int64_t>(samples_[index].input_ids.size());
    sample.offset = rows.begin;
    if (row_begin != std::min(rows.begin, sample.length)) {
      return absl::DataLossError(absl::StrCat("sample ", index, ": teacher sent rows from ",
                                              row_begin, ", asked from ", rows.begin));
    }
    const int64_t own = std::max<int64_t>(0, std::min(rows.end, sample.length) - row_begin);
    absl::Status status = CatchTorch(absl::StrCat("sample ", index), [&] {
      for (const v1::TensorSpec& spec : contract.tensors()) {
        auto dtype = FromProtoDType(spec.dtype());
        TORCH_CHECK(dtype.ok(), "tensor ", spec.name(), ": ",
                    std::string(dtype.status().message()));
        TensorView view;
        view.name = spec.name();
        view.dtype = *dtype;
        view.shape.assign(spec.shape().begin(), spec.shape().end());
        view.nbytes = spec.nbytes();
        torch::Tensor t;
        if (payload.is_cpu()) {
          view.data = payload.data_ptr<uint8_t>() + spec.offset();
          t = BorrowView(view);
        } else {
          // A device payload stays on its device: each tensor's bytes are
          // copied out (aligned for its dtype) and viewed as it.
          t = payload.narrow(0, static_cast<int64_t>(spec.offset()), view.nbytes)
                  .clone()
                  .view(ToTorchDtype(*dtype))
                  .view(view.shape);
        }
        if (spec.name() == "input_ids") sample.input_ids = t.to(torch::kInt64);
        if (spec.name() == "loss_mask") sample.loss_mask = t.to(torch::kUInt8, false, true);
        if (spec.name() == "aux_hidden")
          sample.aux_hidden = t.narrow(0, 0, std::min(own, t.size(0))).clone();
        if (spec.name() == "last_hidden") sample.last_hidden = t.clone();
        if (spec.name() == "target_ids") sample.target_ids = t.to(torch::kInt64);
      }
    });
    if (!status.ok()) return status;
    if (!sample.input_ids.defined() || !sample.loss_mask.defined() ||
        !sample.aux_hidden.defined() || !sample.last_hidden.defined()) {
      return absl::DataLossError(absl::StrCat(
          "sample ", index, ": payload lacks input_ids/loss_mask/aux_hidden/last_hidden"));
    }
    return sample;
  }

  // Waits for the sample (requesting it when needed) and hands it over.
  absl::StatusOr<TrainingSample> Fetch(int64_t index, const RowRange& rows) {
    if (index < 0 || index >= static_cast<int64_t>(samples_.size())) {
      return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", samples_.size()));
    }
    if (Empty(index, rows)) return EmptyRows(index, rows);
    std::unique_lock<std::mutex> lock(mu_);
    Want(index, rows);
    const absl::Time deadline = absl::Now() + options_.sample_timeout;
    Slot* slot = &slots_[index];
    while (!slot->ready) {
      if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout &&
          !slot->ready) {
        return absl::DeadlineExceededError(
            absl::StrCat("sample ", index, " did not arrive within ",
                         absl::FormatDuration(options_.sample_timeout)));
      }
      slot = &slots_[index];
    }
    absl::StatusOr<TrainingSample> sample = std::move(slot->sample);
    slot->ready = false;
    slot->delivered = sample.ok();
    slot->sample = absl::UnavailableError("taken");
    return sample;
  }

  // A CP shard past the sample's end: zero rows, shaped like a payload's.
  absl::StatusOr<TrainingSample> EmptyRows(int64_t index, const RowRange& rows) {
    TrainingSample sample;
    sample.id = index;
    sample.length = static_cast<int64_t>(samples_[index].input_ids.size());
    sample.offset = rows.begin;
    const int64_t hidden = contract_["model"]["hidden_size"].get<int64_t>();
    const int64_t captures = static_cast<int64_t>(contract_["model"]["capture_layer_ids"].size());
    sample.input_ids = torch::zeros({0}, torch::kInt64);
    sample.loss_mask = torch::zeros({0}, torch::kUInt8);
    sample.aux_hidden = torch::zeros({0, captures * hidden}, hidden_dtype_);
    sample.last_hidden = torch::zeros({0, hidden}, hidden_dtype_);
    if (has_target_ids_) sample.target_ids = torch::zeros({0}, torch::kInt64);
    return sample;
  }

  absl::Status Commit(int64_t step, const std::vector<int64_t>& indices) {
    std::lock_guard<std::mutex> lock(mu_);
    Release(indices);
    if (ledger_.is_open()) {
      nlohmann::json line = {{"step", step}, {"rank", options_.rank}, {"sample_ids", indices}};
      ledger_ << line.dump() << "\n";
      ledger_.flush();
      if (!ledger_)
        return absl::DataLossError(absl::StrCat("ledger ", options_.ledger, ": write failed"));
    }
    return absl::OkStatus();
  }

  OnlineSourceOptions options_;
  std::vector<TokenizedSample> samples_;
  nlohmann::json contract_;
  int64_t max_tokens_ = 0;
  bool has_target_ids_ = false;
  torch::ScalarType hidden_dtype_ = torch::kFloat32;
  std::ofstream ledger_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Stream>> streams_;
  size_t next_stream_ = 0;
  uint64_t last_request_id_ = 0;
  std::map<int64_t, Slot> slots_;         // by dataset index
  std::map<uint64_t, int64_t> requests_;  // outstanding request id -> index
  int64_t refetches_ = 0;
  bool closing_ = false;
};

OnlineSource::OnlineSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OnlineSource::~OnlineSource() = default;

absl::StatusOr<std::unique_ptr<OnlineSource>> OnlineSource::Open(
    const OnlineSourceOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<OnlineSource>(new OnlineSource(std::move(impl)));
}

int64_t OnlineSource::size() const { return static_cast<int64_t>(impl_->samples_.size()); }

absl::StatusOr<TrainingSample> OnlineSource::Get(int64_t index) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  return impl_->Fetch(index, impl_->Whole(index));
}

absl::StatusOr<TrainingSample> OnlineSource::GetRows(int64_t index, const RowRange& rows) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  return impl_->Fetch(index, rows);
}

const nlohmann::json& OnlineSource::contract() const { return impl_->contract_; }

int64_t OnlineSource::Length(int64_t index) const {
  return static_cast<int64_t>(impl_->samples_[index].input_ids.size());
}

bool OnlineSource::has_target_ids() const { return impl_->has_target_ids_; }

absl::Status OnlineSource::TokenIds(int64_t index, std::vector<int32_t>* ids,
                                    std::vector<uint8_t>* mask) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  *ids = impl_->samples_[index].input_ids;
  *mask = impl_->samples_[index].loss_mask;
  return absl::OkStatus();
}

void OnlineSource::ReserveOutstanding(int64_t samples) {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  for (auto& stream : impl_->streams_) {
    if (stream->alive()) stream->GrantUpTo(samples);
  }
}

void OnlineSource::Prefetch(const std::vector<int64_t>& indices, const RowRange& rows) {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  for (int64_t index : indices) {
    if (index >= 0 && index < size()) impl_->Want(index, rows);
  }
}

absl::Status OnlineSource::Commit(int64_t step, const std::vector<int64_t>& indices) {
  return impl_->Commit(step, indices);
}

int64_t OnlineSource::refetches() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->refetches_;
}

}  // namespace specstream::student
