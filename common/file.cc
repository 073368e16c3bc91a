#include "common/file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace specstream {
namespace {

// The process umask, read once (umask() can only be read by setting it).
mode_t FileMode() {
  static const mode_t mode = [] {
    mode_t mask = umask(022);
    umask(mask);
    return static_cast<mode_t>(0666 & ~mask);
  }();
  return mode;
}

// Creates `path`.tmp-XXXXXX beside `path` (same filesystem, so rename is
// atomic), with the permissions a plain open() would give.
absl::StatusOr<std::pair<std::string, int>> MakeTemp(const std::string& path) {
  std::string temp = path + ".tmp-XXXXXX";
  int fd = mkstemp(temp.data());
  if (fd < 0) return ErrnoStatus("cannot create a temporary file for", path);
  fchmod(fd, FileMode());
  return std::make_pair(temp, fd);
}

// fsync the data, rename over `path`, then fsync the directory so the rename
// itself survives a crash.
absl::Status SyncAndRename(int fd, const std::string& temp, const std::string& path) {
  if (fsync(fd) != 0) return ErrnoStatus("cannot fsync", temp);
  if (rename(temp.c_str(), path.c_str()) != 0) return ErrnoStatus("cannot rename into", path);
  size_t slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  (void)FsyncDirectory(dir);  // best effort: the data itself is already durable
  return absl::OkStatus();
}

}  // namespace

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  int err = errno;
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

absl::Status FsyncDirectory(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoStatus("cannot open directory", dir);
  int rc = fsync(fd);
  close(fd);
  if (rc != 0) return ErrnoStatus("cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix) {
  std::string path = prefix + "XXXXXX";
  if (mkdtemp(path.data()) == nullptr) return ErrnoStatus("cannot create directory", prefix);
  return path;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (!file) return ErrnoStatus("cannot open", path);
  std::string contents;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) {
    contents.append(buffer, n);
  }
  if (std::ferror(file.get())) return ErrnoStatus("cannot read", path);
  return contents;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  auto temp = MakeTemp(path);
  if (!temp.ok()) return temp.status();
  auto [temp_path, fd] = *temp;
  size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status status = ErrnoStatus("cannot write", temp_path);
      close(fd);
      unlink(temp_path.c_str());
      return status;
    }
    written += static_cast<size_t>(n);
  }
  absl::Status status = SyncAndRename(fd, temp_path, path);
  close(fd);
  if (!status.ok()) unlink(temp_path.c_str());
  return status;
}

absl::StatusOr<std::unique_ptr<AtomicOutputFile>> AtomicOutputFile::Create(
    const std::string& path) {
  auto temp = MakeTemp(path);
  if (!temp.ok()) return temp.status();
  std::FILE* file = fdopen(temp->second, "wb");
  if (file == nullptr) {
    close(temp->second);
    unlink(temp->first.c_str());
    return ErrnoStatus("cannot open", temp->first);
  }
  return std::unique_ptr<AtomicOutputFile>(new AtomicOutputFile(path, temp->first, file));
}

AtomicOutputFile::AtomicOutputFile(std::string path, std::string temp_path, std::FILE* file)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), file_(file) {}

AtomicOutputFile::~AtomicOutputFile() {
  if (file_ != nullptr) {
    std::fclose(file_);
    unlink(temp_path_.c_str());
  }
}

absl::Status AtomicOutputFile::Append(absl::string_view data) {
  if (file_ == nullptr) return absl::FailedPreconditionError("file already committed");
  if (std::fwrite(data.data(), 1, data.size(), file_) != data.size()) {
    return ErrnoStatus("cannot write", temp_path_);
  }
  return absl::OkStatus();
}

absl::Status AtomicOutputFile::Commit() {
  if (file_ == nullptr) return absl::FailedPreconditionError("file already committed");
  if (std::fflush(file_) != 0) return ErrnoStatus("cannot flush", temp_path_);
  absl::Status status = SyncAndRename(fileno(file_), temp_path_, path_);
  std::fclose(file_);
  file_ = nullptr;
  if (!status.ok()) unlink(temp_path_.c_str());
  return status;
}

}  // namespace specstream
