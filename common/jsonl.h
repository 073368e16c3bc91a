// JSON lines: one JSON value per line. Reading skips blank lines, and its
// errors name the file, the 1-based line number and the reason, so a user can
// fix the line:  "data.jsonl:17: line is not valid JSON: ...". Writing
// appends a line and flushes it, so a reader (or a crash) sees whole lines.
#ifndef SPECSTREAM_COMMON_JSONL_H_
#define SPECSTREAM_COMMON_JSONL_H_

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace specstream {

// Calls `fn(line_number, value)` for every non-blank line of `path` in order.
// Stops at the first parse error or the first non-OK status from `fn`, and
// returns it prefixed with "path:line: ". The code of `fn`'s status is kept;
// parse errors are InvalidArgument.
absl::Status ForEachJsonLine(
    const std::string& path,
    const std::function<absl::Status(int64_t line_number, const nlohmann::json& value)>& fn);

// Reads `value[field]` as an array of integers in [min, max]; errors name the
// field and the offending element.
absl::Status ReadIntArray(const nlohmann::json& value, const char* field, int64_t min, int64_t max,
                          std::vector<int64_t>* out);

// Appends JSON lines to a file (created when missing).
// Thread-safety: one writer per file, used from one thread at a time.
class JsonlWriter final {
 public:
  // PermissionDenied naming `path` when it cannot be opened for appending.
  static absl::StatusOr<std::unique_ptr<JsonlWriter>> Open(const std::string& path);
  // Writes `value` as one line and flushes; DataLoss naming the file when
  // the write fails.
  absl::Status Append(const nlohmann::json& value);
  const std::string& path() const { return path_; }

 private:
  explicit JsonlWriter(std::string path) : path_(std::move(path)) {}
  std::string path_;
  std::ofstream out_;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_JSONL_H_
