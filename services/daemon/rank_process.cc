#include "services/daemon/rank_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "common/transport/shm_ring.h"
#include "common/unicode.h"

namespace specstream::services {
namespace {

constexpr size_t kStderrTail = 100;
constexpr absl::Duration kMetricsPollInterval = absl::Milliseconds(200);
// How often the reader wakes when nothing happens: bounds how late a SIGKILL
// escalation or (without a pidfd) an exit is noticed.
constexpr absl::Duration kTick = absl::Milliseconds(50);
constexpr size_t kMaxMetricsReadBytes = 4 << 20;

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Protobuf string fields must hold valid UTF-8; a child may print anything.
std::string SanitizeLine(std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (unicode::IsValidUtf8(line)) return line;
  return unicode::ToValidUtf8Lossy(line);
}

}  // namespace

struct RankProcess::Impl {
  RankProcessOptions options;
  Env& clock() const { return Env::Or(options.clock); }
  pid_t pid = -1;
  int pidfd = -1;  // -1 when pidfd_open is unavailable: exits are polled

  // Reader thread only.
  int out_fd = -1;
  int err_fd = -1;
  std::string partial[2];  // stdout, stderr
  bool have_metrics_file = false;
  dev_t metrics_dev = 0;
  ino_t metrics_ino = 0;
  off_t metrics_offset = 0;
  std::string metrics_partial;

  std::thread thread;

  mutable absl::Mutex mu;
  std::deque<RankOutputLine> lines ABSL_GUARDED_BY(mu);
  size_t dropped_lines ABSL_GUARDED_BY(mu) = 0;
  std::deque<std::string> metrics ABSL_GUARDED_BY(mu);
  size_t dropped_metrics ABSL_GUARDED_BY(mu) = 0;
  std::deque<std::string> stderr_tail ABSL_GUARDED_BY(mu);
  // Set only after the child was reaped and its output drained, under mu,
  // so Stop never signals a reaped (possibly reused) pid.
  std::optional<int> exit_code ABSL_GUARDED_BY(mu);
  bool stop_requested ABSL_GUARDED_BY(mu) = false;
  bool killed ABSL_GUARDED_BY(mu) = false;
  absl::Time kill_deadline ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();

  ~Impl() {
    CloseFd(out_fd);
    CloseFd(err_fd);
    CloseFd(pidfd);
  }

  void AddLine(int stream_index, std::string text) {
    text = SanitizeLine(std::move(text));
    if (!options.echo_prefix.empty()) {
      // One write per line so concurrent ranks do not interleave mid-line.
      const std::string echo = absl::StrCat(options.echo_prefix, " ", text, "\n");
      ssize_t ignored = write(STDERR_FILENO, echo.data(), echo.size());
      (void)ignored;
    }
    absl::MutexLock lock(&mu);
    if (stream_index == 1) {
      stderr_tail.push_back(text);
      if (stderr_tail.size() > kStderrTail) stderr_tail.pop_front();
    }
    lines.push_back(RankOutputLine{stream_index == 0 ? "stdout" : "stderr", std::move(text)});
    while (lines.size() > options.max_buffered_lines) {
      lines.pop_front();
      ++dropped_lines;
    }
  }

  void AddMetrics(std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return;
    line = SanitizeLine(std::move(line));
    absl::MutexLock lock(&mu);
    metrics.push_back(std::move(line));
    while (metrics.size() > options.max_buffered_lines) {
      metrics.pop_front();
      ++dropped_metrics;
    }
  }

  // Splits `buffer` into complete lines; keeps the rest (up to the line cap).
  template <typename Emit>
  void SplitLines(std::string& buffer, bool flush, Emit emit) {
    size_t start = 0;
    while (true) {
      const size_t newline = buffer.find('\n', start);
      if (newline == std::string::npos) break;
      std::string line = buffer.substr(start, newline - start);
      while (line.size() > options.max_line_bytes) {
        emit(line.substr(0, options.max_line_bytes));
        line.erase(0, options.max_line_bytes);
      }
      emit(std::move(line));
      start = newline + 1;
    }
    buffer.erase(0, start);
    while (buffer.size() > options.max_line_bytes) {
      emit(buffer.substr(0, options.max_line_bytes));
      buffer.erase(0, options.max_line_bytes);
    }
    if (flush && !buffer.empty()) {
      emit(std::move(buffer));
      buffer.clear();
    }
  }

