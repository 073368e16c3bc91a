// A TeacherConnector with its teachers in memory (student/teacher_connection.h),
// for tests of the online source with no server: failover, exactly-once,
// credits and slices. Each teacher computes payloads with its own
// FakeTargetRuntime (captures a known function of the ids:
// fake_target_runtime.h), packs them with the teacher's own SampleTensors
// and contract code, and answers each stream's requests in order on that
// stream's thread, within its credits. Faults on cue: a teacher down at
// Describe, killed (its streams end), restarted on the same address,
// failing or corrupting its next answer, or held (answers wait).
//
// Streams negotiate "auto" and "inline" only (payloads are host tensors),
// and serve the capture layers their options name (Open.capture_layer_ids).
// Thread-safety: every method may be called from any thread; streams keep
// the locking contract of teacher_connection.h.
#ifndef SPECSTREAM_TESTS_TESTING_FAKE_TEACHER_CONNECTION_H_
#define SPECSTREAM_TESTS_TESTING_FAKE_TEACHER_CONNECTION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "student/teacher_connection.h"
#include "tests/testing/fake_target_runtime.h"

namespace specstream::testing {

struct FakeTeacherOptions {
  FakeTargetRuntimeOptions model;
  DType payload_dtype = DType::kF32;  // aux_hidden / last_hidden
  bool keep_target_ids = true;
  int64_t max_tokens = 256;
};

class FakeTeacherConnector final : public student::TeacherConnector {
 public:
  // Teachers at `addresses`, all serving the model `options` describes.
  explicit FakeTeacherConnector(const std::vector<std::string>& addresses,
                                FakeTeacherOptions options = {});
  ~FakeTeacherConnector() override;

  absl::StatusOr<v1::DescribeResponse> Describe(const std::string& address,
                                                absl::Duration timeout) override;
  absl::StatusOr<std::unique_ptr<student::TeacherStream>> NewStream(
      const std::string& address, const v1::DescribeResponse& teacher,
      const student::TeacherStreamOptions& options, absl::Mutex& mu,
      student::TeacherStreamEvents& events) override;
  // Fake teachers do not decode (Describe.answers is false): Unimplemented.
  absl::StatusOr<std::vector<int32_t>> Answer(const std::string& address,
                                              const v1::AnswerRequest& request,
                                              absl::Duration timeout) override;

  // --- Cues ---
  // Describe of `address` fails (UNAVAILABLE) from now on.
  void SetDown(const std::string& address);
  // `address` serves another model (hidden size + 1) from now on.
  void ServeAnotherModel(const std::string& address);
  // `address` predates Open.capture_layer_ids from now on: Describe says it
  // serves only its own capture layers, and new streams ignore the field.
  void ServeOwnCaptureLayersOnly(const std::string& address);
  // New streams of `address` ignore Open.capture_layer_ids although its
  // Describe says it honours them (a broken teacher).
  void IgnoreCaptureLayers(const std::string& address);
  // Every open stream of `address` ends now; what it had not answered is
  // lost. Later streams to it end at once, and its Describe fails.
  void Kill(const std::string& address);
  // A killed or down teacher serves again (a restart on the same address):
  // Describe answers and new streams work.
  void Restart(const std::string& address);
  // The next `n` Describe calls of `address` are refused UNAUTHENTICATED (a
  // restarted teacher daemon that has not yet heard the job's token from
  // the coordinator).
  void RefuseTokens(const std::string& address, int n);
  // The next request `address` answers fails with `status` (a SampleError).
  void FailNext(const std::string& address, absl::Status status);
  // The next payload of `address` has one byte flipped after its checksum.
  void CorruptNext(const std::string& address);
  // Answers of `address` wait until Release (its runtime's Forward holds).
  void Hold(const std::string& address);
  void Release(const std::string& address);

  // --- What the teachers saw ---
  // Sample requests `address` received, in order (all its streams).
  std::vector<v1::StreamRequest::SampleRequest> requests(const std::string& address) const;
  // Sample ids acknowledged to `address`, in order.
  std::vector<int64_t> acks(const std::string& address) const;
  // The most samples `address` ever had answered and not acknowledged at
  // once, on any one stream (bounded by the credits it was granted).
  int64_t max_outstanding(const std::string& address) const;
  // Answers `address` has sent (payloads and errors).
  int64_t answers(const std::string& address) const;
  // Describe calls `address` received (answered or not).
  int64_t describes(const std::string& address) const;
  // Waits until `address` has received at least `n` Describe calls; false
  // past `timeout`.
  bool AwaitDescribes(const std::string& address, int64_t n, absl::Duration timeout) const;
  // Waits until `address` has sent at least `n` answers; false past
  // `timeout`.
  bool AwaitAnswers(const std::string& address, int64_t n, absl::Duration timeout) const;

  // The FakeTargetRuntime behind `address` (for expected captures).
  FakeTargetRuntime& runtime(const std::string& address);

  class Stream;
  struct Teacher;

 private:
  Teacher& TeacherAt(const std::string& address) const;

  const FakeTeacherOptions options_;
  std::map<std::string, std::unique_ptr<Teacher>> teachers_;  // fixed at construction
  mutable absl::Mutex mu_;  // the teachers' and streams' state (after a source's mutex)
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_FAKE_TEACHER_CONNECTION_H_
