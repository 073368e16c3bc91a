// This machine and this process, as other components need to name them:
// the hostname, the kernel's boot id and the running executable. The one
// place these are read. LibTorch-free; thread-safe.
#ifndef SPECSTREAM_COMMON_HOST_H_
#define SPECSTREAM_COMMON_HOST_H_

#include <string>

#include "absl/status/statusor.h"

namespace specstream {

// This machine's identity for same-host checks (two processes can share a
// shared-memory ring only when both agree): the hostname and the kernel's
// boot id (/proc/sys/kernel/random/boot_id). Empty when unavailable.
std::string LocalHostname();
std::string LocalBootId();

// The absolute path of the running executable (/proc/self/exe), which the
// daemons re-execute for their children (TP workers, ranks, re-exec for the
// OpenMP policy). FailedPrecondition when it cannot be resolved.
absl::StatusOr<std::string> SelfExecutable();

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_HOST_H_
