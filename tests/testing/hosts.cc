#include "tests/testing/hosts.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

extern "C" {
#include <libnetfilter_queue/libnetfilter_queue.h>
}

extern char** environ;

namespace specstream::testing {
namespace {

constexpr char kNetnsDir[] = "/var/run/netns";
constexpr char kNamePrefix[] = "sst";  // SpecStream test; then the owning pid

// Runs a shell command; its output on failure.
absl::Status Sh(const std::string& command) {
  const std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("popen: ", std::strerror(errno)));
  std::string output;
  char buffer[512];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::FailedPreconditionError(absl::StrCat("`", command, "` failed: ", output));
  }
  return absl::OkStatus();
}

// Whether `name` (a namespace or a /tmp file of the harness) belongs to a
// test process that no longer exists.
bool OwnerIsGone(const std::string& name) {
  if (!absl::StartsWith(name, kNamePrefix)) return false;
  const size_t digits_end = name.find_first_not_of("0123456789", std::strlen(kNamePrefix));
  int pid = 0;
  if (!absl::SimpleAtoi(
          name.substr(std::strlen(kNamePrefix), digits_end - std::strlen(kNamePrefix)), &pid)) {
    return false;
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

std::vector<std::string> Entries(const char* path) {
  std::vector<std::string> names;
  if (DIR* dir = opendir(path)) {
    while (dirent* entry = readdir(dir)) names.push_back(entry->d_name);
    closedir(dir);
  }
  return names;
}

// What a test process killed before its teardown left: its namespaces, its
// /tmp files, and the (empty) mount targets it made, listed in <prefix>.made.
void SweepStale() {
  for (const std::string& name : Entries(kNetnsDir)) {
    if (OwnerIsGone(name)) (void)Sh("ip netns del " + name);
  }
  for (const std::string& name : Entries("/tmp")) {
    if (!OwnerIsGone(name)) continue;
    const std::string path = "/tmp/" + name;
    if (absl::EndsWith(name, ".made")) {
      std::ifstream in(path);
      std::vector<std::string> made;
      for (std::string line; std::getline(in, line);) made.push_back(line);
      for (auto it = made.rbegin(); it != made.rend(); ++it) rmdir(it->c_str());
    }
    std::remove(path.c_str());
  }
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

// One NFQUEUE queue, read by a thread that entered the host's network
// namespace (setns is per thread): each packet's verdict (ACCEPT) is given
// `delay` after it arrived, in arrival order.
class TestHosts::PacketDelayer final {
 public:
  static absl::StatusOr<std::unique_ptr<PacketDelayer>> Start(const std::string& netns_path,
                                                              int queue, absl::Duration delay) {
    std::unique_ptr<PacketDelayer> d(new PacketDelayer());
    d->delay_ = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(delay));
    std::promise<absl::Status> ready;
    std::future<absl::Status> started = ready.get_future();
    d->thread_ = std::thread(
        [raw = d.get(), netns_path, queue, &ready] { raw->Run(netns_path, queue, ready); });
    absl::Status status = started.get();
    if (!status.ok()) return status;  // the thread has returned; ~PacketDelayer joins it
    return d;
  }
  ~PacketDelayer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    uint32_t id;
    Clock::time_point release;
  };
  PacketDelayer() = default;

  static int OnPacket(nfq_q_handle* /*queue*/, nfgenmsg* /*message*/, nfq_data* data, void* self) {
    auto* d = static_cast<PacketDelayer*>(self);
    const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
    if (header != nullptr) d->held_.push_back({ntohl(header->packet_id), Clock::now() + d->delay_});
    return 0;
  }

  void Run(const std::string& netns_path, int queue, std::promise<absl::Status>& ready) {
    const int netns = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (netns < 0 || setns(netns, CLONE_NEWNET) != 0) {
      ready.set_value(
          absl::InternalError(absl::StrCat("setns ", netns_path, ": ", std::strerror(errno))));
      if (netns >= 0) close(netns);
      return;
    }
    close(netns);
    nfq_handle* handle = nfq_open();
    nfq_q_handle* q =
        handle != nullptr ? nfq_create_queue(handle, queue, &OnPacket, this) : nullptr;
    if (q == nullptr || nfq_set_mode(q, NFQNL_COPY_META, 0) < 0) {
      ready.set_value(absl::FailedPreconditionError(
          absl::StrCat("NFQUEUE ", queue, " in ", netns_path, ": ", std::strerror(errno))));
      if (q != nullptr) nfq_destroy_queue(q);
      if (handle != nullptr) nfq_close(handle);
      return;
    }
    nfq_set_queue_maxlen(q, 65536);
    const uint32_t flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO;
    nfq_set_queue_flags(q, flags, flags);
    nfnl_rcvbufsiz(nfq_nfnlh(handle), 16u << 20);
    const int fd = nfq_fd(handle);
    ready.set_value(absl::OkStatus());
    std::vector<char> buffer(1 << 16);
    while (!stop_) {
      int timeout_ms = 20;
      if (!held_.empty()) {
        const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
            held_.front().release - Clock::now());
        timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 20));
      }
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) > 0 && (p.revents & POLLIN) != 0) {
        // Drain what is there (ENOBUFS on overflow: packets were lost to
        // the socket, not to the queue, and pass on fail-open).
        for (;;) {
          const ssize_t n = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
          if (n <= 0) break;
          nfq_handle_packet(handle, buffer.data(), static_cast<int>(n));
        }
      }
      const auto now = Clock::now();
      while (!held_.empty() && held_.front().release <= now) {
        nfq_set_verdict(q, held_.front().id, NF_ACCEPT, 0, nullptr);
        held_.pop_front();
      }
    }
    for (const Held& h : held_) nfq_set_verdict(q, h.id, NF_ACCEPT, 0, nullptr);
    nfq_destroy_queue(q);
    nfq_close(handle);
  }

  std::chrono::nanoseconds delay_{0};
  std::deque<Held> held_;  // touched only by the thread
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TestHosts::Host::Host() = default;
TestHosts::Host::~Host() = default;
TestHosts::Host::Host(Host&&) noexcept = default;

