#include "common/env.h"

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/status.h"

namespace specstream {
namespace {

class PosixEnv final : public Env {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                         absl::Time deadline) override {
    return mu.AwaitWithDeadline(cond, deadline);
  }
  bool WaitWithDeadline(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) override {
    return cv.WaitWithDeadline(&mu, deadline);
  }
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

void RemoveAllQuietly(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) SS_LOG_WARN("cannot remove {}: {}", path, ec.message());
}

absl::Status ReplaceDirectory(Env& env, const std::string& dir,
                              const std::vector<std::pair<std::string, absl::string_view>>& files,
                              const DirectoryReplaceOptions& options) {
  ASSIGN_OR_RETURN(const std::string staging, env.MakeTempDirectory(options.staging_prefix));
  auto fail = [&](const absl::Status& status) {
    RemoveAllQuietly(staging);
    return status;
  };
  for (const auto& [name, bytes] : files) {
    if (absl::Status s = env.WriteFileAtomically(absl::StrCat(staging, "/", name), bytes);
        !s.ok()) {
      return fail(s);
    }
  }
  if (absl::Status s = env.FsyncDirectory(staging); !s.ok()) return fail(s);
  if (options.before_swap) RETURN_IF_ERROR(options.before_swap());

  std::string aside;  // the old `dir`, removed at the end
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(dir, ec))) {
    absl::StatusOr<std::string> made = env.MakeTempDirectory(options.aside_prefix);
    if (!made.ok()) return fail(made.status());
    // rename(2) may replace the empty directory just made.
    if (absl::Status s = env.Rename(dir, *made); !s.ok()) {
      RemoveAllQuietly(*made);
      return fail(Annotate(s, "moving the old directory aside"));
    }
    aside = *std::move(made);
  }
  if (absl::Status s = env.Rename(staging, dir); !s.ok()) {
    // The old directory goes back where it was: a failed replace loses nothing.
    if (!aside.empty() && !env.Rename(aside, dir).ok()) {
      SS_LOG_WARN("cannot move {} back to {}", aside, dir);
    }
    return fail(s);
  }
  const std::string parent = std::filesystem::path(dir).parent_path().string();
  absl::Status synced = env.FsyncDirectory(parent.empty() ? "." : parent);
  if (!aside.empty()) RemoveAllQuietly(aside);
  return synced;
}

}  // namespace specstream
