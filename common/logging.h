// One logging wrapper over spdlog. Every line carries the process role
// ("teacher", "student", "coordinator", "cli") and, once known, its rank:
//   [2026-11-29 09:40:01.123] [student:3] [info] step 10 loss=...
//
// Thread-safe: InitLogging/SetLogRank may be called at any time; the logger is
// shared by all threads. Lifecycle events log at info, per-request at debug,
// nothing inside tensor loops.
#ifndef SPECSTREAM_COMMON_LOGGING_H_
#define SPECSTREAM_COMMON_LOGGING_H_

#include <memory>
#include <string>

#include "spdlog/spdlog.h"

namespace specstream {

struct LoggingOptions {
  std::string role = "specstream";
  int rank = -1;               // -1: no rank in the stamp.
  std::string level = "info";  // trace|debug|info|warn|error|off
  bool to_stderr = true;       // CLI tools keep stdout for data.
};

// Installs the process-wide logger. Returns false on an unknown level (the
// logger is then installed at info).
bool InitLogging(const LoggingOptions& options);

// Updates the rank in the stamp (e.g. after rendezvous).
void SetLogRank(int rank);

// The process-wide logger; InitLogging need not have been called.
std::shared_ptr<spdlog::logger> Logger();

}  // namespace specstream

#define SS_LOG_DEBUG(...) ::specstream::Logger()->debug(__VA_ARGS__)
#define SS_LOG_INFO(...) ::specstream::Logger()->info(__VA_ARGS__)
#define SS_LOG_WARN(...) ::specstream::Logger()->warn(__VA_ARGS__)
#define SS_LOG_ERROR(...) ::specstream::Logger()->error(__VA_ARGS__)

#endif  // SPECSTREAM_COMMON_LOGGING_H_