absl::StatusOr<std::unique_ptr<TestHosts>> TestHosts::Create(int count) {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "multi-host tests need root to make network namespaces (CI runs as root)");
  }
  if (Sh("ip -V").code() != absl::StatusCode::kOk) {
    return absl::FailedPreconditionError("multi-host tests need iproute2's `ip`");
  }
  if (count < 1 || count > 250) return absl::InvalidArgumentError("1..250 hosts");
  SweepStale();
  std::unique_ptr<TestHosts> hosts(new TestHosts());
  absl::Status status = hosts->Build(count);
  if (!status.ok()) return status;  // the destructor removes what was made
  return hosts;
}

absl::Status TestHosts::Build(int count) {
  static int instance = 0;
  prefix_ = absl::StrCat(kNamePrefix, getpid(), "x", instance++);
  switch_ns_ = prefix_ + "s";
  if (absl::Status s = Sh("ip netns add " + switch_ns_); !s.ok()) {
    switch_ns_.clear();
    return s;
  }
  const std::string sw = "ip -n " + switch_ns_ + " ";
  for (const std::string& command :
       {sw + "link set lo up", sw + "link add br0 type bridge", sw + "link set br0 up"}) {
    if (absl::Status s = Sh(command); !s.ok()) return s;
  }
  for (int i = 0; i < count; ++i) {
    Host made;
    made.netns = absl::StrCat(prefix_, "h", i);
    made.address = absl::StrCat("198.18.0.", i + 1);
    made.hostname = absl::StrCat("host", i);
    if (absl::Status s = Sh("ip netns add " + made.netns); !s.ok()) return s;
    hosts_.push_back(std::move(made));
    const Host& host = hosts_.back();
    const std::string h = "ip -n " + host.netns + " ";
    const std::string port = absl::StrCat("v", i);
    for (const std::string& command : {
             absl::StrCat(sw, "link add ", port, " type veth peer name eth0 netns ", host.netns),
             absl::StrCat(sw, "link set ", port, " master br0 up"),
             absl::StrCat(h, "addr add ", host.address, "/24 dev eth0"),
             h + "link set eth0 up",
             h + "link set lo up",
         }) {
      if (absl::Status s = Sh(command); !s.ok()) return s;
    }
  }
  hosts_file_ = absl::StrCat("/tmp/", prefix_, ".hosts");
  WriteHostsFile();
  return absl::OkStatus();
}

