// The process's surroundings that tests need to control: the wall clock and
// the filesystem's durability steps (atomic writes, renames, directory
// fsyncs). Code that must survive faults takes an Env* (null: Default()), so
// a test can stop time or make the third fsync fail (tests/testing/fake_env.h)
// without root, full disks or sleeps.
//
// Thread-safety: implementations are safe to call from any thread.
#ifndef SPECSTREAM_COMMON_ENV_H_
#define SPECSTREAM_COMMON_ENV_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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
  // The operations of common/file.h, with its guarantees and error codes.
  virtual absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) = 0;
  virtual absl::Status FsyncDirectory(const std::string& dir) = 0;
  virtual absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix) = 0;
  // rename(2): `to` is replaced atomically (an empty directory included).
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_ENV_H_
