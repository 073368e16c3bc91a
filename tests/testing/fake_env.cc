#include "tests/testing/fake_env.h"

#include <utility>

namespace specstream::testing {

void FakeEnv::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

void FakeEnv::FailOn(Op op, const std::string& path_part, absl::Status error, int nth) {
  absl::MutexLock lock(&mu_);
  faults_.push_back(Fault{op, path_part, std::move(error), nth});
}

int FakeEnv::calls(Op op) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

int FakeEnv::pending_faults() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(faults_.size());
}

absl::Time FakeEnv::Now() {
  absl::MutexLock lock(&mu_);
  return now_;
}

absl::Status FakeEnv::Check(Op op, const std::string& path) {
  absl::MutexLock lock(&mu_);
  ++calls_[op];
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->op != op || path.find(it->path_part) == std::string::npos) continue;
    if (--it->remaining > 0) continue;
    absl::Status error = std::move(it->error);
    faults_.erase(it);
    return error;
  }
  return absl::OkStatus();
}

absl::Status FakeEnv::WriteFileAtomically(const std::string& path, absl::string_view contents) {
  absl::Status fault = Check(Op::kWriteFileAtomically, path);
  if (!fault.ok()) return fault;
  return Env::Default().WriteFileAtomically(path, contents);
}

absl::Status FakeEnv::FsyncDirectory(const std::string& dir) {
  absl::Status fault = Check(Op::kFsyncDirectory, dir);
  if (!fault.ok()) return fault;
  return Env::Default().FsyncDirectory(dir);
}

absl::StatusOr<std::string> FakeEnv::MakeTempDirectory(const std::string& prefix) {
  absl::Status fault = Check(Op::kMakeTempDirectory, prefix);
  if (!fault.ok()) return fault;
  return Env::Default().MakeTempDirectory(prefix);
}

absl::Status FakeEnv::Rename(const std::string& from, const std::string& to) {
  absl::Status fault = Check(Op::kRename, from);
  if (!fault.ok()) return fault;
  return Env::Default().Rename(from, to);
}

}  // namespace specstream::testing
