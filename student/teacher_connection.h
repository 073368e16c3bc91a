// How the online source (student/online_source.h) reaches its teachers,
// without gRPC (DESIGN §5): a TeacherConnector describes a teacher and opens
// TeacherStreams to it; each stream carries the source's requests, credits
// and acks to one teacher and reports back whole, verified payloads,
// per-request failures and its own loss. The source keeps what happens to a
// sample (which teacher serves it, failover, exactly-once, decoding); a
// connection keeps how bytes travel (the TeacherService call, the payload
// transport and its negotiation, checksums).
//
// Implementations: services/student/grpc_teacher_connection.h (TeacherService
// over gRPC, payloads inline, through a shared-memory ring or over NCCL) and
// tests/testing/fake_teacher_connection.h (in memory, faults on cue).
//
// Locking contract: the source owns one mutex and hands it to every stream
// it opens (NewStream's `mu`). The source calls every TeacherStream method
// but WaitDone with that mutex held, and a stream makes every
// TeacherStreamEvents call with it held, from its own threads, never from
// inside a call the source made (so the source never sees its own state
// change under it). WaitDone and the stream's destructor are called without
// it. Implementations guard their members with it (ABSL_GUARDED_BY on the
// reference they keep) and annotate these methods as requiring it, so that
// tests/thread_safety.sh checks each side; the call across the interface
// itself is what this comment promises.
#ifndef SPECSTREAM_STUDENT_TEACHER_CONNECTION_H_
#define SPECSTREAM_STUDENT_TEACHER_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/capture_layers.h"
#include "common/transport/payload_channel.h"
#include "specstream/v1/teacher.pb.h"

namespace specstream::student {

class TeacherStream;

// What a stream reports to its source (with the source's mutex held).
class TeacherStreamEvents {
 public:
  virtual ~TeacherStreamEvents() = default;
  // The payload of `request_id`, whole and checked against `contract`'s
  // checksum: uint8 [payload_bytes], on the host or (NCCL into a CUDA
  // trainer) on the trainer's device. `row_begin` is the first row it holds.
  virtual void Arrived(uint64_t request_id, const v1::TensorContract& contract, int64_t row_begin,
                       const torch::Tensor& payload) = 0;
  // The request failed: the teacher's SampleError, a bad contract or
  // checksum (DATA_LOSS), a payload transport that broke (UNAVAILABLE).
  virtual void Failed(uint64_t request_id, const absl::Status& why) = 0;
  // The stream ended (alive() is false from now on): every request it was
  // sent and does not still Owe is lost.
  virtual void StreamLost(TeacherStream* stream) = 0;
};

// One stream to one teacher. Methods but WaitDone: with the source's mutex
// held (see the contract above).
class TeacherStream {
 public:
  virtual ~TeacherStream() = default;
  virtual const std::string& address() const = 0;
  // The payload transport negotiated for this stream.
  virtual v1::Transport transport() const = 0;
  // False once the stream has ended; nothing sent after that arrives.
  virtual bool alive() const = 0;
  // True while the stream still owes this request's payload although it
  // has ended (an NCCL payload whose header came): it must not fail over.
  virtual bool Owes(uint64_t request_id) const = 0;
  // Opens the stream with `credits` outstanding samples allowed.
  virtual void Start(int64_t credits) = 0;
  // Grants credits so that at least `credits` are allowed in all (an ack
  // returns its sample's credit).
  virtual void GrantUpTo(int64_t credits) = 0;
  // Queues a request (a sample request or an ack), in order.
  virtual void Send(const v1::StreamRequest& request) = 0;
  // Ends the stream from this side (the source is closing).
  virtual void Cancel() = 0;
  // Blocks until the stream has ended and made its last event (without the
  // mutex).
  virtual void WaitDone() = 0;
};

// How the source wants its streams (OnlineSourceOptions).
struct TeacherStreamOptions {
  // Payload transport (data.transport): "auto" (shared memory with a
  // teacher on this host — same hostname and boot id —, inline otherwise),
  // "inline", "shm" or "nccl" (a build with NCCL and a CUDA device on both
  // sides; the student receives on `device` when it is a CUDA device, else
  // on device rank % visible devices).
  std::string transport = "auto";
  int rank = 0;          // the trainer rank (names shm rings, spreads NCCL devices)
  int stream_index = 0;  // this rank's streams, 0.. (names shm rings)
  // Sent as StreamRequest.Open.capture_layer_ids: the layers each sample's
  // aux_hidden holds, in order (ascending, distinct, in [0, num_layers)).
  // Empty: the teacher's own (Describe.capture_layer_ids). The source sets
  // it from OnlineSourceOptions::capture_layer_ids.
  CaptureLayerIds capture_layer_ids;
  // Where the trainer computes. NCCL payloads for a CUDA device are received
  // straight into its memory (no host copy) and arrive as tensors there;
  // every other payload arrives on the host.
  torch::Device device = torch::kCPU;
  // Sent as "authorization: Bearer <token>" on every sample stream: the job
  // token a coordinator hands the ranks of a job (teachers under a
  // coordinator serve only those). Empty: none.
  std::string token;
  uint64_t shm_capacity = uint64_t{32} << 20;  // ring bytes per shm stream (power of two)
  absl::Duration connect_timeout = absl::Seconds(30);
  absl::Duration sample_timeout = absl::Minutes(10);  // one sample, across failovers
  // Tests only: makes TRANSPORT_NCCL channels instead of NCCL
  // (tests/testing/loopback_channel.h), so the stream protocol runs without
  // a GPU. Unset in production.
  PayloadChannelFactory nccl_channel_for_testing;
};

class TeacherConnector {
 public:
  virtual ~TeacherConnector() = default;
  // What the teacher at `address` serves (TeacherService.Describe), waiting
  // for it up to `timeout`. Thread-safe.
  virtual absl::StatusOr<v1::DescribeResponse> Describe(const std::string& address,
                                                        absl::Duration timeout) = 0;
  // A stream to the teacher at `address`, whose Describe answered `teacher`,
  // with its payload transport chosen (InvalidArgument for an unknown
  // data.transport; FailedPrecondition naming data.transport for one the
  // pair cannot use); Start opens it. `mu` and `events` must outlive the
  // stream. Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<TeacherStream>> NewStream(
      const std::string& address, const v1::DescribeResponse& teacher,
      const TeacherStreamOptions& options, absl::Mutex& mu, TeacherStreamEvents& events) = 0;
  // The target's answer to a prompt (TeacherService.Answer; the teacher's
  // Describe said `answers`), within `timeout`. Thread-safe; blocks.
  virtual absl::StatusOr<std::vector<int32_t>> Answer(const std::string& address,
                                                      const v1::AnswerRequest& request,
                                                      absl::Duration timeout) = 0;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_TEACHER_CONNECTION_H_
