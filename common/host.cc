#include "common/host.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace specstream {

std::string LocalHostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

std::string LocalBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

absl::StatusOr<std::string> SelfExecutable() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error || self.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot resolve /proc/self/exe: ", error ? error.message() : "empty"));
  }
  return self.string();
}

}  // namespace specstream