  // Reads what the pipe holds now; closes it at EOF.
  void ReadPipe(int& fd, int stream_index) {
    char chunk[65536];
    while (fd >= 0) {
      const ssize_t n = read(fd, chunk, sizeof(chunk));
      if (n > 0) {
        partial[stream_index].append(chunk, static_cast<size_t>(n));
        SplitLines(partial[stream_index], false,
                   [&](std::string line) { AddLine(stream_index, std::move(line)); });
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      CloseFd(fd);  // EOF or a read error: nothing more will come
      SplitLines(partial[stream_index], true,
                 [&](std::string line) { AddLine(stream_index, std::move(line)); });
    }
  }

  void PollMetrics(bool final) {
    if (options.metrics_jsonl.empty()) return;
    struct stat st {};
    if (stat(options.metrics_jsonl.c_str(), &st) != 0) {
      // Gone (or not there yet): a file that appears later is read whole.
      have_metrics_file = false;
      metrics_offset = 0;
      metrics_partial.clear();
      return;
    }
    if (!have_metrics_file || st.st_dev != metrics_dev || st.st_ino != metrics_ino) {
      have_metrics_file = true;
      metrics_dev = st.st_dev;
      metrics_ino = st.st_ino;
      metrics_offset = 0;
      metrics_partial.clear();
    }
    if (st.st_size < metrics_offset) {  // truncated
      metrics_offset = 0;
      metrics_partial.clear();
    }
    auto emit = [this](std::string line) { AddMetrics(std::move(line)); };
    if (st.st_size > metrics_offset) {
      const int fd = open(options.metrics_jsonl.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return;
      const size_t want =
          std::min(static_cast<size_t>(st.st_size - metrics_offset), kMaxMetricsReadBytes);
      std::string data(want, '\0');
      ssize_t got = 0;
      while (true) {
        got = pread(fd, data.data(), want, metrics_offset);
        if (got >= 0 || errno != EINTR) break;
      }
      close(fd);
      if (got <= 0) return;
      data.resize(static_cast<size_t>(got));
      metrics_offset += got;
      metrics_partial += data;
      SplitLines(metrics_partial, false, emit);
    }
    if (final) SplitLines(metrics_partial, true, emit);
  }

  bool ChildExited() {
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) return false;
    }
    siginfo_t info{};
    // WNOWAIT: the zombie keeps the pid and process group id reserved while
    // its leftover group members are killed.
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      return errno == ECHILD;  // someone else reaped it; treat as exited
    }
    return info.si_pid == pid;
  }

  void Loop() {
    absl::Time next_metrics_poll = clock().Now();
    while (true) {
      absl::Duration timeout = kTick;
      {
        absl::MutexLock lock(&mu);
        if (stop_requested && !killed) {
          timeout =
              std::min(timeout, std::max(kill_deadline - clock().Now(), absl::ZeroDuration()));
        }
      }
      pollfd fds[3];
      int count = 0;
      if (out_fd >= 0) fds[count++] = pollfd{out_fd, POLLIN, 0};
      if (err_fd >= 0) fds[count++] = pollfd{err_fd, POLLIN, 0};
      if (pidfd >= 0) fds[count++] = pollfd{pidfd, POLLIN, 0};
      const int ready = poll(fds, static_cast<nfds_t>(count),
                             static_cast<int>(absl::ToInt64Milliseconds(timeout)));
      if (ready < 0 && errno != EINTR) {
        SS_LOG_WARN("rank process {}: poll: {}", pid, std::strerror(errno));
        absl::SleepFor(kTick);
      }
      ReadPipe(out_fd, 0);
      ReadPipe(err_fd, 1);
      const absl::Time now = clock().Now();
      if (now >= next_metrics_poll) {
        PollMetrics(false);
        next_metrics_poll = now + kMetricsPollInterval;
      }
      {
        absl::MutexLock lock(&mu);
        if (stop_requested && !killed && now >= kill_deadline) {
          SS_LOG_WARN("rank process {}: still running {} s after SIGTERM; sending SIGKILL", pid,
                      options.stop_grace_seconds);
          kill(-pid, SIGKILL);
          killed = true;
        }
      }
      if (ChildExited()) break;
    }
    // Whatever the rank started dies with it (its group), then the rest of
    // its output is collected before the exit becomes visible.
    kill(-pid, SIGKILL);
    ReadPipe(out_fd, 0);
    ReadPipe(err_fd, 1);
    for (int i = 0; i < 2; ++i) {
      SplitLines(partial[i], true, [&](std::string line) { AddLine(i, std::move(line)); });
    }
    PollMetrics(true);
    CloseFd(out_fd);
    CloseFd(err_fd);
    const int code = WaitForExit(pid, /*block=*/true).value_or(1);
    // A rank killed before it unlinked its shared-memory rings leaves them
    // in /dev/shm (memory, on Kubernetes): they are reclaimed here.
    if (const int rings = RemoveShmRingsOf(pid); rings > 0) {
      SS_LOG_INFO("rank process {}: removed {} shared-memory ring(s) it left", pid, rings);
    }
    absl::MutexLock lock(&mu);
    exit_code = code;
  }
};

