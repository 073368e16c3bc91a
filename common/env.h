// The process's surroundings that tests need to control: the wall clock,
// waiting for it, and the filesystem's durability steps (atomic writes,
// renames, directory fsyncs). Code whose grace periods, backoffs and timeouts
// must be tested, or that must survive faults, takes an Env* (null:
// Default()), so a test can drive time by hand or make the third fsync fail
// (tests/testing/fake_env.h) without root, full disks or sleeps. Code that
// waits on the real world alone (gRPC deadlines, a GPU, a peer's socket) uses
// Default(). absl::Now() is called only in env.cc (the NCCL channel, which
// links no common core, times its waits on the monotonic clock);
// tests/check_clock.sh keeps it so.
//
// Thread-safety: implementations are safe to call from any thread.
#ifndef SPECSTREAM_COMMON_ENV_H_
#define SPECSTREAM_COMMON_ENV_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace specstream {

class Env {
 public:
  virtual ~Env() = default;
  // The POSIX environment: absl::Now and common/file.h. Never destroyed.
  static Env& Default();
  // `env`, or Default() when it is null.
  static Env& Or(Env* env) { return env != nullptr ? *env : Default(); }

  virtual absl::Time Now() = 0;

  // Waiting on Now()'s clock. Each returns early only as it says.
  // Blocks until Now() has advanced by `d`.
  virtual void SleepFor(absl::Duration d) = 0;
  // With `mu` held: waits until `cond` holds or Now() reaches `deadline`,
  // releasing `mu` meanwhile; returns whether `cond` holds (the contract of
  // absl::Mutex::AwaitWithDeadline).
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                                 absl::Time deadline) = 0;
  // With `mu` held: waits for `cv` to be signalled or Now() to reach
  // `deadline`; true when the deadline passed (absl::CondVar::WaitWithDeadline;
  // wakeups may be spurious).
  virtual bool WaitWithDeadline(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) = 0;
  bool AwaitWithTimeout(absl::Mutex& mu, const absl::Condition& cond, absl::Duration timeout) {
    return AwaitWithDeadline(mu, cond, Now() + timeout);
  }

  // The operations of common/file.h, with its guarantees and error codes.
  virtual absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) = 0;
  virtual absl::Status FsyncDirectory(const std::string& dir) = 0;
  virtual absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix) = 0;
  // rename(2): `to` is replaced atomically (an empty directory included).
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
};

// How ReplaceDirectory names its temporaries: MakeTempDirectory prefixes
// (XXXXXX is appended), on the same filesystem as the directory replaced.
struct DirectoryReplaceOptions {
  std::string staging_prefix;  // the new contents, until they move in
  std::string aside_prefix;    // the old directory, while the new one moves in
  // Runs once the new contents are durable, before anything is renamed (a
  // test's simulated crash); its error is returned with the staging
  // directory left behind, as a crash would leave it.
  std::function<absl::Status()> before_swap;
};

// Puts `files` (name, bytes) in place of `dir`, whole or not at all, through
// `env`'s durability steps: each file is written atomically into a new
// staging directory, which is fsynced; an existing `dir` is moved aside
// (rename(2) cannot replace a non-empty directory); the staging directory is
// renamed to `dir`, whose parent is fsynced; then the old one is removed. On
// an error before the last rename nothing new is left and `dir` is as it was
// (a failed rename puts the old directory back); the error names the step.
// Not safe against another writer of `dir` at the same time.
absl::Status ReplaceDirectory(Env& env, const std::string& dir,
                              const std::vector<std::pair<std::string, absl::string_view>>& files,
                              const DirectoryReplaceOptions& options);

// Removes `path` and everything under it; a failure is logged, not returned
// (cleanup after another error).
void RemoveAllQuietly(const std::string& path);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_ENV_H_
