// Small filesystem helpers with the guarantees the data tools promise:
// outputs appear whole or not at all.
#ifndef SPECSTREAM_COMMON_FILE_H_
#define SPECSTREAM_COMMON_FILE_H_

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specstream {

absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// A status for the current errno: "<what> <path>: <strerror>", NotFound for
// ENOENT, PermissionDenied for EACCES/EPERM, Internal otherwise.
absl::Status ErrnoStatus(absl::string_view what, const std::string& path);

// fsync a directory so entries created or renamed in it survive a crash.
absl::Status FsyncDirectory(const std::string& dir);

// mkdtemp(prefix + "XXXXXX"); returns the directory created.
absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix);

// Writes `contents` to a temporary file beside `path`, fsyncs it, and renames
// it over `path`. On any failure `path` is untouched and no temporary is left.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// A file written incrementally that appears at `path` only on Commit().
// Destroying it uncommitted removes the temporary. Not thread-safe.
class AtomicOutputFile final {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicOutputFile>> Create(const std::string& path);
  ~AtomicOutputFile();
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  absl::Status Append(absl::string_view data);
  // fsync + rename; after it the object is inert.
  absl::Status Commit();

 private:
  AtomicOutputFile(std::string path, std::string temp_path, std::FILE* file);
  std::string path_;
  std::string temp_path_;
  std::FILE* file_;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_FILE_H_
