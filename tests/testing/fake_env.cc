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

namespace {
// How often a condition or condition-variable wait looks at the fake clock.
constexpr absl::Duration kPoll = absl::Milliseconds(1);
}  // namespace

bool FakeEnv::AwaitWaiters(int n, absl::Duration real_limit) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(deadlines_.size()) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), real_limit);
}

absl::Time FakeEnv::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  return deadlines_.empty() ? absl::InfiniteFuture() : *deadlines_.begin();
}

bool FakeEnv::AwaitDeadline(absl::Time deadline, int n, absl::Duration real_limit) {
  absl::MutexLock lock(&mu_);
  auto waiting = [this, deadline, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(deadlines_.count(deadline)) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&waiting), real_limit);
}

std::multiset<absl::Time>::iterator FakeEnv::Enter(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return deadlines_.insert(deadline);
}

void FakeEnv::Leave(std::multiset<absl::Time>::iterator waiter) {
  absl::MutexLock lock(&mu_);
  deadlines_.erase(waiter);
}

void FakeEnv::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = now_ + d;
  auto waiter = deadlines_.insert(deadline);
  auto passed = [this, deadline]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return now_ >= deadline; };
  mu_.Await(absl::Condition(&passed));
  deadlines_.erase(waiter);
}

bool FakeEnv::AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) {
  auto waiter = Enter(deadline);
  bool holds = false;
  while (!(holds = mu.AwaitWithTimeout(cond, kPoll)) && Now() < deadline) {
  }
  Leave(waiter);
  return holds;
}

bool FakeEnv::WaitWithDeadline(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) {
  // One slice, then back to the caller, whose predicate decides (a wakeup
  // may be spurious): a signal racing the slice's timeout is not lost.
  auto waiter = Enter(deadline);
  if (Now() < deadline) cv.WaitWithTimeout(&mu, kPoll);
  Leave(waiter);
  return Now() >= deadline;
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