TestHosts::~TestHosts() {
  for (pid_t pid : children_) {
    if (pid > 0) kill(pid, SIGKILL);
  }
  for (pid_t pid : children_) {
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
  for (Host& host : hosts_) {
    host.delayer.reset();
    (void)Sh("ip netns del " + host.netns);
  }
  if (!switch_ns_.empty()) (void)Sh("ip netns del " + switch_ns_);
  if (!hosts_file_.empty()) std::remove(hosts_file_.c_str());
  // Deepest first; rmdir leaves anything someone else put there.
  for (auto it = made_paths_.rbegin(); it != made_paths_.rend(); ++it) rmdir(it->c_str());
  std::remove(absl::StrCat("/tmp/", prefix_, ".made").c_str());
}

void TestHosts::WriteHostsFile() {
  std::string text = "127.0.0.1 localhost\n::1 localhost\n";
  for (const Host& host : hosts_) absl::StrAppend(&text, host.address, " ", host.hostname, "\n");
  for (const auto& [name, host] : names_) {
    absl::StrAppend(&text, hosts_[host].address, " ", name, "\n");
  }
  std::ofstream(hosts_file_, std::ios::trunc) << text;
}

void TestHosts::AddName(const std::string& name, int host) {
  names_.emplace_back(name, host);
  WriteHostsFile();
}

pid_t TestHosts::Spawn(int host, const std::vector<std::string>& argv,
                       const std::vector<std::string>& env, const std::string& log,
                       const SpawnOptions& options) {
  if (host < 0 || host >= size() || argv.empty()) {
    ADD_FAILURE() << "Spawn: no host " << host << " or empty argv";
    return -1;
  }
  // Everything the child needs is prepared before fork (only system calls
  // happen after it).
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool overridden = std::any_of(env.begin(), env.end(), [&](const std::string& o) {
      return o.substr(0, o.find('=')) == name;
    });
    if (!overridden) environment.push_back(entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp, args;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  const std::string netns_path = absl::StrCat(kNetnsDir, "/", hosts_[host].netns);
  const std::string& hostname = options.hostname.empty() ? hosts_[host].hostname : options.hostname;
  // Mount targets must exist; the ones made here go again at teardown.
  for (const Mount& m : options.mounts) {
    std::filesystem::path missing = m.target;
    std::vector<std::string> made;
    while (!missing.empty() && missing != missing.root_path() &&
           !std::filesystem::exists(missing)) {
      made.push_back(missing.string());
      missing = missing.parent_path();
    }
    std::error_code error;
    std::filesystem::create_directories(m.target, error);
    if (error) {
      ADD_FAILURE() << "Spawn: cannot make mount target " << m.target << ": " << error.message();
      return -1;
    }
    made_paths_.insert(made_paths_.end(), made.rbegin(), made.rend());
    if (!made.empty()) {
      std::ofstream list(absl::StrCat("/tmp/", prefix_, ".made"), std::ios::trunc);
      for (const std::string& path : made_paths_) list << path << "\n";
    }
  }
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int null_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (out < 0 || null_in < 0 || dup2(null_in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) {
      _exit(125);
    }
    const int netns = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    auto fail = [](const char* what) {
      const char* reason = std::strerror(errno);
      (void)!write(2, what, std::strlen(what));
      (void)!write(2, ": ", 2);
      (void)!write(2, reason, std::strlen(reason));
      (void)!write(2, "\n", 1);
      _exit(124);
    };
    if (netns < 0 || setns(netns, CLONE_NEWNET) != 0) fail("hosts: entering the host's netns");
    if (unshare(CLONE_NEWUTS | CLONE_NEWNS) != 0) fail("hosts: unshare uts+mount");
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail("hosts: mount /");
    if (mount(hosts_file_.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
      fail("hosts: bind /etc/hosts");
    }
    for (const Mount& m : options.mounts) {
      if (mount(m.source.c_str(), m.target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
        fail("hosts: bind mount");
      }
      if (m.read_only && mount(nullptr, m.target.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY,
                               nullptr) != 0) {
        fail("hosts: read-only remount");
      }
    }
    if (sethostname(hostname.data(), hostname.size()) != 0) fail("hosts: sethostname");
    execve(args[0], args.data(), envp.data());
    fail("hosts: execve");
  }
  children_.push_back(pid);
  return pid;
}

int TestHosts::Wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  std::replace(children_.begin(), children_.end(), pid, pid_t{0});
  return ExitCode(status);
}

int TestHosts::Poll(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) != pid) return -1;
  std::replace(children_.begin(), children_.end(), pid, pid_t{0});
  return ExitCode(status);
}

void TestHosts::Kill(pid_t pid, int signal_number) {
  if (pid > 0) kill(pid, signal_number);
}

int TestHosts::Run(int host, const std::vector<std::string>& argv,
                   const std::vector<std::string>& env, const std::string& log) {
  const pid_t pid = Spawn(host, argv, env, log);
  return pid > 0 ? Wait(pid) : -1;
}

absl::Status TestHosts::SetLink(int host, bool up) {
  return Sh(absl::StrCat("ip -n ", switch_ns_, " link set v", host, up ? " up" : " down"));
}

absl::Status TestHosts::SetLoss(int host, int percent) {
  if (host < 0 || host >= size() || percent < 0 || percent > 100) {
    return absl::InvalidArgumentError(absl::StrCat("SetLoss: host ", host, ", ", percent, " %"));
  }
  hosts_[host].loss_percent = percent;
  // The whole rule set of the switch namespace (ours alone), rewritten.
  std::string rules =
      "flush ruleset\ntable bridge faults {\n  chain forward {\n"
      "    type filter hook forward priority 0; policy accept;\n";
  for (int h = 0; h < size(); ++h) {
    if (hosts_[h].loss_percent == 0) continue;
    for (const char* direction : {"iifname", "oifname"}) {
      absl::StrAppend(&rules, "    ", direction, " \"v", h, "\" ");
      // numgen's values are 0..99, so "< 100" is out of its range.
      if (hosts_[h].loss_percent < 100) {
        absl::StrAppend(&rules, "numgen random mod 100 < ", hosts_[h].loss_percent, " ");
      }
      absl::StrAppend(&rules, "drop\n");
    }
  }
  rules += "  }\n}\n";
  const std::string file = absl::StrCat("/tmp/", prefix_, ".nft");
  std::ofstream(file, std::ios::trunc) << rules;
  absl::Status status = Sh(absl::StrCat("ip netns exec ", switch_ns_, " nft -f ", file));
  std::remove(file.c_str());
  return status;
}

absl::Status TestHosts::SetDelay(int host, absl::Duration delay) {
  if (host < 0 || host >= size() || delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("SetDelay: host ", host));
  }
  Host& h = hosts_[host];
  // Packets are held as they arrive (INPUT), not as they leave: a sent
  // packet held in the sender's own namespace still counts against its
  // socket, and TCP small queues would then let only a packet or two per
  // socket wait at a time (measured: 0.06x the clean link's throughput at
  // 20 ms). An arriving packet has crossed the veth and belongs to no socket.
  // --queue-bypass: with no reader the rule lets packets through, so the
  // order of these steps never drops any.
  const std::string rule = "INPUT -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass";
  const std::string iptables = "ip netns exec " + h.netns + " iptables ";
  if (h.delayer) {
    (void)Sh(iptables + "-D " + rule);
    h.delayer.reset();
  }
  if (delay == absl::ZeroDuration()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<PacketDelayer>> delayer =
      PacketDelayer::Start(absl::StrCat(kNetnsDir, "/", h.netns), 0, delay);
  if (!delayer.ok()) return delayer.status();
  h.delayer = std::move(*delayer);
  return Sh(iptables + "-A " + rule);
}

}  // namespace specstream::testing
