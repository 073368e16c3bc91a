// Helpers for tests only: temporary directories and fixture locations.
#ifndef SPECSTREAM_TESTS_TESTING_TESTING_H_
#define SPECSTREAM_TESTS_TESTING_TESTING_H_

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace specstream::testing {

// A fresh directory under $TEST_TMPDIR (or /tmp) removed on destruction.
class TempDir final {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs `command` through the shell with its stdout written to `stdout_path`
// and its stderr to `stderr_path` (the same path keeps both in one file);
// returns its exit status, or -1 when it did not exit normally.
int RunCommand(const std::string& command, const std::string& stdout_path,
               const std::string& stderr_path);

// Writes `contents` to `path`, replacing it; aborts the test on failure.
void WriteFile(const std::string& path, const std::string& contents);
// Reads the whole file; aborts the test on failure.
std::string ReadFile(const std::string& path);
bool FileExists(const std::string& path);

// Polls `condition` every `poll` until it holds (true) or `timeout` passes
// (false). For states that give no signal to block on: a port file another
// process writes, a log line, a child's exit. A wait with a signal (a
// condition variable, a future, an Await* of a fake) should use the signal.
bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout,
               absl::Duration poll = absl::Milliseconds(20));

// The port a daemon wrote to `path` (--port-file), once the file holds one;
// 0 when none appears within `timeout`.
int WaitForPortFile(const std::string& path, absl::Duration timeout = absl::Seconds(60));

// "127.0.0.1:<port>" where nothing listens: a port bound, then closed (a
// client's connect is refused at once).
std::string DeadLoopbackAddress();

// The repository root and the build directory.
std::string SourceDir();
std::string BinaryDir();

// Directory of fixtures fetched by tests/testing/fetch_fixtures.sh
// ($SPECSTREAM_FIXTURES, default <build>/fixtures).
std::string FixturesDir();

// True under CI=true: a missing fixture fails instead of skipping.
bool RunningInCi();

// Whether the openssl CLI is on PATH (TLS tests skip without it).
bool HaveOpenssl();
// Writes a test PKI into `dir` with the openssl CLI: ca.pem/ca.key, a server
// certificate for localhost and 127.0.0.1 (server.pem/server.key) and a
// client certificate (client.pem/client.key), all signed by the CA, EC P-256,
// valid 2 days. Returns "" on success, else openssl's output.
std::string MakeTestCertificates(const std::string& dir);

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_TESTING_H_
