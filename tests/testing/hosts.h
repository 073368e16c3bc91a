// Separate hosts on one machine for multi-host tests: network namespaces on
// a private bridge, each with its own address and hostname.
//
//   auto hosts = testing::TestHosts::Create(3);    // needs root
//   if (!hosts.ok()) GTEST_SKIP() << hosts.status();  // (or fail under CI)
//   pid_t pid = (*hosts)->Spawn(1, {binary, "serve", ...}, {"RANK=1"}, log);
//   int code = (*hosts)->Wait(pid);
//   (*hosts)->SetLink(2, false);                   // cut host 2 off
//   (*hosts)->SetLoss(0, 1);                       // drop 1 % of host 0's packets
//   (*hosts)->SetDelay(0, absl::Milliseconds(20)); // hold what host 0 receives
//
// Layout: a "switch" namespace holds the bridge; host i is a namespace whose
// eth0 (address 198.18.0.(i+1)/24, from the benchmarking range RFC 2544
// reserves, which exists only inside these namespaces) is one end of a veth
// pair whose other end is port v<i> of the bridge. Nothing is added to the
// machine's own namespace. Each spawned process also gets its own UTS
// namespace (hostname host<i>, so same-host checks see different hosts) and
// mount namespace (/etc/hosts maps every host's name, and the names given to
// AddName, to their addresses).
//
// Teardown: the destructor SIGKILLs every process it spawned and deletes the
// namespaces. Processes die with the test (PR_SET_PDEATHSIG), and a later
// Create deletes namespaces left by a test process that no longer exists, so
// a killed test leaves nothing running and nothing behind for long.
//
// Thread-safety: use from the test's main thread (the spawned processes'
// death signal is tied to the thread that spawns them).
#ifndef SPECSTREAM_TESTS_TESTING_HOSTS_H_
#define SPECSTREAM_TESTS_TESTING_HOSTS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace specstream::testing {

class TestHosts final {
 public:
  // FailedPrecondition (with the reason) where namespaces cannot be made:
  // not root, or no `ip`.
  static absl::StatusOr<std::unique_ptr<TestHosts>> Create(int count);
  ~TestHosts();
  TestHosts(const TestHosts&) = delete;
  TestHosts& operator=(const TestHosts&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& address(int host) const { return hosts_[host].address; }
  const std::string& hostname(int host) const { return hosts_[host].hostname; }

  // Makes `name` resolve to host `host`'s address in processes spawned
  // afterwards (a Kubernetes Service name, say).
  void AddName(const std::string& name, int host);

  // What a spawned process sees besides its host's network.
  struct Mount {
    std::string source;  // a directory of the test
    std::string target;  // where the process sees it (made, and removed at
                         // teardown, when the machine lacks it)
    bool read_only = false;
  };
  struct SpawnOptions {
    std::string hostname;  // default host<i>
    std::vector<Mount> mounts;
  };

  // Starts `argv` on host `host` with the machine's environment plus `env`
  // ("NAME=value", overriding), stdout and stderr appended to `log`.
  // Returns the pid (a child of this process), or -1 with a test failure.
  pid_t Spawn(int host, const std::vector<std::string>& argv, const std::vector<std::string>& env,
              const std::string& log, const SpawnOptions& options);
  pid_t Spawn(int host, const std::vector<std::string>& argv, const std::vector<std::string>& env,
              const std::string& log) {
    return Spawn(host, argv, env, log, SpawnOptions{});
  }
  // Waits for a spawned process: its exit code, or 128 + the signal.
  int Wait(pid_t pid);
  // The exit code if it has exited (reaped), else -1.
  int Poll(pid_t pid);
  void Kill(pid_t pid, int signal_number);
  // Spawn + Wait.
  int Run(int host, const std::vector<std::string>& argv, const std::vector<std::string>& env,
          const std::string& log);

  // Faults. The link of host `host` (its bridge port) up or down: down cuts
  // it off from every other host.
  absl::Status SetLink(int host, bool up);
  // Drops `percent` of the frames to and from host `host` at random (an
  // nftables rule on its bridge port; 0 removes it). tc netem would do it,
  // but this machine's kernel is built without it (CONFIG_NET_SCH_NETEM).
  absl::Status SetLoss(int host, int percent);
  // Holds every packet host `host` receives for `delay` before its
  // sockets see it (zero removes it), so every round trip between it and
  // another host takes `delay` longer, as netem's "delay" on the path would:
  // an iptables NFQUEUE rule in the host's namespace hands each arriving
  // packet to a thread of this process, which releases it `delay` after it
  // arrived, in order.
  // Packets beyond the queue's 64k entries pass undelayed (fail-open)
  // rather than drop.
  absl::Status SetDelay(int host, absl::Duration delay);

 private:
  class PacketDelayer;
  struct Host {
    Host();
    ~Host();
    Host(Host&&) noexcept;
    std::string netns;
    std::string address;
    std::string hostname;
    int loss_percent = 0;
    std::unique_ptr<PacketDelayer> delayer;  // while SetDelay holds packets
  };
  TestHosts() = default;
  absl::Status Build(int count);
  void WriteHostsFile();

  std::string prefix_;  // namespace names: <prefix>s (switch), <prefix>h<i>
  std::string switch_ns_;
  std::string hosts_file_;  // bind-mounted on /etc/hosts in spawned processes
  std::vector<Host> hosts_;
  std::vector<std::pair<std::string, int>> names_;
  std::vector<pid_t> children_;
  std::vector<std::string> made_paths_;  // mount targets this made, deepest last
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_HOSTS_H_
