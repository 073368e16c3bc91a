// An Env (common/env.h) for tests: a clock that moves only when the test
// moves it, and filesystem faults on cue. Calls that are not told to fail
// reach the real filesystem through Env::Default().
//
// Thread-safety: every method may be called from any thread.
#ifndef SPECSTREAM_TESTS_TESTING_FAKE_ENV_H_
#define SPECSTREAM_TESTS_TESTING_FAKE_ENV_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace specstream::testing {

class FakeEnv final : public Env {
 public:
  enum class Op { kWriteFileAtomically, kFsyncDirectory, kMakeTempDirectory, kRename };

  explicit FakeEnv(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}

  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  // The `nth` (1-based) call of `op` from now on whose path (`from` for a
  // rename) contains `path_part` returns `error` instead of doing anything.
  // Each fault fires once; several may be pending.
  void FailOn(Op op, const std::string& path_part, absl::Status error, int nth = 1)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls of `op` so far (failed ones included).
  int calls(Op op) const ABSL_LOCKS_EXCLUDED(mu_);
  // Faults armed but not fired yet.
  int pending_faults() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::Time Now() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) override;
  absl::Status FsyncDirectory(const std::string& dir) override;
  absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;

 private:
  struct Fault {
    Op op;
    std::string path_part;
    absl::Status error;
    int remaining;  // matching calls until it fires
  };
  // Counts the call; the error of a fault that fires on it, else OK.
  absl::Status Check(Op op, const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  std::vector<Fault> faults_ ABSL_GUARDED_BY(mu_);
  std::map<Op, int> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_FAKE_ENV_H_
