// The one way SpecStream starts a child process: the student daemon's rank
// processes (services/daemon/rank_process.h), the teacher's TP workers
// (teacher/tp_launcher.h) and `specstream-student train --nproc` all call
// Spawn. It forks and execs with only async-signal-safe calls in between,
// reports a failed exec as a status (through a close-on-exec pipe) instead
// of a child exiting 127, and gives the child a clean start: default signal
// dispositions, an empty signal mask, and no descriptor of the parent's but
// stdin/stdout/stderr.
//
//   SubprocessOptions options;
//   options.argv = {"/usr/bin/specstream-student", "train", "--config", path};
//   options.env = {"RANK=0", "WORLD_SIZE=2"};
//   ASSIGN_OR_RETURN(SpawnedProcess child, Spawn(options));
//   ... WaitForExit(child.pid, /*block=*/true) ...
//
// Reaping is the caller's: Spawn returns a pid, and the caller waits for it
// (WaitForExit or its own waitpid) exactly once. Thread-safe; the parent
// death signal follows the *calling thread* (PR_SET_PDEATHSIG), so call Spawn
// from a thread that outlives the child when it is set.
#ifndef SPECSTREAM_COMMON_SUBPROCESS_H_
#define SPECSTREAM_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specstream {

struct SubprocessOptions {
  // argv[0] must be an absolute path (no PATH lookup).
  std::vector<std::string> argv;
  // "K=V" entries added to the inherited environment, replacing inherited
  // entries with the same K.
  std::vector<std::string> env;
  // Names removed from the inherited environment (before `env` is added).
  std::vector<std::string> unset_env;
  // The child's working directory; empty: the parent's.
  std::string working_directory;
  // The child leads a process group of its own (so a signal to -pid reaches
  // whatever it starts).
  bool own_process_group = false;
  // Sent to the child when the thread that called Spawn exits; 0: none.
  int parent_death_signal = 0;
  // stdout and stderr go to pipes whose read ends Spawn returns
  // (close-on-exec, non-blocking), and stdin reads /dev/null; false: the
  // child inherits all three.
  bool capture_output = false;
};

struct SpawnedProcess {
  pid_t pid = -1;
  // With capture_output: the read ends of the child's stdout and stderr,
  // owned by the caller. -1 otherwise.
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// Validates the options (InvalidArgument naming the field), forks and
// execs. An argv[0] that cannot be executed is NotFound (ENOENT) or
// FailedPrecondition here, naming it; the failed child is already reaped.
absl::StatusOr<SpawnedProcess> Spawn(const SubprocessOptions& options);

// The exit code of a wait status: the code, or 128+N when killed by signal
// N (the shell's convention).
int ExitCodeFromWaitStatus(int status);

// Reaps `pid`: its exit code (ExitCodeFromWaitStatus), or nullopt when
// `block` is false and it is still running. Retries on EINTR; 1 when `pid`
// is not a child of this process (already reaped).
std::optional<int> WaitForExit(pid_t pid, bool block);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_SUBPROCESS_H_
