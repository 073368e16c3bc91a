// JSON-lines input: one JSON value per line, blank lines skipped. Errors name
// the file, the 1-based line number and the reason, so a user can fix the
// line:  "data.jsonl:17: line is not valid JSON: ...".
#ifndef SPECSTREAM_COMMON_JSONL_H_
#define SPECSTREAM_COMMON_JSONL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_JSONL_H_
