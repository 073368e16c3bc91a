// The student's TeacherConnector over gRPC (student/teacher_connection.h):
// TeacherService.Describe, and one StreamHiddenStates call per stream (the
// callback reactor API) with its payload transport:
//   * inline: PayloadChunks on the stream itself;
//   * shm: a shared-memory ring this student creates; the stream carries
//     each record's position;
//   * nccl: a two-rank communicator this student creates; payloads arrive on
//     a per-stream receiver thread, straight into the trainer's CUDA device
//     when the channel is on it.
// "auto" takes shared memory with a teacher on this host (same hostname and
// boot id) and inline otherwise; NCCL only when asked for.
//
// Thread-safety: Describe and NewStream may be called from any thread; a
// stream keeps the locking contract of teacher_connection.h (its gRPC
// callbacks take the source's mutex).
#ifndef SPECSTREAM_SERVICES_STUDENT_GRPC_TEACHER_CONNECTION_H_
#define SPECSTREAM_SERVICES_STUDENT_GRPC_TEACHER_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/auth.h"
#include "grpcpp/channel.h"
#include "student/teacher_connection.h"

namespace specstream::services {

struct GrpcTeacherConnectorOptions {
  // Bearer token for Describe (streams carry TeacherStreamOptions.token):
  // the job token, or a standalone teacher's token. "" sends none.
  std::string token;
  // Empty `ca`: plaintext. Otherwise TLS verified against it, presenting
  // cert/key when given (a teacher with --tls-client-ca requires them).
  TlsClientFiles tls;
};

class GrpcTeacherConnector final : public student::TeacherConnector {
 public:
  GrpcTeacherConnector() = default;
  // The TLS files are read here: a missing or non-PEM file is
  // InvalidArgument naming its flag.
  static absl::StatusOr<std::shared_ptr<GrpcTeacherConnector>> Create(
      GrpcTeacherConnectorOptions options);

  absl::StatusOr<v1::DescribeResponse> Describe(const std::string& address,
                                                absl::Duration timeout) override;
  absl::StatusOr<std::unique_ptr<student::TeacherStream>> NewStream(
      const std::string& address, const v1::DescribeResponse& teacher,
      const student::TeacherStreamOptions& options, absl::Mutex& mu,
      student::TeacherStreamEvents& events) override;
  absl::StatusOr<std::vector<int32_t>> Answer(const std::string& address,
                                              const v1::AnswerRequest& request,
                                              absl::Duration timeout) override;

 private:
  // One channel per teacher address, shared by its Describe and streams.
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  std::string token_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // null: plaintext
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_STUDENT_GRPC_TEACHER_CONNECTION_H_
