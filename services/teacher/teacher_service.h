// The teacher's gRPC server (DESIGN §5): TeacherService.Describe and
// TeacherService.StreamHiddenStates over one TargetRuntime, following the
// stream protocol in proto/specstream/v1/teacher.proto exactly.
//
// Threads:
//   * gRPC's callback threads run the per-stream reactors (one read and one
//     write in flight per stream). They parse and validate requests, keep
//     the credit books and cut payloads into chunks; they never block.
//   * One compute thread owns the runtime (TargetRuntime::Forward is
//     single-threaded): it batches pending SampleRequests of all streams into
//     Forward calls of at most max_batch_tokens padded tokens, converts each
//     capture into the payload (teacher/sample_tensors.h: the same tensors,
//     names and dtypes as `dump` stores), computes the contract and hands the
//     sample back to its stream.
//   * Each TRANSPORT_NCCL stream has one NCCL thread: it joins the student's
//     communicator (Opened is sent only then), queues each ready sample's
//     header and sends its payload, which waits until the student has
//     received it. An NCCL payload is one packed buffer with a device
//     checksum (tensor.proto): on the GPU when the target computes there
//     (NcclChannel::SendDevice, never through the host), else on the host
//     (NcclChannel::Send).
//   * Each TRANSPORT_SHM stream has one ring thread: it copies payload chunks
//     into the student's ring, waiting for space (the only blocking wait),
//     and queues the chunks' locators for the reactor to send.
//
// Memory: a stream materialises (computes, holds, sends) at most
// min(credits not in flight, max_samples_per_stream) samples at once; a
// sample's payload is freed once its last chunk is written (inline) or copied
// into the ring (shm). Requests waiting for a credit hold only their token
// ids, at most max_queued_requests of them per stream.
//
// Lifetime: TeacherServer (below) builds the gRPC server around a
// TeacherService; a TeacherService used with a grpc::Server directly must
// outlive the server's Shutdown(), and the runtime must outlive the service.
#ifndef SPECSTREAM_SERVICES_TEACHER_TEACHER_SERVICE_H_
#define SPECSTREAM_SERVICES_TEACHER_TEACHER_SERVICE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/transport/payload_channel.h"
#include "grpcpp/grpcpp.h"
#include "specstream/v1/teacher.grpc.pb.h"

