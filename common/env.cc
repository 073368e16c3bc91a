#include "common/env.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace specstream {
namespace {

class PosixEnv final : public Env {
 public:
  absl::Time Now() override { return absl::Now(); }
  absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) override {
    return specstream::WriteFileAtomically(path, contents);
  }
  absl::Status FsyncDirectory(const std::string& dir) override {
    return specstream::FsyncDirectory(dir);
  }
  absl::StatusOr<std::string> MakeTempDirectory(const std::string& prefix) override {
    return specstream::MakeTempDirectory(prefix);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(absl::StrCat("cannot rename ", from, " to"), to);
    }
    return absl::OkStatus();
  }
};

}  // namespace

Env& Env::Default() {
  static Env* const env = new PosixEnv();
  return *env;
}

}  // namespace specstream
