// An Env (common/env.h) for tests: a clock that moves only when the test
// moves it, waits that end when it passes their deadline, and filesystem
// faults on cue. Calls that are not told to fail
// reach the real filesystem through Env::Default().
//
// Thread-safety: every method may be called from any thread.
#ifndef SPECSTREAM_TESTS_TESTING_FAKE_ENV_H_
#define SPECSTREAM_TESTS_TESTING_FAKE_ENV_H_

#include <map>
#include <set>
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
  // Blocks (in real time, up to `real_limit`) until at least `n` threads are
  // in a timed wait of this Env; false on the limit. A test calls it before
  // Advance so that the code under test has reached the wait it means to end.
  bool AwaitWaiters(int n, absl::Duration real_limit = absl::Seconds(30)) ABSL_LOCKS_EXCLUDED(mu_);
  // The earliest deadline of a thread waiting now (InfiniteFuture if none).
  absl::Time NextDeadline() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks (in real time, up to `real_limit`) until `n` threads wait with
  // `deadline`; false on the limit (the code under test chose another).
  bool AwaitDeadline(absl::Time deadline, int n = 1, absl::Duration real_limit = absl::Seconds(30))
      ABSL_LOCKS_EXCLUDED(mu_);
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
  // Waits end when Advance moves Now() to their deadline, or as in real
  // time when their condition holds (checked every millisecond of real
  // time). A condition-variable wait also returns, spuriously, after each
  // millisecond: its caller's predicate decides.
  void SleepFor(absl::Duration d) override ABSL_LOCKS_EXCLUDED(mu_);
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);
  bool WaitWithDeadline(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);
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
  // Records a waiter until `deadline`; returns its handle for Leave.
  std::multiset<absl::Time>::iterator Enter(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void Leave(std::multiset<absl::Time>::iterator waiter) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  std::vector<Fault> faults_ ABSL_GUARDED_BY(mu_);
  std::map<Op, int> calls_ ABSL_GUARDED_BY(mu_);
  std::multiset<absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);  // of threads waiting
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_FAKE_ENV_H_
