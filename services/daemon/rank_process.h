// One rank of a job, run by a student daemon as a child process
// (`specstream-student train ...`): its stdout and stderr read line by line,
// its metrics JSON-lines file tailed, its exit observed, and a graceful stop
// (SIGTERM to its process group, SIGKILL after a grace period).
//
//   RankProcessOptions options;
//   options.argv = {"/usr/bin/specstream-student", "train", "--config", path};
//   options.env = {"RANK=0", "WORLD_SIZE=2"};
//   options.metrics_jsonl = dir + "/metrics.jsonl";
//   ASSIGN_OR_RETURN(auto process, RankProcess::Start(std::move(options)));
//   ... every heartbeat: process->ExitCode(), then process->TakeOutput() ...
//
// The child runs in its own process group (so Stop reaches whatever it
// starts) and gets SIGKILL when the thread that called Start exits
// (PR_SET_PDEATHSIG follows the forking *thread*): call Start from a thread
// that outlives the process, not from a short-lived worker.
//
// Thread-safety: all methods may be called from any thread. One internal
// thread per process reads the pipes, polls the metrics file (every
// ~200 ms), reaps the child and escalates Stop to SIGKILL.
#ifndef SPECSTREAM_SERVICES_DAEMON_RANK_PROCESS_H_
#define SPECSTREAM_SERVICES_DAEMON_RANK_PROCESS_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"

namespace specstream::services {

struct RankProcessOptions {
  // argv[0] must be an absolute path (no PATH lookup).
  std::vector<std::string> argv;
  // "K=V" entries added to the inherited environment, replacing inherited
  // entries with the same K.
  std::vector<std::string> env;
  // The child's working directory; empty: the daemon's.
  std::string working_directory;
  // A JSON-lines file the child appends to; only lines appended after Start
  // are reported. It need not exist yet; a file that is replaced or
  // truncated is read again from its start. Empty: no metrics.
  std::string metrics_jsonl;
  // Output lines (and, separately, metrics lines) kept between TakeOutput
  // calls; beyond it the oldest are dropped and a "daemon" line says how
  // many.
  size_t max_buffered_lines = 10000;
  // Longer lines are split.
  size_t max_line_bytes = 64 * 1024;
  // Seconds between Stop's SIGTERM and SIGKILL, on `clock`.
  double stop_grace_seconds = 30;
  // The clock of the grace period and the metrics polls (null:
  // Env::Default()). Output and exits are still watched in real time.
  Env* clock = nullptr;
  // Non-empty: also write every stdout/stderr line to the daemon's stderr as
  // "<echo_prefix> <line>" (e.g. "[job-1 rank 0]").
  std::string echo_prefix;
};

struct RankOutputLine {
  std::string stream;  // "stdout" | "stderr" | "daemon" (dropped-lines marker)
  std::string text;    // without the trailing newline
};

struct RankProcessOutput {
  std::vector<RankOutputLine> lines;
  std::vector<std::string> metrics;  // raw JSON lines, oldest first
};

class RankProcess final {
 public:
  // Validates the options, forks and execs. An argv[0] that cannot be
  // executed is an error here (the exec failure is reported back through a
  // close-on-exec pipe), not a child exiting 127.
  static absl::StatusOr<std::unique_ptr<RankProcess>> Start(RankProcessOptions options);
  // Stops the child (as Stop) and waits until it is reaped: up to the stop
  // grace period plus the time SIGKILL takes.
  ~RankProcess();
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  pid_t pid() const;

  // Lines and metrics since the previous call. Once ExitCode() has a value,
  // everything the child wrote before exiting is already buffered.
  RankProcessOutput TakeOutput();

  // nullopt while running; the exit status, or 128+N when killed by signal N.
  std::optional<int> ExitCode() const;

  // The last `n` stderr lines (at most 100 are kept), joined with "\n".
  std::string LastStderr(size_t n) const;
  // ErrorLineOf over the stderr lines kept: why a failed rank ended.
  std::string ErrorLine() const;

  // SIGTERM to the child's process group now and SIGKILL after the grace
  // period unless it has exited. Returns at once; repeated calls are no-ops.
  void Stop();

  // True once Stop was called.
  bool stopping() const;

 private:
  struct Impl;
  explicit RankProcess(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The line of a rank's stderr that says why it ended: the last
// "<program>: <message>" line a SpecStream binary prints as it exits on an
// error (common/exit_code.h ReportExit), else the last logged error
// ("[error]" or "[critical]"), else the last non-empty line; "" for none.
std::string ErrorLineOf(const std::vector<std::string>& lines);

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_DAEMON_RANK_PROCESS_H_
