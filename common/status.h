// Status helpers used across module boundaries (absl::Status / StatusOr).
//
// Every module returns absl::Status or absl::StatusOr<T>; exceptions from
// third-party code (LibTorch's c10::Error, nlohmann::json) are caught at the
// shim that calls them and converted once. These macros keep call sites flat.
#ifndef SPECSTREAM_COMMON_STATUS_H_
#define SPECSTREAM_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define SPECSTREAM_STATUS_CONCAT_INNER_(a, b) a##b
#define SPECSTREAM_STATUS_CONCAT_(a, b) SPECSTREAM_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                                \
  do {                                                       \
    ::absl::Status specstream_status_ = (expr);              \
    if (!specstream_status_.ok()) return specstream_status_; \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns x from a StatusOr, or
// returns its status from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, expr)                                                            \
  SPECSTREAM_ASSIGN_OR_RETURN_IMPL_(SPECSTREAM_STATUS_CONCAT_(specstream_statusor_, __LINE__), \
                                    lhs, expr)
#define SPECSTREAM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                      \
  if (!statusor.ok()) return std::move(statusor).status();     \
  lhs = std::move(statusor).value()

namespace specstream {

// Prefixes `status`'s message with `context` ("context: message"), keeping
// the code. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_STATUS_H_
