// Survives touching memory that another process can shrink: a MAP_SHARED
// mapping of a file or POSIX shared-memory object whose size someone else
// controls (a student's shm ring, common/transport/shm_ring.h). A load or
// store to a page past the object's current end raises SIGBUS, which by
// default kills the whole process; inside RunCatchingSigbus it ends only the
// access, and the caller turns the fault into a Status.
//
// How: the first call installs one process-wide SIGBUS handler (and keeps
// the disposition it replaces). A call marks its extent with a sigjmp_buf in
// a thread-local slot; a SIGBUS raised by a memory fault on a thread inside
// such a region siglongjmps back to the call, which returns the faulting
// address. Every other SIGBUS (a fault outside any region, on another
// thread, or one sent with kill/raise) goes to the replaced disposition, so
// it still crashes (or is handled) as it would have without this file. A
// handler installed later than ours replaces it; guarded regions then no
// longer catch anything (nothing in this project does that).
//
// Contract for `access`:
//   * it may stop at any instruction that touches the guarded memory, with
//     no unwinding: it must hold no lock, allocate nothing, and own no
//     object with a destructor (copies, atomic loads and stores, futex
//     syscalls are fine; a syscall on bad memory returns EFAULT instead);
//   * it runs on the calling thread, and only that thread's faults are
//     caught;
//   * it may call RunCatchingSigbus again: the innermost region catches;
//   * the signal mask is left as it was (the handler is installed with
//     SA_NODEFER, so no signal mask has to be restored on the way out).
// Thread-safe; the guard costs a sigsetjmp (no syscall) per call.
#ifndef SPECSTREAM_COMMON_SIGBUS_GUARD_H_
#define SPECSTREAM_COMMON_SIGBUS_GUARD_H_

#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"

namespace specstream {

// What cut a guarded access short.
struct SigbusFault {
  uintptr_t address = 0;  // the byte whose page is gone (siginfo si_addr)
};

// Runs access() and returns std::nullopt when it ran to its end, or the
// fault when a SIGBUS interrupted it (access() abandoned at that point).
std::optional<SigbusFault> RunCatchingSigbus(absl::FunctionRef<void()> access);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_SIGBUS_GUARD_H_
