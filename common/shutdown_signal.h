// SIGTERM and SIGINT for daemon mains. The handler only writes the signal
// number to a self-pipe (async-signal-safe); a thread waits on it.
//
//   RETURN_IF_ERROR(InstallShutdownSignals());   // early, before slow setup
//   ...
//   int signal_number = WaitForShutdownSignal();  // blocks
//
// One per process; Install before any thread that may wait.
#ifndef SPECSTREAM_COMMON_SHUTDOWN_SIGNAL_H_
#define SPECSTREAM_COMMON_SHUTDOWN_SIGNAL_H_

#include "absl/status/status.h"

namespace specstream {

// Creates the pipe and routes SIGTERM and SIGINT to it (SA_RESTART).
// Idempotent.
absl::Status InstallShutdownSignals();

// Blocks until SIGTERM/SIGINT arrives (or WakeShutdownWaiter is called);
// returns the signal number (0 when woken).
int WaitForShutdownSignal();

// Wakes a WaitForShutdownSignal caller without a signal (e.g. when the work
// ended on its own and a waiter thread must be joined).
void WakeShutdownWaiter();

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_SHUTDOWN_SIGNAL_H_