RankProcess::RankProcess(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<RankProcess>> RankProcess::Start(RankProcessOptions options) {
  if (options.argv.empty() || options.argv[0].empty() || options.argv[0][0] != '/') {
    return absl::InvalidArgumentError("rank process: argv[0] must be an absolute path");
  }
  if (options.max_buffered_lines == 0) {
    return absl::InvalidArgumentError("rank process: max_buffered_lines must be > 0");
  }
  if (options.max_line_bytes == 0) {
    return absl::InvalidArgumentError("rank process: max_line_bytes must be > 0");
  }
  if (!(options.stop_grace_seconds >= 0)) {
    return absl::InvalidArgumentError("rank process: stop_grace_seconds must be >= 0");
  }
  auto impl = std::make_unique<Impl>();
  // Only lines appended from now on count: remember where the file ends.
  if (!options.metrics_jsonl.empty()) {
    struct stat st {};
    if (stat(options.metrics_jsonl.c_str(), &st) == 0) {
      impl->have_metrics_file = true;
      impl->metrics_dev = st.st_dev;
      impl->metrics_ino = st.st_ino;
      impl->metrics_offset = st.st_size;
    }
  }

  SubprocessOptions spawn;
  spawn.argv = options.argv;
  spawn.env = options.env;
  spawn.working_directory = options.working_directory;
  spawn.own_process_group = true;
  spawn.parent_death_signal = SIGKILL;
  spawn.capture_output = true;
  absl::StatusOr<SpawnedProcess> child = Spawn(spawn);
  if (!child.ok()) return Annotate(child.status(), "rank process");
  impl->options = std::move(options);
  const pid_t pid = child->pid;
  impl->pid = pid;
  impl->out_fd = child->stdout_fd;
  impl->err_fd = child->stderr_fd;
#ifdef SYS_pidfd_open
  impl->pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (impl->pidfd >= 0) fcntl(impl->pidfd, F_SETFD, FD_CLOEXEC);
#endif
  SS_LOG_DEBUG("rank process {} started: {}", pid, absl::StrJoin(impl->options.argv, " "));
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<RankProcess>(new RankProcess(std::move(impl)));
}

RankProcess::~RankProcess() {
  Stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

pid_t RankProcess::pid() const { return impl_->pid; }

RankProcessOutput RankProcess::TakeOutput() {
  RankProcessOutput output;
  absl::MutexLock lock(&impl_->mu);
  if (impl_->dropped_lines > 0) {
    output.lines.push_back(RankOutputLine{
        "daemon", absl::StrCat("[", impl_->dropped_lines,
                               " earlier output lines dropped: the daemon's buffer was full]")});
    impl_->dropped_lines = 0;
  }
  if (impl_->dropped_metrics > 0) {
    output.lines.push_back(RankOutputLine{
        "daemon", absl::StrCat("[", impl_->dropped_metrics,
                               " earlier metrics lines dropped: the daemon's buffer was full]")});
    impl_->dropped_metrics = 0;
  }
  for (RankOutputLine& line : impl_->lines) output.lines.push_back(std::move(line));
  impl_->lines.clear();
  output.metrics.assign(std::make_move_iterator(impl_->metrics.begin()),
                        std::make_move_iterator(impl_->metrics.end()));
  impl_->metrics.clear();
  return output;
}

std::optional<int> RankProcess::ExitCode() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->exit_code;
}

std::string ErrorLineOf(const std::vector<std::string>& lines) {
  auto last = [&](auto matches) -> const std::string* {
    for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
      if (matches(*it)) return &*it;
    }
    return nullptr;
  };
  if (const std::string* exit_line = last([](const std::string& line) {
        return absl::StartsWith(line, "specstream") && line.find(": ") != std::string::npos;
      })) {
    return *exit_line;
  }
  if (const std::string* logged = last([](const std::string& line) {
        return line.find("[error]") != std::string::npos ||
               line.find("[critical]") != std::string::npos;
      })) {
    return *logged;
  }
  const std::string* any = last(
      [](const std::string& line) { return line.find_first_not_of(" \t\r") != std::string::npos; });
  return any != nullptr ? *any : "";
}

std::string RankProcess::ErrorLine() const {
  absl::MutexLock lock(&impl_->mu);
  return ErrorLineOf({impl_->stderr_tail.begin(), impl_->stderr_tail.end()});
}

std::string RankProcess::LastStderr(size_t n) const {
  absl::MutexLock lock(&impl_->mu);
  const size_t take = std::min(n, impl_->stderr_tail.size());
  return absl::StrJoin(impl_->stderr_tail.end() - static_cast<std::ptrdiff_t>(take),
                       impl_->stderr_tail.end(), "\n");
}

void RankProcess::Stop() {
  absl::MutexLock lock(&impl_->mu);
  if (impl_->exit_code.has_value() || impl_->stop_requested) return;
  impl_->stop_requested = true;
  impl_->kill_deadline = impl_->clock().Now() + absl::Seconds(impl_->options.stop_grace_seconds);
  SS_LOG_DEBUG("rank process {}: SIGTERM", impl_->pid);
  if (kill(-impl_->pid, SIGTERM) != 0) kill(impl_->pid, SIGTERM);
}

bool RankProcess::stopping() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->stop_requested;
}

}  // namespace specstream::services
