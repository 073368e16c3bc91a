// The one mapping from a Status to a process exit code, for every SpecStream
// binary (the CLI, the daemons, the coordinator). The contract users script
// against (README "The specstream CLI", docs/operations.md):
//   0   OK
//   2   bad input or usage: INVALID_ARGUMENT, FAILED_PRECONDITION,
//       OUT_OF_RANGE, ALREADY_EXISTS (a taken job --id)
//   3   a peer unreachable or credentials refused: UNAVAILABLE,
//       UNAUTHENTICATED, PERMISSION_DENIED
//   4   NOT_FOUND
//   124 DEADLINE_EXCEEDED (a --timeout or a rendezvous deadline)
//   1   anything else
#ifndef SPECSTREAM_COMMON_EXIT_CODE_H_
#define SPECSTREAM_COMMON_EXIT_CODE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace specstream {

int ExitCodeFor(const absl::Status& status);

// How a binary ends on `status`: unless OK, "<program>: <message>" on
// stderr, its control characters escaped (common/terminal_text.h) except
// newlines and tabs; returns ExitCodeFor(status).
int ReportExit(absl::string_view program, const absl::Status& status);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_EXIT_CODE_H_
