// The teacher's gRPC adapter (DESIGN §5): TeacherService.Describe,
// TeacherService.StreamHiddenStates and TeacherService.Answer over the gRPC-free teacher core
// (teacher/teacher_core.h), and the server around them. Each stream is a
// callback reactor that unpacks requests, hands them to its StreamSession,
// and frames what the session writes (inline chunks in place, without a
// copy: common/grpc/byte_buffer.h); the protocol itself lives in
// teacher/stream_session.h.
//
// Thread-safety: gRPC's callback threads run the reactors (one read and one
// write in flight per stream); every method of TeacherServer may be called
// from any thread. Lifetime: the runtime must outlive the server.
#ifndef SPECSTREAM_SERVICES_TEACHER_TEACHER_SERVICE_H_
#define SPECSTREAM_SERVICES_TEACHER_TEACHER_SERVICE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc/auth.h"
#include "common/grpc/reflection.h"
#include "grpcpp/grpcpp.h"
#include "specstream/v1/teacher.grpc.pb.h"
#include "teacher/teacher_core.h"

namespace specstream::services {

// The generated service, bound to a core that outlives it.
class TeacherService final
    : public v1::TeacherService::WithRawCallbackMethod_StreamHiddenStates<
          v1::TeacherService::WithCallbackMethod_Describe<
              v1::TeacherService::WithCallbackMethod_Answer<v1::TeacherService::Service>>> {
 public:
  explicit TeacherService(teacher::TeacherCore& core) : core_(core) {}

  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const v1::DescribeRequest* request,
                                     v1::DescribeResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StreamHiddenStates(
      grpc::CallbackServerContext* context) override;
  // Admitted as Describe is, then TeacherCore::Answer.
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                   const v1::AnswerRequest* request,
                                   v1::AnswerResponse* response) override;

 private:
  teacher::TeacherCore& core_;
};

struct TeacherServerOptions {
  // Listening address: host (IPv4, IPv6 or a name) and port (0 picks a free
  // one; see TeacherServer::port()).
  std::string host = "127.0.0.1";
  int port = 0;
  teacher::TeacherServiceOptions service;
  // gRPC keepalive: ping an idle connection every keepalive_time and drop it
  // when the ping is not answered within keepalive_timeout.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // TLS (and with client_ca, mutual TLS) for every call; empty cert:
  // plaintext. Checked as the coordinator's flags are (common/grpc/auth.h).
  TlsServerFiles tls;
};

// The authorizer of a standalone teacher (serve --token-file): streams and
// Describe must present `token` (compared in constant time); decides at
// once.
teacher::TeacherServiceOptions::Authorizer TokenAuthorizer(std::string token);

// A started gRPC server: TeacherService, the standard health service
// (grpc.health.v1.Health; SERVING for "" and "specstream.v1.TeacherService"
// once started) and server reflection (common/grpc/reflection.h: with the
// token the streams take), with explicit message size limits,
// keepalive, and the channel arguments that bulk payloads need
// (common/grpc/channel_args.h).
class TeacherServer final {
 public:
  static absl::StatusOr<std::unique_ptr<TeacherServer>> Start(teacher::TargetRuntime& runtime,
                                                              TeacherServerOptions options);
  // Shutdown(absl::ZeroDuration()) unless already shut down.
  ~TeacherServer();
  TeacherServer(const TeacherServer&) = delete;
  TeacherServer& operator=(const TeacherServer&) = delete;

  int port() const { return port_; }
  // "host:port" (IPv6 hosts in brackets), the address clients dial.
  const std::string& address() const { return address_; }
  teacher::TeacherCore& core() { return *core_; }

  // Health NOT_SERVING, drain the streams (TeacherCore::StartDraining),
  // wait for them until `timeout` has passed, shut the gRPC server down
  // (cancelling streams still open then), stop the compute thread.
  // Idempotent; returns when everything has stopped.
  void Shutdown(absl::Duration timeout);

 private:
  TeacherServer() = default;
  std::unique_ptr<teacher::TeacherCore> core_;
  std::unique_ptr<TeacherService> service_;
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// The name the health service reports the teacher service under.
inline constexpr char kTeacherServiceName[] = "specstream.v1.TeacherService";

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_TEACHER_TEACHER_SERVICE_H_
