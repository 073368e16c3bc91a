// `specstream submit|status|list|logs|stop|wait`: the remote job commands,
// clients of the coordinator's JobService (LibTorch-free).
//
// Every command dials `RemoteOptions::address` (else $SPECSTREAM_ADDRESS),
// sends `authorization: Bearer <token>` when a token is configured (the
// --token-file, else $SPECSTREAM_TOKEN) and uses TLS when `tls_ca` is set.
// Data (job ids, tables, JSON, log lines) goes to `out`; progress, state
// changes and reconnect notices go to `err`. Table and text output escapes
// the control characters of what users and jobs chose (ids, names, reasons,
// daemon names; common/terminal_text.h); JSON is escaped by its printer.
// Log lines are the ranks' own output and print as they are.
//
// Each Run* returns OK or a status whose code ExitCodeFor()
// (common/exit_code.h) maps to the CLI's exit-code contract:
//   0   success (for the waiting commands: the job SUCCEEDED)
//   1   the job FAILED or was STOPPED (waiting commands; kAborted)
//   2   usage: bad flags, a missing file, a spec the coordinator refused
//   3   the coordinator is unreachable, or refused our credentials
//   4   unknown job id
//   124 a --timeout elapsed
//
// Not thread-safe: one command per process, called from main.
#ifndef SPECSTREAM_SERVICES_CLI_JOB_COMMANDS_H_
#define SPECSTREAM_SERVICES_CLI_JOB_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "specstream/v1/coordinator.pb.h"

namespace specstream::services {

inline constexpr char kAddressEnvVar[] = "SPECSTREAM_ADDRESS";

// Connection and output settings every job command takes.
struct RemoteOptions {
  std::string address;     // host:port; empty: $SPECSTREAM_ADDRESS (else usage error)
  std::string token_file;  // empty: $SPECSTREAM_TOKEN, else no token
  std::string tls_ca;      // PEM roots; set: TLS, else plaintext
  // Seconds; 0: unset. Bounds each RPC (default 30 s when unset) and, for
  // the waiting commands, the whole wait (exit 124 when it elapses).
  double timeout_seconds = 0;
  std::string output = "table";  // "table" | "json" (protobuf JSON, proto field names)
};

struct SubmitOptions {
  std::string spec_path;  // the job YAML, sent verbatim as spec_yaml
  std::string id;         // optional job id
  bool wait = false;      // then wait for a terminal state
  bool follow = false;    // then stream logs and progress until terminal
};
// Prints the job id (table) or the Job (json). With wait/follow, then the
// final state (table: "ID STATE[: reason]"; json: the final Job).
absl::Status RunSubmit(const RemoteOptions& remote, const SubmitOptions& options, std::ostream& out,
                       std::ostream& err);

// A key/value table of the job, or the Job as JSON.
absl::Status RunStatus(const RemoteOptions& remote, const std::string& id, std::ostream& out);

// Columns ID NAME STATE STEP AGE REASON, newest first; or the
// ListJobsResponse as JSON (every page in one, without specs). Follows the
// coordinator's pages until `limit` jobs (0: all) or the last page.
absl::Status RunList(const RemoteOptions& remote, int32_t limit, std::ostream& out);

// The job's log lines as "[rank N] text" (json: one JobEvent per line).
// With `follow`, until the job reaches a terminal state (surviving
// coordinator restarts). Succeeds whatever the job's final state.
absl::Status RunLogs(const RemoteOptions& remote, const std::string& id, bool follow,
                     std::ostream& out, std::ostream& err);

// Stops the job; prints "ID STATE" (table) or the Job (json).
absl::Status RunStop(const RemoteOptions& remote, const std::string& id, const std::string& reason,
                     std::ostream& out);

// Waits for a terminal state; prints "ID STATE[: reason]" or the final Job.
absl::Status RunWait(const RemoteOptions& remote, const std::string& id, std::ostream& out,
                     std::ostream& err);

// Checks a job spec locally, as the coordinator will at submit (no
// coordinator needed): "<path>: valid (name, N ranks)" or, with json, the
// spec with its defaults filled. InvalidArgument naming the field otherwise.
absl::Status RunValidate(const std::string& spec_path, const std::string& output,
                         std::ostream& out);

// Formatting helpers, exposed for tests.
// "5s", "3m", "2h", "4d" for an age in milliseconds.
std::string FormatAge(int64_t age_ms);
// Local time "2026-11-29 09:40:01", or "-" for 0.
std::string FormatUnixMs(int64_t unix_ms);
// The key/value table RunStatus prints.
std::string FormatJobTable(const v1::Job& job);
// The columns RunList prints (rows in the given order).
std::string FormatJobList(const v1::ListJobsResponse& jobs, int64_t now_unix_ms);

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_CLI_JOB_COMMANDS_H_
