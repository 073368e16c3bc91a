#include "common/shutdown_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "common/file.h"

namespace specstream {
namespace {

int g_pipe[2] = {-1, -1};

extern "C" void OnShutdownSignal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  if (write(g_pipe[1], &byte, 1) < 0) {
    // The pipe already holds a signal; that suffices.
  }
  errno = saved_errno;
}

}  // namespace

absl::Status InstallShutdownSignals() {
  if (g_pipe[0] >= 0) return absl::OkStatus();
  if (pipe2(g_pipe, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", "shutdown signals");
  struct sigaction action {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  return absl::OkStatus();
}

int WaitForShutdownSignal() {
  unsigned char signal_number = 0;
  while (read(g_pipe[0], &signal_number, 1) < 0 && errno == EINTR) {
  }
  return signal_number;
}

void WakeShutdownWaiter() { OnShutdownSignal(0); }

}  // namespace specstream
