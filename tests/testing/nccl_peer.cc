#include "tests/testing/nccl_peer.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/time/clock.h"

extern char** environ;

namespace specstream::testing {

std::vector<std::pair<std::string, std::string>> NcclPeerEnv(int device_count,
                                                             absl::string_view tag) {
  std::vector<std::pair<std::string, std::string>> env;
  const char* ifname = std::getenv("NCCL_SOCKET_IFNAME");
  env.emplace_back("NCCL_SOCKET_IFNAME", ifname != nullptr ? ifname : "lo");
  if (device_count < 2) env.emplace_back("NCCL_HOSTID", std::string(tag));
  return env;
}

void ApplyEnv(const std::vector<std::pair<std::string, std::string>>& env) {
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
}

int NcclPeerDevice(int device_count, int rank) { return device_count >= 2 ? rank : 0; }

std::string HexEncode(absl::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return hex;
}

std::string HexDecode(absl::string_view hex) {
  auto digit = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string bytes(hex.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(digit(hex[2 * i]) * 16 + digit(hex[2 * i + 1]));
  }
  return bytes;
}

pid_t SpawnSelf(const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    bool replaced = false;
    for (const auto& [name, value] : env) {
      if (entry.substr(0, name.size() + 1) == name + "=") replaced = true;
    }
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {"/proc/self/exe"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
    return -1;
  }
  return pid;
}

int WaitChild(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (done < 0 || absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

namespace {
inline char PatternByte(uint64_t seed, uint64_t k) {
  uint64_t x = (k + 1) * 0x9E3779B97F4A7C15ull ^ (seed + 1) * 0xC2B2AE3D27D4EB4Full;
  return static_cast<char>(x >> 29);
}
}  // namespace

void FillPattern(uint64_t seed, uint64_t offset, uint64_t n, char* dest) {
  for (uint64_t i = 0; i < n; ++i) dest[i] = PatternByte(seed, offset + i);
}

int64_t FirstMismatch(uint64_t seed, const char* data, uint64_t n) {
  for (uint64_t k = 0; k < n; ++k) {
    if (data[k] != PatternByte(seed, k)) return static_cast<int64_t>(k);
  }
  return -1;
}

}  // namespace specstream::testing
