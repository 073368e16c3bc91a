#include "common/exit_code.h"

#include <iostream>

#include "common/terminal_text.h"

namespace specstream {

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return 2;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return 3;
    case absl::StatusCode::kNotFound:
      return 4;
    case absl::StatusCode::kDeadlineExceeded:
      return 124;
    default:
      return 1;
  }
}

int ReportExit(absl::string_view program, const absl::Status& status) {
  // Messages quote what users and peers sent (ids, names, spec values).
  if (!status.ok()) {
    std::cerr << program << ": " << EscapeForTerminalKeepLines(status.message()) << "\n";
  }
  return ExitCodeFor(status);
}

}  // namespace specstream
