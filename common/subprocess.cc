#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace specstream {
namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

struct ChildSetup {
  pid_t parent = 0;
  int stdin_fd = -1;  // -1: inherit stdin, stdout and stderr
  int stdout_fd = -1;
  int stderr_fd = -1;
  int error_fd = -1;
  bool own_process_group = false;
  int parent_death_signal = 0;
  const char* cwd = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
};

// Child side of fork: only async-signal-safe calls from here to execve.
[[noreturn]] void ExecChild(const ChildSetup& s) {
  auto fail = [&s](int error) {
    ssize_t ignored = write(s.error_fd, &error, sizeof(error));
    (void)ignored;
    _exit(127);
  };
  if (s.own_process_group) setpgid(0, 0);
  if (s.parent_death_signal != 0) {
    // PDEATHSIG fires when the forking thread exits; if the parent is
    // already gone the signal was missed, so check once after arming it.
    if (prctl(PR_SET_PDEATHSIG, s.parent_death_signal) != 0) fail(errno);
    if (getppid() != s.parent) _exit(127);
  }
  // exec keeps ignored signals and the signal mask; the child wants neither
  // from its parent.
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
  if (s.stdin_fd >= 0 &&
      (dup2(s.stdin_fd, STDIN_FILENO) < 0 || dup2(s.stdout_fd, STDOUT_FILENO) < 0 ||
       dup2(s.stderr_fd, STDERR_FILENO) < 0)) {
    fail(errno);
  }
#ifdef SYS_close_range
  // Descriptors the parent opened without O_CLOEXEC (gRPC, sockets) must not
  // leak into the child. 4 = CLOSE_RANGE_CLOEXEC; errors (old kernels) are
  // harmless.
  syscall(SYS_close_range, 3U, ~0U, 4U);
#endif
  if (s.cwd != nullptr && chdir(s.cwd) != 0) fail(errno);
  execve(s.argv[0], s.argv, s.envp);
  fail(errno);
  _exit(127);  // unreachable
}

absl::Status CheckEnvEntry(const std::string& entry) {
  const size_t eq = entry.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("env entry \"", entry, "\" is not K=V"));
  }
  return absl::OkStatus();
}

}  // namespace

int ExitCodeFromWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::optional<int> WaitForExit(pid_t pid, bool block) {
  int status = 0;
  pid_t reaped = -1;
  do {
    reaped = waitpid(pid, &status, block ? 0 : WNOHANG);
  } while (reaped < 0 && errno == EINTR);
  if (reaped == 0) return std::nullopt;
  if (reaped != pid) return 1;
  return ExitCodeFromWaitStatus(status);
}

absl::StatusOr<SpawnedProcess> Spawn(const SubprocessOptions& options) {
  if (options.argv.empty() || options.argv[0].empty() || options.argv[0][0] != '/') {
    return absl::InvalidArgumentError("argv[0] must be an absolute path");
  }
  absl::flat_hash_set<std::string> replaced(options.unset_env.begin(), options.unset_env.end());
  for (const std::string& entry : options.env) {
    if (absl::Status s = CheckEnvEntry(entry); !s.ok()) return s;
    replaced.insert(entry.substr(0, entry.find('=')));
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && replaced.contains(entry.substr(0, eq))) continue;
    env_strings.push_back(entry);
  }
  env_strings.insert(env_strings.end(), options.env.begin(), options.env.end());
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = options.argv;
  std::vector<char*> argvp;
  for (std::string& a : argv_strings) argvp.push_back(a.data());
  argvp.push_back(nullptr);

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, error_pipe[2] = {-1, -1};
  int devnull = -1;
  auto close_all = [&]() {
    for (int* fd : {&out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1], &error_pipe[0],
                    &error_pipe[1], &devnull}) {
      CloseFd(*fd);
    }
  };
  if (pipe2(error_pipe, O_CLOEXEC) != 0 ||
      (options.capture_output &&
       (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0))) {
    const int error = errno;
    close_all();
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(error)));
  }
  if (options.capture_output) {
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) {
      const int error = errno;
      close_all();
      return absl::InternalError(absl::StrCat("/dev/null: ", std::strerror(error)));
    }
  }

  ChildSetup setup;
  setup.parent = getpid();
  setup.stdin_fd = devnull;
  setup.stdout_fd = out_pipe[1];
  setup.stderr_fd = err_pipe[1];
  setup.error_fd = error_pipe[1];
  setup.own_process_group = options.own_process_group;
  setup.parent_death_signal = options.parent_death_signal;
  setup.cwd = options.working_directory.empty() ? nullptr : options.working_directory.c_str();
  setup.argv = argvp.data();
  setup.envp = envp.data();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close_all();
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(error)));
  }
  if (pid == 0) ExecChild(setup);
  // Both sides set the group, so it exists whichever runs first.
  if (options.own_process_group) setpgid(pid, pid);
  CloseFd(out_pipe[1]);
  CloseFd(err_pipe[1]);
  CloseFd(error_pipe[1]);
  CloseFd(devnull);

  int exec_errno = 0;
  ssize_t n = 0;
  do {
    n = read(error_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  CloseFd(error_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    WaitForExit(pid, /*block=*/true);
    close_all();
    const std::string message =
        absl::StrCat("cannot execute ", options.argv[0], ": ", std::strerror(exec_errno));
    return exec_errno == ENOENT ? absl::NotFoundError(message)
                                : absl::FailedPreconditionError(message);
  }
  SpawnedProcess child;
  child.pid = pid;
  if (options.capture_output) {
    fcntl(out_pipe[0], F_SETFL, fcntl(out_pipe[0], F_GETFL) | O_NONBLOCK);
    fcntl(err_pipe[0], F_SETFL, fcntl(err_pipe[0], F_GETFL) | O_NONBLOCK);
    child.stdout_fd = out_pipe[0];
    child.stderr_fd = err_pipe[0];
  }
  return child;
}

}  // namespace specstream
