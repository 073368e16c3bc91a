#include "tests/testing/testing.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace specstream::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/specstream-test-XXXXXX";
  char* made = mkdtemp(pattern.data());
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  if (!out) {
    ADD_FAILURE() << "cannot write " << path;
    std::abort();
  }
}

int RunCommand(const std::string& command, const std::string& stdout_path,
               const std::string& stderr_path) {
  const std::string redirects = stdout_path == stderr_path
                                    ? " >" + stdout_path + " 2>&1"
                                    : " >" + stdout_path + " 2>" + stderr_path;
  const int status = std::system((command + redirects).c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    std::abort();
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

bool FileExists(const std::string& path) { return std::filesystem::exists(path); }

bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout,
               absl::Duration poll) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(std::min(poll, deadline - absl::Now()));
  }
}

std::string DeadLoopbackAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool bound = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (fd >= 0) close(fd);
  if (!bound) ADD_FAILURE() << "cannot bind a loopback port";
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

int WaitForPortFile(const std::string& path, absl::Duration timeout) {
  int port = 0;
  WaitUntil(
      [&] {
        std::ifstream in(path);
        return static_cast<bool>(in >> port) && port > 0;
      },
      timeout, absl::Milliseconds(50));
  return port > 0 ? port : 0;
}

std::string SourceDir() { return SPECSTREAM_SOURCE_DIR; }
std::string BinaryDir() { return SPECSTREAM_BINARY_DIR; }

std::string FixturesDir() {
  const char* env = std::getenv("SPECSTREAM_FIXTURES");
  if (env != nullptr && *env != '\0') return env;
  return BinaryDir() + "/fixtures";
}

bool RunningInCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

bool HaveOpenssl() { return std::system("command -v openssl >/dev/null 2>&1") == 0; }

std::string MakeTestCertificates(const std::string& dir) {
  WriteFile(dir + "/ca.cnf",
            "[req]\n"
            "distinguished_name = dn\n"
            "prompt = no\n"
            "[dn]\n"
            "CN = specstream-test-ca\n"
            "[v3_ca]\n"
            "basicConstraints = critical,CA:TRUE\n"
            "keyUsage = critical,keyCertSign,cRLSign\n"
            "subjectKeyIdentifier = hash\n");
  WriteFile(dir + "/server.ext",
            "subjectAltName = DNS:localhost,IP:127.0.0.1\n"
            "extendedKeyUsage = serverAuth\n");
  WriteFile(dir + "/client.ext", "extendedKeyUsage = clientAuth\n");
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string script =
      "set -e; cd '" + dir + "'; " + "openssl req -x509 -config ca.cnf -extensions v3_ca " + key +
      " -keyout ca.key -out ca.pem -days 2; " + "openssl req -new -config ca.cnf " + key +
      " -subj /CN=localhost -keyout server.key -out server.csr; " +
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 2"
      " -extfile server.ext -out server.pem; " +
      "openssl req -new -config ca.cnf " + key +
      " -subj /CN=specstream-test-client -keyout client.key -out client.csr; " +
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -set_serial 3 -days 2"
      " -extfile client.ext -out client.pem";
  const std::string log = dir + "/openssl.log";
  const std::string command = "(" + script + ") >'" + log + "' 2>&1";
  if (std::system(command.c_str()) == 0) return "";
  std::string output = ReadFile(log);
  return output.empty() ? "openssl failed" : output;
}

}  // namespace specstream::testing
