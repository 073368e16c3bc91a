#include "common/sigbus_guard.h"

#include <atomic>
#include <csetjmp>  // sigsetjmp, siglongjmp (POSIX, declared by glibc's <setjmp.h>)
#include <csignal>  // sigaction (POSIX)
#include <mutex>

#include "absl/base/attributes.h"

namespace specstream {
namespace {

// One guarded region on one thread; `outer` is the region it is nested in.
struct GuardFrame {
  sigjmp_buf env;
  GuardFrame* outer = nullptr;
  // Written by the handler, read after siglongjmp: volatile so the read is
  // not served from a register that sigsetjmp's return clobbered.
  volatile uintptr_t fault_address = 0;
};

// The innermost region of this thread, or null. Read by the signal handler:
// constant-initialised and initial-exec, so touching it there never
// allocates TLS (which would not be async-signal-safe).
ABSL_CONST_INIT thread_local GuardFrame* t_frame ABSL_ATTRIBUTE_INITIAL_EXEC = nullptr;

// The disposition our handler replaced; written once, before the handler is
// installed.
struct sigaction g_previous;

void ChainToPrevious(int signo, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0) {
    g_previous.sa_sigaction(signo, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(signo);
    return;
  }
  const bool sent = info->si_code <= 0;  // kill, raise, sigqueue: not a fault
  if (g_previous.sa_handler == SIG_IGN && sent) return;
  // Default action (or an ignored fault, which the kernel kills for anyway):
  // put it back, so a fault re-executes its instruction and dies of SIGBUS
  // exactly as without this file, and a sent signal is raised again
  // (SA_NODEFER: delivered at once, to the default action).
  sigaction(SIGBUS, &g_previous, nullptr);
  if (sent) raise(SIGBUS);
}

extern "C" void OnSigbus(int signo, siginfo_t* info, void* context) {
  GuardFrame* frame = t_frame;
  // si_code > 0: raised by the kernel for this thread's own memory access.
  if (frame != nullptr && info != nullptr && info->si_code > 0) {
    frame->fault_address = reinterpret_cast<uintptr_t>(info->si_addr);
    siglongjmp(frame->env, 1);
  }
  ChainToPrevious(signo, info, context);
}

void InstallHandlerOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigaction(SIGBUS, nullptr, &g_previous);
    struct sigaction action {};
    action.sa_sigaction = OnSigbus;
    sigemptyset(&action.sa_mask);
    // SA_NODEFER: SIGBUS stays unblocked in the handler, so leaving it by
    // siglongjmp needs no mask restored and sigsetjmp can skip saving it
    // (a syscall per guarded access otherwise).
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGBUS, &action, nullptr);
  });
}

}  // namespace

std::optional<SigbusFault> RunCatchingSigbus(absl::FunctionRef<void()> access) {
  InstallHandlerOnce();
  GuardFrame frame;
  frame.outer = t_frame;
  if (sigsetjmp(frame.env, /*savemask=*/0) != 0) {
    // Back from the handler: access() was abandoned at the fault.
    t_frame = frame.outer;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    return SigbusFault{frame.fault_address};
  }
  t_frame = &frame;
  // The region is marked before access() touches anything, and unmarked
  // only after it is done (compiler fences: the handler runs on this thread).
  std::atomic_signal_fence(std::memory_order_seq_cst);
  access();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_frame = frame.outer;
  return std::nullopt;
}

}  // namespace specstream