namespace specstream::teacher {

class TargetRuntime;
struct NamedTensor;
struct SequenceCapture;

struct TeacherServiceOptions {
  // Element type of aux_hidden/last_hidden in payloads (and Describe.dtype):
  // "float32", "bfloat16" or "float16"; what `dump --store-dtype` writes.
  std::string payload_dtype = "bfloat16";
  // Send target_ids (the full-vocab argmax per position) in every payload.
  bool keep_target_ids = false;
  // The longest sample accepted (tokens); 0: the model's
  // max_position_embeddings. Never above it.
  int64_t max_tokens = 0;
  // The largest payload chunk sent (bytes, 4 KiB to 256 MiB); a stream's
  // Open.max_chunk_bytes and ring capacity may lower it per stream.
  uint64_t chunk_bytes = uint64_t{1} << 20;
  // Padded tokens (batch size x longest sequence) per Forward call; a longer
  // sample runs alone. >= 1; 1 runs every sample alone.
  int64_t max_batch_tokens = 8192;
  // Samples one stream may have materialised at once (>= 1), on top of the
  // credit bound.
  int max_samples_per_stream = 8;
  // SampleRequests one stream may have waiting for a credit (>= 1); one more
  // ends the stream with RESOURCE_EXHAUSTED.
  int max_queued_requests = 4096;
  // How long a shm stream waits for the student to release ring space before
  // the stream ends with DEADLINE_EXCEEDED. The wait ends early when the
  // stream ends (cancelled, failed, server shutdown).
  absl::Duration shm_space_timeout = absl::Seconds(60);
  // The CUDA device that stages TRANSPORT_NCCL payloads; -1 (the default):
  // NCCL is not offered. Needs a build with SPECSTREAM_WITH_NCCL and a
  // visible device (InvalidArgument otherwise).
  int nccl_device = -1;
  // How long an NCCL stream waits for the student to join its communicator,
  // and for one payload to be received; past it the stream ends
  // (DEADLINE_EXCEEDED) and the student fails over.
  absl::Duration nccl_timeout = absl::Seconds(60);
  // Tests only: joins TRANSPORT_NCCL streams' channels instead of NCCL
  // (tests/testing/loopback_channel.h), so the stream protocol runs without
  // a GPU; when set, NCCL is offered whatever nccl_device says. Unset in
  // production.
  PayloadChannelJoin nccl_channel_for_testing;
  // Fault injection for tests only: called on the compute thread with each
  // sample's id and its packed payload after the contract (and CRC32C) was
  // computed; whatever it changes is sent, so a test can make the student's
  // VerifyPayload fail with DATA_LOSS. Must keep the payload's length. Unset
  // in production (and then payloads are sent from the tensors without
  // packing them first).
  std::function<void(int64_t sample_id, std::string& payload)> corrupt_payload_for_testing;
  // Who may open a sample stream: called on a gRPC thread with the bearer
  // token the student sent ("" when none) before the stream starts; a
  // non-OK status (e.g. UNAUTHENTICATED) ends the stream with it. Unset:
  // everyone. A teacher daemon under a coordinator admits the tokens of
  // running jobs. May block briefly (it runs once per stream).
  std::function<absl::Status(const std::string& bearer_token)> authorize;
};

class TeacherService final
    : public v1::TeacherService::WithRawCallbackMethod_StreamHiddenStates<
          v1::TeacherService::WithCallbackMethod_Describe<v1::TeacherService::Service>> {
 public:
  // Validates the options against the runtime's model (InvalidArgument
  // naming the option) and starts the compute thread. `runtime` is used only
  // from that thread from now on.
  static absl::StatusOr<std::unique_ptr<TeacherService>> Create(TargetRuntime& runtime,
                                                                TeacherServiceOptions options);
  // Stops the compute thread (Stop()).
  ~TeacherService() override;
  TeacherService(const TeacherService&) = delete;
  TeacherService& operator=(const TeacherService&) = delete;

  // --- gRPC methods (called by gRPC) ---
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const v1::DescribeRequest* request,
                                     v1::DescribeResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StreamHiddenStates(
      grpc::CallbackServerContext* context) override;

  // What Describe answers.
  const v1::DescribeResponse& description() const { return description_; }
  // The largest StreamResponse the service sends (Describe.max_message_bytes)
  // and the largest StreamRequest it accepts; TeacherServer sets the server's
  // message size limits from them.
  uint64_t max_message_bytes() const { return description_.max_message_bytes(); }
  uint64_t max_request_bytes() const;
  // Whether Describe lists TRANSPORT_NCCL (an nccl_device, or a test channel).
  bool offers_nccl() const;

  // --- Shutdown (any thread) ---
  // New streams end at once with UNAVAILABLE. Each open stream answers its
  // waiting and any new SampleRequests with SampleError UNAVAILABLE, sends
  // the samples it has materialised, then ends with UNAVAILABLE (the student
  // re-requests unacknowledged samples elsewhere). Idempotent.
  void StartDraining();
  // Blocks until no stream is open or `deadline`; true when none is.
  bool WaitUntilIdle(absl::Time deadline);
  // Stops the compute thread after its current batch; samples still queued
  // are dropped. Call after the gRPC server has shut down. Idempotent.
  void Stop();

  // Counters since Create (for logs and tests).
  struct Stats {
    int64_t streams = 0;        // streams accepted
    int64_t samples_sent = 0;   // headers sent
    int64_t sample_errors = 0;  // SampleErrors sent
    int64_t forward_calls = 0;  // runtime Forward calls
  };
  Stats stats() const;

 private:
  class Stream;
  struct Job;
  struct ReadySample;

  TeacherService(TargetRuntime& runtime, TeacherServiceOptions options);

  // Called by streams.
  void Enqueue(Job job);
  void RemoveStream(Stream* stream);
  void CountSampleSent();
  void CountSampleError();
  // Joins a TRANSPORT_NCCL stream's channel as rank 0 (NcclChannel, or the
  // test channel).
  absl::StatusOr<std::unique_ptr<PayloadChannel>> JoinNccl(absl::string_view unique_id,
                                                           PayloadChannelOptions options) const;

  void ComputeLoop();
  // Runs `batch` through the runtime and hands each result to its stream.
  void RunBatch(std::deque<Job>& batch);
  // The sample's payload for its stream: host bytes with a CRC32C, or for
  // an NCCL stream (`nccl`) one packed buffer with a device checksum.
  absl::StatusOr<std::shared_ptr<const ReadySample>> BuildSample(
      const v1::StreamRequest::SampleRequest& request, const SequenceCapture& capture, bool nccl);
  absl::StatusOr<std::shared_ptr<const ReadySample>> BuildNcclSample(
      const v1::StreamRequest::SampleRequest& request, int64_t row_begin, int64_t row_end,
      const std::vector<NamedTensor>& tensors);

  TargetRuntime& runtime_;
  const TeacherServiceOptions options_;
  DType payload_dtype_ = DType::kBF16;
  int64_t max_tokens_ = 0;
  int64_t vocab_size_ = 0;
  v1::DescribeResponse description_;

  mutable absl::Mutex queue_mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread compute_thread_;

  // Open streams: a stream registers when gRPC starts it and leaves in
  // OnDone. Jobs hold references too, so a stream object outlives its call
  // until the compute thread lets go of it. Lock order: streams_mu_ before a
  // stream's mutex before queue_mu_.
  mutable absl::Mutex streams_mu_;
  absl::flat_hash_map<Stream*, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool draining_ ABSL_GUARDED_BY(streams_mu_) = false;

  mutable absl::Mutex stats_mu_;
  Stats stats_ ABSL_GUARDED_BY(stats_mu_);
};

struct TeacherServerOptions {
  // Listening address: host (IPv4, IPv6 or a name) and port (0 picks a free
  // one; see TeacherServer::port()).
  std::string host = "127.0.0.1";
  int port = 0;
  TeacherServiceOptions service;
  // gRPC keepalive: ping an idle connection every keepalive_time and drop it
  // when the ping is not answered within keepalive_timeout.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
};

// A started gRPC server: TeacherService, the standard health service
// (grpc.health.v1.Health; SERVING for "" and "specstream.v1.TeacherService"
// once started) and server reflection, with explicit message size limits,
// keepalive, and the channel arguments that bulk payloads need.
// Thread-safety: every method may be called from any thread.
class TeacherServer final {
 public:
  static absl::StatusOr<std::unique_ptr<TeacherServer>> Start(TargetRuntime& runtime,
                                                              TeacherServerOptions options);
  // Shutdown(absl::ZeroDuration()) unless already shut down.
  ~TeacherServer();
  TeacherServer(const TeacherServer&) = delete;
  TeacherServer& operator=(const TeacherServer&) = delete;

  int port() const { return port_; }
  // "host:port" (IPv6 hosts in brackets), the address clients dial.
  const std::string& address() const { return address_; }
  TeacherService& service() { return *service_; }

  // Health NOT_SERVING, drain the streams (TeacherService::StartDraining),
  // wait for them until `timeout` has passed, shut the gRPC server down
  // (cancelling streams still open then), stop the compute thread.
  // Idempotent; returns when everything has stopped.
  void Shutdown(absl::Duration timeout);

 private:
  TeacherServer() = default;
  std::unique_ptr<TeacherService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// The name the health service reports the teacher service under.
inline constexpr char kTeacherServiceName[] = "specstream.v1.TeacherService";

}  // namespace specstream::teacher

#endif  // SPECSTREAM_SERVICES_TEACHER_TEACHER_SERVICE_H_
