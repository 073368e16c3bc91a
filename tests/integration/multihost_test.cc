// Every role on its own host: network namespaces with their own addresses
// and hostnames (tests/testing/hosts.h), the project's binaries run on them
// as users run them. Multi-host training must equal the same job on one host
// (weights after the first step bitwise; loss and acc at the last step), and
// a failed rendezvous must end every rank within its deadline.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/hosts.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "multihost-token-0123456789";          // users'
constexpr char kDaemonToken[] = "multihost-daemons-9876543210";  // daemons' (shared)

class MultiHostTest : public ::testing::Test {
 protected:
  // Makes `count` hosts, or skips loudly (fails under CI=true, which runs as
  // root and must run these).
  bool MakeHosts(int count) {
    auto hosts = testing::TestHosts::Create(count);
    if (!hosts.ok()) {
      if (testing::RunningInCi()) {
        ADD_FAILURE() << "CI must run the multi-host tests: " << hosts.status();
      } else {
        std::cerr << "SKIPPING multi-host test: " << hosts.status() << "\n";
      }
      return false;
    }
    hosts_ = std::move(*hosts);
    return true;
  }

  int Tool(const std::string& binary, const std::string& args) {
    return testing::RunCommand(binary + " " + args, dir_.Join("tool.log"), dir_.Join("tool.log"));
  }
  std::string ToolLog() { return testing::ReadFile(dir_.Join("tool.log")); }
  std::string Log(const std::string& name) {
    const std::string path = dir_.Join(name + ".log");
    return std::filesystem::exists(path) ? testing::ReadFile(path) : "(no " + name + ".log)";
  }

  // A tiny target, 24 tokenized samples and their offline store.
  void MakeTargetAndStore() {
    ASSERT_EQ(Tool(SPECSTREAM_TEACHER_PATH,
                   "init-random --arch llama --layers 8 --hidden 32 --heads 4 --kv-heads 2 "
                   "--intermediate 64 --vocab 256 --dtype float32 --out " +
                       dir_.Join("target")),
              0)
        << ToolLog();
    std::string data;
    for (int i = 0; i < 24; ++i) {
      std::string ids;
      for (int t = 0; t < 20 + i % 7; ++t) {
        ids += (t ? "," : "") + std::to_string((i * 31 + t * 17) % 256);
      }
      data += "{\"input_ids\":[" + ids + "]}\n";
    }
    testing::WriteFile(dir_.Join("data.jsonl"), data);
    ASSERT_EQ(Tool(SPECSTREAM_TEACHER_PATH, "dump --model " + dir_.Join("target") + " --data " +
                                                dir_.Join("data.jsonl") + " --out " +
                                                dir_.Join("store") + " --keep-target-ids"),
              0)
        << ToolLog();
  }

  // A job named `name` over `data` (a YAML data section body), 4 steps,
  // a checkpoint after every step, metrics in <name>.metrics.jsonl.
  std::string Job(const std::string& name, const std::string& data, const std::string& extra) {
    return "name: " + name + "\ndata:\n" + data + "model:\n  target: " + dir_.Join("target") +
           "\n  draft:\n    draft_vocab_size: 64\n"
           "optimizer:\n  lr: 3.0e-3\n  warmup_steps: 2\n"
           "training:\n  max_steps: 4\n  batch_size: 2\n  ttt_steps: 3\n  dtype: float32\n"
           "checkpoint:\n  dir: " +
           dir_.Join("ckpt-" + name) +
           "\n  every_steps: 1\nmetrics:\n  jsonl: " + dir_.Join(name + ".metrics.jsonl") + "\n" +
           extra;
  }
  std::string StoreJob(const std::string& name, const std::string& extra) {
    return Job(name, "  store: " + dir_.Join("store") + "\n", extra);
  }
  std::string WriteJob(const std::string& name, const std::string& yaml) {
    const std::string path = dir_.Join(name + ".yaml");
    testing::WriteFile(path, yaml);
    return path;
  }

  // The same job on one host: `train --nproc` on loopback.
  void TrainOnOneHost(const std::string& name, const std::string& yaml, int nproc) {
    ASSERT_EQ(Tool(SPECSTREAM_STUDENT_PATH,
                   "train --config " + WriteJob(name, yaml) + " --nproc " + std::to_string(nproc)),
              0)
        << ToolLog();
  }

  // Starts rank r of the job on host rank_hosts[r], torchrun-style
  // environment, MASTER_ADDR = rank 0's host; logs <name>-rank<r>.log.
  std::vector<pid_t> SpawnRanks(const std::string& name, const std::string& yaml,
                                const std::vector<int>& rank_hosts, int port,
                                const std::map<int, std::vector<std::string>>& extra_env = {}) {
    const std::string config = WriteJob(name, yaml);
    std::vector<pid_t> pids;
    for (size_t rank = 0; rank < rank_hosts.size(); ++rank) {
      std::vector<std::string> env = {"RANK=" + std::to_string(rank), "LOCAL_RANK=0",
                                      "WORLD_SIZE=" + std::to_string(rank_hosts.size()),
                                      "MASTER_ADDR=" + hosts_->address(rank_hosts[0]),
                                      "MASTER_PORT=" + std::to_string(port)};
      auto it = extra_env.find(static_cast<int>(rank));
      if (it != extra_env.end()) env.insert(env.end(), it->second.begin(), it->second.end());
      pids.push_back(hosts_->Spawn(rank_hosts[rank],
                                   {SPECSTREAM_STUDENT_PATH, "train", "--config", config}, env,
                                   dir_.Join(name + "-rank" + std::to_string(rank) + ".log")));
    }
    return pids;
  }
  // SpawnRanks on a fresh port (the last run's connections may linger),
  // then each rank's exit code.
  std::vector<int> TrainOnHosts(const std::string& name, const std::string& yaml,
                                const std::vector<int>& rank_hosts,
                                const std::map<int, std::vector<std::string>>& extra_env = {}) {
    std::vector<int> codes;
    for (pid_t pid : SpawnRanks(name, yaml, rank_hosts, next_port_++, extra_env)) {
      codes.push_back(hosts_->Wait(pid));
    }
    return codes;
  }
  // A teacher on the machine's own loopback, for the one-host references;
  // returns its port. StopLocalTeacher ends it.
  int StartLocalTeacher() {
    const std::string serve =
        std::string(SPECSTREAM_TEACHER_PATH) + " serve --model " + dir_.Join("target") +
        " --devices cpu --port 0 --port-file " + dir_.Join("local-teacher.port") +
        " --keep-target-ids --batch-tokens 1 >" + dir_.Join("local-teacher.log") +
        " 2>&1 & echo $! >" + dir_.Join("local-teacher.pid");
    EXPECT_EQ(std::system(serve.c_str()), 0);
    return WaitPort("local-teacher");
  }
  void StopLocalTeacher() {
    std::system(("kill -TERM " + testing::ReadFile(dir_.Join("local-teacher.pid"))).c_str());
  }
  std::string RankLogs(const std::string& name, int world) {
    std::string all;
    for (int r = 0; r < world; ++r) {
      all += "--- rank " + std::to_string(r) + ":\n" + Log(name + "-rank" + std::to_string(r));
    }
    return all;
  }

  // Weights after step 1 bitwise; loss and acc_k of the last step exactly.
  void ExpectSameTraining(const std::string& a, const std::string& b) {
    const std::string step1 = "/step-00000001/draft.safetensors";
    const std::string wa = testing::ReadFile(dir_.Join("ckpt-" + a) + step1);
    const std::string wb = testing::ReadFile(dir_.Join("ckpt-" + b) + step1);
    EXPECT_FALSE(wa.empty());
    EXPECT_TRUE(wa == wb) << a << " and " << b << " differ after the first step";
    const nlohmann::json la = LastMetrics(a), lb = LastMetrics(b);
    ASSERT_TRUE(la.contains("loss") && lb.contains("loss")) << la.dump() << lb.dump();
    EXPECT_EQ(la["step"], 4);
    EXPECT_EQ(la["step"], lb["step"]);
    EXPECT_EQ(la["loss"].get<double>(), lb["loss"].get<double>());
    EXPECT_EQ(la["acc_k"], lb["acc_k"]);
  }
  nlohmann::json LastMetrics(const std::string& name) {
    std::istringstream lines(testing::ReadFile(dir_.Join(name + ".metrics.jsonl")));
    std::string line, last;
    while (std::getline(lines, line)) {
      if (!line.empty()) last = line;
    }
    return nlohmann::json::parse(last, nullptr, false);
  }

  // The ledger of a one-rank online run over the 24 samples (batch 2) of
  // `steps` steps: one line per step, every sample steps/12 times.
  void ExpectEveryEpochTrainsEverySampleOnce(const std::string& name, int64_t steps) {
    std::map<int64_t, int> seen;
    int64_t lines = 0;
    std::istringstream ledger(
        testing::ReadFile(dir_.Join("ledger-" + name + "/ledger-rank0.jsonl")));
    for (std::string line; std::getline(ledger, line); ++lines) {
      const nlohmann::json entry = nlohmann::json::parse(line);
      for (const auto& id : entry["sample_ids"]) ++seen[id.get<int64_t>()];
    }
    EXPECT_EQ(lines, steps) << name;
    EXPECT_EQ(seen.size(), 24u) << name;
    for (const auto& [id, count] : seen) EXPECT_EQ(count, steps / 12) << name << " sample " << id;
    std::cerr << name << " ledger: " << lines << " steps, " << seen.size()
              << " distinct samples, each trained " << (seen.empty() ? 0 : seen.begin()->second)
              << " times\n";
  }

  // A one-rank online job over both given teachers with a ledger, `steps`
  // steps and one checkpoint at the end.
  std::string LedgerJob(const std::string& name, const std::string& teachers, int steps) {
    std::string yaml = Job(name,
                           "  tokenized: " + dir_.Join("data.jsonl") + "\n" + teachers +
                               "  ledger_dir: " + dir_.Join("ledger-" + name) + "\n",
                           "");
    yaml.replace(yaml.find("max_steps: 4"), 12, "max_steps: " + std::to_string(steps));
    yaml.replace(yaml.find("every_steps: 1"), 14, "every_steps: " + std::to_string(steps));
    return yaml;
  }

  // The bound port a daemon wrote to <name>.port.
  int WaitPort(const std::string& name) {
    const int port = testing::WaitForPortFile(dir_.Join(name + ".port"));
    if (port == 0) ADD_FAILURE() << "no port from " << name << ":\n" << Log(name);
    return port;
  }

  // `binary` with whitespace-separated `args` on `host`, output in <name>.log.
  pid_t SpawnOn(int host, const std::string& name, const std::string& binary,
                const std::string& args) {
    std::vector<std::string> argv = {binary};
    std::istringstream in(args);
    for (std::string word; in >> word;) argv.push_back(word);
    return hosts_->Spawn(host, argv, {}, dir_.Join(name + ".log"));
  }

  // A teacher daemon on `host` listening on every address (students reach
  // it at its hostname, which /etc/hosts resolves on every host); under the
  // coordinator when one is given. One sequence per forward, so that its
  // numerics never depend on which requests share a batch.
  // `global` goes before the command (--log-level debug), `flags` after.
  void StartTeacher(int host, const std::string& name, const std::string& coordinator = "",
                    const std::string& flags = "", const std::string& global = "") {
    SpawnOn(host, name, SPECSTREAM_TEACHER_PATH,
            global + " serve --model " + dir_.Join("target") + " " + flags +
                " --devices cpu --host 0.0.0.0 --port 0 " +
                "--keep-target-ids --batch-tokens 1 --port-file " + dir_.Join(name + ".port") +
                (coordinator.empty() ? " --insecure-no-auth"
                                     : " --coordinator " + coordinator + " " + DaemonToken()));
    WaitPort(name);
  }

  // The coordinator on host `coordinator_host`, a teacher on `teacher_host`
  // and a student daemon on each of `student_hosts`; returns the
  // coordinator's address.
  std::string StartSystem(int coordinator_host, int teacher_host,
                          const std::vector<int>& student_hosts, const std::string& extra = "") {
    testing::WriteFile(dir_.Join("token"), std::string(kToken) + "\n");
    testing::WriteFile(dir_.Join("daemon-token"), std::string(kDaemonToken) + "\n");
    SpawnOn(coordinator_host, "coordinator", SPECSTREAM_COORDINATOR_PATH,
            "--port 0 --port-file " + dir_.Join("coordinator.port") + " --db " +
                dir_.Join("jobs.db") + " " + Token() + " --daemon-token-file " +
                dir_.Join("daemon-token") + " --heartbeat-ms 200 " + extra);
    const std::string coordinator =
        hosts_->address(coordinator_host) + ":" + std::to_string(WaitPort("coordinator"));
    StartTeacher(teacher_host, "teacher", coordinator);
    for (size_t s = 0; s < student_hosts.size(); ++s) {
      const std::string name = "student" + std::to_string(s);
      SpawnOn(student_hosts[s], name, SPECSTREAM_STUDENT_PATH,
              "serve --coordinator " + coordinator + " --name " + name + " --port 0 --port-file " +
                  dir_.Join(name + ".port") + " --workdir " + dir_.Join("work-" + name) + " " +
                  DaemonToken());
      WaitPort(name);
    }
    return coordinator;
  }
  std::string Token() { return "--token-file " + dir_.Join("token"); }
  std::string DaemonToken() { return "--token-file " + dir_.Join("daemon-token"); }

  // The CLI on `host`; output in cli.log.
  int Cli(int host, const std::string& coordinator, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SPECSTREAM_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    std::filesystem::remove(dir_.Join("cli.log"));
    return hosts_->Run(
        host, argv,
        {"SPECSTREAM_ADDRESS=" + coordinator, std::string("SPECSTREAM_TOKEN=") + kToken},
        dir_.Join("cli.log"));
  }

  // The last step in <name>.metrics.jsonl (0 before the first).
  int64_t MetricsStep(const std::string& name) {
    if (!std::filesystem::exists(dir_.Join(name + ".metrics.jsonl"))) return 0;
    const nlohmann::json last = LastMetrics(name);
    return last.is_object() && last.contains("step") ? last["step"].get<int64_t>() : 0;
  }
  bool WaitForStep(const std::string& name, int64_t step, int seconds) {
    return testing::WaitUntil([&] { return MetricsStep(name) >= step; }, absl::Seconds(seconds),
                              absl::Milliseconds(100));
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TestHosts> hosts_;
  int next_port_ = 29600;
};

// The harness itself: separate hostnames, addresses that reach each other,
// a link that can be cut, and loss that can be added.
TEST_F(MultiHostTest, HostsAreSeparateAndFaultsApply) {
  if (!MakeHosts(2)) return;
  EXPECT_EQ(hosts_->Run(0, {"/bin/hostname"}, {}, dir_.Join("hostname.log")), 0);
  EXPECT_EQ(testing::ReadFile(dir_.Join("hostname.log")), "host0\n");
  // /etc/hosts names every host (and added names, as Services).
  hosts_->AddName("teacher.svc", 1);
  const std::vector<std::string> ping = {"/bin/ping", "-c", "1", "-W", "2", "teacher.svc"};
  EXPECT_EQ(hosts_->Run(0, ping, {}, dir_.Join("ping.log")), 0) << Log("ping");
  EXPECT_NE(Log("ping").find("198.18.0.2"), std::string::npos) << Log("ping");
  ASSERT_TRUE(hosts_->SetLink(1, false).ok());
  EXPECT_NE(hosts_->Run(0, ping, {}, dir_.Join("ping-down.log")), 0) << Log("ping-down");
  ASSERT_TRUE(hosts_->SetLink(1, true).ok());
  const absl::Status lossy = hosts_->SetLoss(1, 100);
  ASSERT_TRUE(lossy.ok()) << lossy;
  EXPECT_NE(hosts_->Run(0, ping, {}, dir_.Join("ping-loss.log")), 0) << Log("ping-loss");
  ASSERT_TRUE(hosts_->SetLoss(1, 0).ok());
  EXPECT_EQ(hosts_->Run(0, ping, {}, dir_.Join("ping-back.log")), 0) << Log("ping-back");
  // A delay on host 1's sending side shows in every round trip.
  const absl::Status delayed = hosts_->SetDelay(1, absl::Milliseconds(50));
  ASSERT_TRUE(delayed.ok()) << delayed;
  const std::vector<std::string> pings = {"/bin/ping", "-c", "3", "-i", "0.2", "198.18.0.2"};
  ASSERT_EQ(hosts_->Run(0, pings, {}, dir_.Join("ping-delay.log")), 0) << Log("ping-delay");
  const std::string rtt = Log("ping-delay");
  const size_t at = rtt.find("min/avg/max/mdev = ");
  ASSERT_NE(at, std::string::npos) << rtt;
  const double min_ms = std::stod(rtt.substr(at + 19));
  EXPECT_GE(min_ms, 50) << rtt;
  EXPECT_LT(min_ms, 80) << rtt;
  ASSERT_TRUE(hosts_->SetDelay(1, absl::ZeroDuration()).ok());
  ASSERT_EQ(hosts_->Run(0, pings, {}, dir_.Join("ping-nodelay.log")), 0) << Log("ping-nodelay");
  const std::string fast = Log("ping-nodelay");
  EXPECT_LT(std::stod(fast.substr(fast.find("min/avg/max/mdev = ") + 19)), 10) << fast;
}

// DDP 2 across two hosts equals DDP 2 on one. Rank 1 binds by interface
// (GLOO_SOCKET_IFNAME), rank 0 by the route to MASTER_ADDR.
TEST_F(MultiHostTest, DataParallelAcrossTwoHostsEqualsOneHost) {
  if (!MakeHosts(2)) return;
  MakeTargetAndStore();
  TrainOnOneHost("ddp-local", StoreJob("ddp-local", ""), 2);
  const auto codes = TrainOnHosts("ddp-hosts", StoreJob("ddp-hosts", ""), {0, 1},
                                  {{1, {"GLOO_SOCKET_IFNAME=eth0"}}});
  ASSERT_EQ(codes, std::vector<int>({0, 0})) << RankLogs("ddp-hosts", 2);
  EXPECT_NE(Log("ddp-hosts-rank1").find("rank 1/2 binds 198.18.0.2 and joins 198.18.0.1:"),
            std::string::npos)
      << Log("ddp-hosts-rank1");
  ExpectSameTraining("ddp-local", "ddp-hosts");
}

// CP 2 across two hosts, ring and Ulysses, equals CP 2 on one.
TEST_F(MultiHostTest, ContextParallelAcrossTwoHostsEqualsOneHost) {
  if (!MakeHosts(2)) return;
  MakeTargetAndStore();
  for (const std::string mode : {"ring", "ulysses"}) {
    const std::string parallel = "parallel:\n  cp_size: 2\n  cp_mode: " + mode + "\n";
    TrainOnOneHost("cp-local-" + mode, StoreJob("cp-local-" + mode, parallel), 2);
    const auto codes =
        TrainOnHosts("cp-hosts-" + mode, StoreJob("cp-hosts-" + mode, parallel), {0, 1});
    ASSERT_EQ(codes, std::vector<int>({0, 0})) << RankLogs("cp-hosts-" + mode, 2);
    ExpectSameTraining("cp-local-" + mode, "cp-hosts-" + mode);
  }
}

// DP 2 x CP 2 with each rank on its own host.
TEST_F(MultiHostTest, DataTimesContextParallelOnFourHosts) {
  if (!MakeHosts(4)) return;
  MakeTargetAndStore();
  const std::string parallel = "parallel:\n  dp_size: 2\n  cp_size: 2\n  cp_mode: ring\n";
  TrainOnOneHost("dpcp-local", StoreJob("dpcp-local", parallel), 4);
  const auto codes = TrainOnHosts("dpcp-hosts", StoreJob("dpcp-hosts", parallel), {0, 1, 2, 3});
  ASSERT_EQ(codes, std::vector<int>({0, 0, 0, 0})) << RankLogs("dpcp-hosts", 4);
  ExpectSameTraining("dpcp-local", "dpcp-hosts");
}

// A rank that never arrives: every other rank exits within the deadline,
// naming it and the hosts of those that joined.
TEST_F(MultiHostTest, RankMissingFromRendezvousEndsEveryRankWithinTheDeadline) {
  if (!MakeHosts(3)) return;
  MakeTargetAndStore();
  const auto start = Clock::now();
  const std::vector<pid_t> pids = SpawnRanks(
      "missing", StoreJob("missing", "parallel:\n  dp_size: 3\n  rendezvous_timeout_s: 6\n"),
      {0, 1, 2}, 29500);
  hosts_->Kill(pids[2], SIGKILL);  // killed during its rendezvous, before it joined
  EXPECT_EQ(hosts_->Wait(pids[2]), 128 + SIGKILL);
  // Each rank's deadline runs from its rendezvous: the time its "binds ...
  // joins" line shows in its log (polled every 20 ms) to its exit.
  std::vector<std::optional<Clock::time_point>> joined(2), exited(2);
  std::vector<int> codes(2, -1);
  testing::WaitUntil(
      [&] {
        for (int rank = 0; rank < 2; ++rank) {
          if (!joined[rank] &&
              Log("missing-rank" + std::to_string(rank)).find(" binds ") != std::string::npos) {
            joined[rank] = Clock::now();
          }
          if (!exited[rank] && (codes[rank] = hosts_->Poll(pids[rank])) != -1) {
            exited[rank] = Clock::now();
          }
        }
        return exited[0] && exited[1];
      },
      absl::Seconds(60));
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = Log("missing-rank" + std::to_string(rank));
    ASSERT_TRUE(joined[rank] && exited[rank]) << log;
    EXPECT_NE(codes[rank], 0);
    EXPECT_NE(log.find("rank 2 of 3 did not join within 6 s (parallel.rendezvous_timeout_s)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("joined: rank 0 (host0, 198.18.0.1), rank 1 (host1, 198.18.0.2)"),
              std::string::npos)
        << log;
    const double in_rendezvous =
        std::chrono::duration<double>(*exited[rank] - *joined[rank]).count();
    const double since_start = std::chrono::duration<double>(*exited[rank] - start).count();
    std::cerr << "rendezvous with a missing rank: rank " << rank << " exited " << in_rendezvous
              << " s after its rendezvous began (deadline 6 s), " << since_start
              << " s after its process started\n";
    // The deadline, one 50 ms look at the store, and the exit itself.
    EXPECT_LT(in_rendezvous, 6 + 1.0) << log;
  }
}

// Rank 0 (which serves the store) dies while the others wait: they fail at
// once instead of waiting out the deadline. A rank that cannot bind its
// --host says so, and the others learn why.
TEST_F(MultiHostTest, RendezvousFailuresAreNamedAndFast) {
  if (!MakeHosts(3)) return;
  MakeTargetAndStore();
  {
    // Ranks 0 and 1 of three; rank 2 never comes.
    std::vector<pid_t> pids = SpawnRanks(
        "dead0", StoreJob("dead0", "parallel:\n  dp_size: 3\n  rendezvous_timeout_s: 60\n"),
        {0, 1, 2}, 29500);
    hosts_->Kill(pids[2], SIGKILL);
    hosts_->Wait(pids[2]);
    // Rank 1 is waiting for rank 2 once its join shows in its log.
    testing::WaitUntil([&] { return Log("dead0-rank1").find("binds") != std::string::npos; },
                       absl::Seconds(20), absl::Milliseconds(100));
    // Not a wait: rank 1 spends a second inside its rendezvous before rank 0
    // dies, so the test measures a failure noticed mid-wait.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto killed = Clock::now();
    hosts_->Kill(pids[0], SIGKILL);
    EXPECT_EQ(hosts_->Wait(pids[0]), 128 + SIGKILL);
    EXPECT_NE(hosts_->Wait(pids[1]), 0);
    const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
    std::cerr << "rank 0 killed during the rendezvous: rank 1 exited " << seconds
              << " s later (deadline 60 s)\n";
    EXPECT_LT(seconds, 30) << Log("dead0-rank1");
    EXPECT_NE(Log("dead0-rank1").find("rendezvous at 198.18.0.1:29500"), std::string::npos)
        << Log("dead0-rank1");
  }
  {
    // Rank 1 is told an address its host does not have.
    const auto start = Clock::now();
    const auto codes = TrainOnHosts(
        "badhost", StoreJob("badhost", "parallel:\n  dp_size: 2\n  rendezvous_timeout_s: 60\n"),
        {0, 1}, {{1, {"SPECSTREAM_HOST=198.18.0.99"}}});
    EXPECT_NE(codes[0], 0);
    EXPECT_NE(codes[1], 0);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_LT(seconds, 30) << RankLogs("badhost", 2);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string log = Log("badhost-rank" + std::to_string(rank));
      EXPECT_NE(log.find("rank 1 on host1 cannot bind Gloo to 198.18.0.99"), std::string::npos)
          << log;
    }
  }
}

// The whole system with every role on its own host: the coordinator (host
// 0), a teacher (1), two student daemons (2, 3) and `specstream submit
// --follow` (4). Online DDP 2: `auto` picks inline (the teacher is on
// another host), and the run equals the same job trained on one host.
TEST_F(MultiHostTest, CoordinatorJobWithEveryRoleOnItsOwnHost) {
  if (!MakeHosts(5)) return;
  MakeTargetAndStore();
  const std::string coordinator = StartSystem(0, 1, {2, 3}, "--lost-after-s 5");
  const std::string online = "  tokenized: " + dir_.Join("data.jsonl") + "\n";
  const std::string job = WriteJob("e2e", Job("e2e", online, "parallel:\n  dp_size: 2\n"));
  ASSERT_EQ(Cli(4, coordinator, {"submit", job, "--id", "e2e-1", "--follow"}), 0)
      << Log("cli") << Log("coordinator") << Log("student0") << Log("student1");
  EXPECT_NE(Log("cli").find("step 4/4"), std::string::npos) << Log("cli");
  // Each rank bound its own host's address; rank 1 met rank 0 on host 2.
  EXPECT_NE(Log("student0").find("binds 198.18.0.3 and joins 198.18.0.3:"), std::string::npos)
      << Log("student0");
  EXPECT_NE(Log("student1").find("binds 198.18.0.4 and joins 198.18.0.3:"), std::string::npos)
      << Log("student1");
  for (const std::string student : {"student0", "student1"}) {
    EXPECT_NE(Log(student).find("on host host1: payloads TRANSPORT_INLINE (data.transport auto)"),
              std::string::npos)
        << Log(student);
  }

  // The same job on one host, against a teacher on loopback.
  const int local_port = StartLocalTeacher();
  TrainOnOneHost(
      "e2e-local",
      Job("e2e-local", online + "  teachers: [\"127.0.0.1:" + std::to_string(local_port) + "\"]\n",
          "parallel:\n  dp_size: 2\n"),
      2);
  StopLocalTeacher();
  ExpectSameTraining("e2e-local", "e2e");
}

// The offline jobs of the list, gang-scheduled by a coordinator on student
// daemons that each have a host of their own and submitted from yet another
// host: CP 2 (ring, Ulysses) on two student hosts and DP 2 x CP 2 on four,
// each equal to the same job on one host.
TEST_F(MultiHostTest, ParallelJobsThroughTheCoordinatorSpanStudentHosts) {
  if (!MakeHosts(7)) return;
  MakeTargetAndStore();
  const std::string coordinator = StartSystem(0, 1, {2, 3, 4, 5}, "--lost-after-s 10");
  struct Case {
    std::string name, parallel;
    int world;
  };
  for (const Case& c :
       {Case{"co-ring", "parallel:\n  dp_size: 1\n  cp_size: 2\n  cp_mode: ring\n", 2},
        Case{"co-ulysses", "parallel:\n  dp_size: 1\n  cp_size: 2\n  cp_mode: ulysses\n", 2},
        Case{"co-dpcp", "parallel:\n  dp_size: 2\n  cp_size: 2\n  cp_mode: ring\n", 4}}) {
    ASSERT_EQ(
        Cli(6, coordinator,
            {"submit", WriteJob(c.name, StoreJob(c.name, c.parallel)), "--id", c.name, "--follow"}),
        0)
        << c.name << ":\n"
        << Log("cli") << Log("coordinator") << Log("student0");
    TrainOnOneHost(c.name + "-local", StoreJob(c.name + "-local", c.parallel), c.world);
    ExpectSameTraining(c.name + "-local", c.name);
  }
  // Every student host ran a rank bound to its own address.
  for (int s = 0; s < 4; ++s) {
    const std::string log = Log("student" + std::to_string(s));
    EXPECT_NE(log.find("binds " + hosts_->address(2 + s) + " and joins"), std::string::npos) << log;
  }
}

// Fault (b): the link of one of two teachers is cut mid-epoch. Its samples
// are re-requested from the other; the ledger lists every sample exactly
// once per epoch (8 epochs), and the weights equal the uninterrupted run's.
TEST_F(MultiHostTest, TeacherLinkCutMidEpochFailsOverWithNothingLost) {
  if (!MakeHosts(3)) return;
  MakeTargetAndStore();
  StartTeacher(0, "teacher-a");
  StartTeacher(1, "teacher-b");
  const std::string teachers = "  teachers: [\"host0:" + std::to_string(WaitPort("teacher-a")) +
                               "\", \"host1:" + std::to_string(WaitPort("teacher-b")) + "\"]\n";
  auto job = [&](const std::string& name) { return LedgerJob(name, teachers, 96); };  // 8 epochs
  const std::string config_clean = WriteJob("clean", job("clean"));
  ASSERT_EQ(hosts_->Run(2, {SPECSTREAM_STUDENT_PATH, "train", "--config", config_clean}, {},
                        dir_.Join("clean.log")),
            0)
      << Log("clean");

  const std::string config_cut = WriteJob("cut", job("cut"));
  const pid_t trainer = hosts_->Spawn(2, {SPECSTREAM_STUDENT_PATH, "train", "--config", config_cut},
                                      {}, dir_.Join("cut.log"));
  ASSERT_TRUE(WaitForStep("cut", 3, 120)) << Log("cut");
  ASSERT_TRUE(hosts_->SetLink(0, false).ok());
  const int64_t cut_at = MetricsStep("cut");
  const int code = hosts_->Wait(trainer);
  ASSERT_TRUE(hosts_->SetLink(0, true).ok());
  ASSERT_EQ(code, 0) << Log("cut");
  EXPECT_LT(cut_at, 96) << "training ended before the cut";
  EXPECT_NE(Log("cut").find("re-requested"), std::string::npos) << Log("cut");

  ExpectEveryEpochTrainsEverySampleOnce("clean", 96);
  ExpectEveryEpochTrainsEverySampleOnce("cut", 96);
  const std::string last = "/step-00000096/draft.safetensors";
  EXPECT_TRUE(testing::ReadFile(dir_.Join("ckpt-clean") + last) ==
              testing::ReadFile(dir_.Join("ckpt-cut") + last))
      << "the failed-over run's final weights differ from the uninterrupted run's";
}

// data.regenerate across hosts (P19): the two DDP ranks, each on its own
// host, send prompts to two teachers on two other hosts, which write the
// answers (sampled, T = 1) and stream prompt + answer. Training equals DDP on
// one host over the store `dump --regenerate` writes with the same settings,
// and each teacher wrote some of the answers.
TEST_F(MultiHostTest, RegenerationAcrossHostsEqualsTheRegeneratedStore) {
  if (!MakeHosts(4)) return;
  MakeTargetAndStore();
  {
    std::ifstream data(dir_.Join("data.jsonl"));
    std::ofstream prompts(dir_.Join("prompts.jsonl"));
    for (std::string line; std::getline(data, line);) {
      std::vector<int32_t> ids = nlohmann::json::parse(line)["input_ids"];
      ids.resize(8);
      prompts << nlohmann::json{{"input_ids", ids}}.dump() << "\n";
    }
  }
  const std::string answers = "--max-new 12 --temperature 1 --seed 5";
  ASSERT_EQ(
      Tool(SPECSTREAM_TEACHER_PATH,
           "dump --model " + dir_.Join("target") + " --data " + dir_.Join("prompts.jsonl") +
               " --out " + dir_.Join("store-regenerated") +
               " --keep-target-ids --batch-tokens 1 --store-dtype float32 --regenerate " + answers),
      0)
      << ToolLog();
  TrainOnOneHost("regen-local",
                 Job("regen-local", "  store: " + dir_.Join("store-regenerated") + "\n", ""), 2);

  const std::string float32 = "--dtype float32 --payload-dtype float32";
  StartTeacher(2, "teacher-a", "", float32, "--log-level debug");
  StartTeacher(3, "teacher-b", "", float32, "--log-level debug");
  const std::string data = "  tokenized: " + dir_.Join("prompts.jsonl") +
                           "\n  teachers: [\"host2:" + std::to_string(WaitPort("teacher-a")) +
                           "\", \"host3:" + std::to_string(WaitPort("teacher-b")) +
                           "\"]\n  regenerate:\n    max_new_tokens: 12\n    temperature: 1.0\n"
                           "    seed: 5\n";
  const auto codes = TrainOnHosts("regen-hosts", Job("regen-hosts", data, ""), {0, 1},
                                  {{1, {"GLOO_SOCKET_IFNAME=eth0"}}});
  ASSERT_EQ(codes, std::vector<int>({0, 0})) << RankLogs("regen-hosts", 2);
  ExpectSameTraining("regen-local", "regen-hosts");
  for (const std::string teacher : {"teacher-a", "teacher-b"}) {
    EXPECT_NE(Log(teacher).find("answered sample"), std::string::npos)
        << teacher << " wrote no answer:\n"
        << Log(teacher);
  }
}

// Fault (a): 20 ms delay on everything the teacher's host receives (so on
// every round trip with it) and 1 % loss each way. Online training
// completes, and the ledger shows every sample trained exactly once per
// epoch.
TEST_F(MultiHostTest, DelayAndLossToTheTeacherLoseNothing) {
  if (!MakeHosts(2)) return;
  MakeTargetAndStore();
  StartTeacher(0, "teacher");
  ASSERT_TRUE(hosts_->SetDelay(0, absl::Milliseconds(20)).ok());
  ASSERT_TRUE(hosts_->SetLoss(0, 1).ok());
  const std::string teachers =
      "  teachers: [\"host0:" + std::to_string(WaitPort("teacher")) + "\"]\n";
  const std::string config = WriteJob("lossy", LedgerJob("lossy", teachers, 48));
  ASSERT_EQ(hosts_->Run(1, {SPECSTREAM_STUDENT_PATH, "train", "--config", config}, {},
                        dir_.Join("lossy.log")),
            0)
      << Log("lossy");
  ExpectEveryEpochTrainsEverySampleOnce("lossy", 48);
}

// Fault (d): the coordinator's host is unreachable for 10 s mid-job. The job
// keeps training, the daemons heartbeat again once it is back, and the job
// ends SUCCEEDED in its first attempt.
TEST_F(MultiHostTest, CoordinatorUnreachableForTenSecondsJobKeepsTraining) {
  if (!MakeHosts(5)) return;
  MakeTargetAndStore();
  const std::string coordinator = StartSystem(0, 1, {2, 3}, "--lost-after-s 30");
  std::string yaml =
      Job("outage", "  tokenized: " + dir_.Join("data.jsonl") + "\n", "parallel:\n  dp_size: 2\n");
  yaml.replace(yaml.find("max_steps: 4"), 12, "max_steps: 400");
  yaml.replace(yaml.find("every_steps: 1"), 14, "every_steps: 100");
  const std::string job = WriteJob("outage", yaml);
  ASSERT_EQ(Cli(4, coordinator, {"submit", job, "--id", "outage-1"}), 0) << Log("cli");
  ASSERT_TRUE(WaitForStep("outage", 5, 120)) << Log("coordinator") << Log("student0");
  ASSERT_TRUE(hosts_->SetLink(0, false).ok());
  const int64_t before = MetricsStep("outage");
  EXPECT_NE(Cli(4, coordinator, {"status", "outage-1", "--timeout", "2"}), 0);
  // Not a wait: the outage lasts ten seconds, whatever happens in them.
  std::this_thread::sleep_for(std::chrono::seconds(10));
  const int64_t during = MetricsStep("outage");
  ASSERT_TRUE(hosts_->SetLink(0, true).ok());
  std::cerr << "coordinator cut off for 10 s: the job went from step " << before << " to " << during
            << "\n";
  EXPECT_GT(during, before) << "training stopped while the coordinator was away";
  ASSERT_EQ(Cli(4, coordinator, {"wait", "outage-1", "--timeout", "300"}), 0)
      << Log("cli") << Log("coordinator") << Log("student0") << Log("student1");
  ASSERT_EQ(Cli(4, coordinator, {"status", "outage-1", "-o", "json"}), 0) << Log("cli");
  const auto status = nlohmann::json::parse(Log("cli"), nullptr, false);
  ASSERT_TRUE(status.is_object()) << Log("cli");
  EXPECT_EQ(status["state"], "JOB_STATE_SUCCEEDED") << status.dump();
  EXPECT_EQ(status.value("attempt", 0), 0) << status.dump();
  EXPECT_EQ(status["ranks"].size(), 2u) << status.dump();
  ASSERT_EQ(Cli(4, coordinator, {"list", "-o", "json"}), 0) << Log("cli");
  EXPECT_NE(Log("cli").find("outage-1"), std::string::npos);
}

// Fault (c): the host of a job's rank 1 is cut off from the coordinator and
// its peers. The coordinator loses its daemon, restarts the job from its
// latest checkpoint on the two daemons left, and the job ends with the same
// final weights as the same job trained without interruption.
TEST_F(MultiHostTest, StudentHostCutOffJobRestartsFromCheckpoint) {
  if (!MakeHosts(6)) return;
  MakeTargetAndStore();
  const std::string coordinator = StartSystem(0, 1, {2, 3, 4}, "--lost-after-s 3");
  auto job = [&](const std::string& name, const std::string& data) {
    std::string yaml = Job(name, data, "parallel:\n  dp_size: 2\nmax_restarts: 2\n");
    yaml.replace(yaml.find("max_steps: 4"), 12, "max_steps: 200");
    yaml.replace(yaml.find("every_steps: 1"), 14, "every_steps: 20");
    return yaml;
  };
  const std::string online = "  tokenized: " + dir_.Join("data.jsonl") + "\n";
  ASSERT_EQ(Cli(5, coordinator,
                {"submit", WriteJob("cutoff", job("cutoff", online)), "--id", "cutoff-1"}),
            0)
      << Log("cli");
  ASSERT_TRUE(WaitForStep("cutoff", 25, 120)) << Log("coordinator") << Log("student0");
  ASSERT_EQ(Cli(5, coordinator, {"status", "cutoff-1", "-o", "json"}), 0) << Log("cli");
  const auto running = nlohmann::json::parse(Log("cli"), nullptr, false);
  ASSERT_TRUE(running.is_object()) << Log("cli");
  const std::string victim = running["ranks"][1]["daemon_id"];
  const int victim_host = 2 + (victim.back() - '0');
  ASSERT_TRUE(hosts_->SetLink(victim_host, false).ok());
  const int64_t cut_at = MetricsStep("cutoff");
  std::cerr << "cut " << victim << " (host " << victim_host << ") off at step " << cut_at << "\n";
  const int waited = Cli(5, coordinator, {"wait", "cutoff-1", "--timeout", "300"});
  ASSERT_TRUE(hosts_->SetLink(victim_host, true).ok());
  ASSERT_EQ(waited, 0) << Log("cli") << Log("coordinator") << Log("student0") << Log("student1")
                       << Log("student2");
  ASSERT_EQ(Cli(5, coordinator, {"status", "cutoff-1", "-o", "json"}), 0) << Log("cli");
  const auto done = nlohmann::json::parse(Log("cli"), nullptr, false);
  EXPECT_EQ(done["state"], "JOB_STATE_SUCCEEDED") << done.dump();
  EXPECT_GE(done.value("attempt", 0), 1) << done.dump();
  for (const auto& rank : done["ranks"]) EXPECT_NE(rank["daemon_id"], victim) << done.dump();
  EXPECT_LT(cut_at, 200);

  // The same job without interruption, on one host.
  const int local_port = StartLocalTeacher();
  TrainOnOneHost("cutoff-local",
                 job("cutoff-local",
                     online + "  teachers: [\"127.0.0.1:" + std::to_string(local_port) + "\"]\n"),
                 2);
  StopLocalTeacher();
  const std::string last = "/step-00000200/draft.safetensors";
  EXPECT_TRUE(testing::ReadFile(dir_.Join("ckpt-cutoff") + last) ==
              testing::ReadFile(dir_.Join("ckpt-cutoff-local") + last))
      << "the restarted job's final weights differ from the uninterrupted run's";
}

// The Kubernetes cpu-smoke overlay, pod by pod: each pod of the rendered
// manifests runs on its own host with its hostname (the pod name) and IP,
// its init containers first, then its container's real command, args and
// environment ($(VAR) expanded, ConfigMap and downward-API values), its
// volumes bind-mounted where the manifest mounts them (a PersistentVolumeClaim
// shared by every pod that claims it, emptyDir per pod, the token Secret as
// files). Services' names resolve to their pods. The overlay's job.yaml is
// then submitted from a host outside the "cluster" and must succeed.
TEST_F(MultiHostTest, KubernetesSmokeJobRunsPodByPod) {
  const std::string node = SPECSTREAM_NODE;
  const std::string render = testing::SourceDir() + "/tests/k8s/render-json.mjs";
  if (node.empty() ||
      !std::filesystem::exists(testing::SourceDir() + "/tests/k8s/node_modules/yaml")) {
    if (testing::RunningInCi()) FAIL() << "node or tests/k8s/node_modules missing under CI=true";
    GTEST_SKIP() << "node or the k8s npm packages (tests/k8s/install.sh) are missing";
  }
  ASSERT_EQ(std::system((node + " " + render + " " + testing::SourceDir() +
                         "/deploy/k8s/overlays/cpu-smoke >" + dir_.Join("rendered.json") + " 2>" +
                         dir_.Join("render.err"))
                            .c_str()),
            0)
      << Log("render.err");
  const nlohmann::json objects =
      nlohmann::json::parse(testing::ReadFile(dir_.Join("rendered.json")));

  struct Pod {
    std::string name;
    nlohmann::json labels, spec;
    int index = 0;  // StatefulSet ordinal
  };
  std::vector<Pod> pods;
  std::map<std::string, std::map<std::string, std::string>> config_maps;
  for (const auto& o : objects) {
    const std::string kind = o["kind"];
    if (kind == "ConfigMap") {
      for (const auto& [key, value] : o["data"].items()) {
        config_maps[o["metadata"]["name"]][key] = value.get<std::string>();
      }
    } else if (kind == "Deployment" || kind == "StatefulSet") {
      const int replicas = o["spec"].value("replicas", 1);
      for (int i = 0; i < replicas; ++i) {
        Pod pod;
        const std::string base = o["metadata"]["name"];
        pod.name = kind == "StatefulSet" ? base + "-" + std::to_string(i)
                                         : base + "-5c9d8f7b6-" + std::to_string(i);
        pod.labels = o["spec"]["template"]["metadata"]["labels"];
        if (kind == "StatefulSet") pod.labels["apps.kubernetes.io/pod-index"] = std::to_string(i);
        pod.spec = o["spec"]["template"]["spec"];
        pod.index = i;
        pods.push_back(pod);
      }
    }
  }
  ASSERT_GE(pods.size(), 4u) << "cpu-smoke: a coordinator, a teacher and two students";
  const int outside = static_cast<int>(pods.size());
  if (!MakeHosts(outside + 1)) return;
  for (size_t p = 0; p < pods.size(); ++p) hosts_->AddName(pods[p].name, static_cast<int>(p));
  for (const auto& o : objects) {
    if (o["kind"] != "Service") continue;
    for (size_t p = 0; p < pods.size(); ++p) {
      bool selected = true;
      for (const auto& [key, value] : o["spec"]["selector"].items()) {
        selected = selected && pods[p].labels.value(key, "") == value.get<std::string>();
      }
      if (selected) {
        hosts_->AddName(o["metadata"]["name"], static_cast<int>(p));
        hosts_->AddName(pods[p].name + "." + o["metadata"]["name"].get<std::string>(),
                        static_cast<int>(p));
      }
    }
  }
  std::filesystem::create_directories(dir_.Join("secret-specstream-token"));
  testing::WriteFile(dir_.Join("secret-specstream-token/token"), std::string(kToken));
  testing::WriteFile(dir_.Join("secret-specstream-token/daemon-token"), std::string(kDaemonToken));

  const std::map<std::string, std::string> binaries = {
      {"specstream-coordinator", SPECSTREAM_COORDINATOR_PATH},
      {"specstream-teacher", SPECSTREAM_TEACHER_PATH},
      {"specstream-student", SPECSTREAM_STUDENT_PATH},
      {"specstream", SPECSTREAM_CLI_PATH},
      {"bash", "/bin/bash"}};
  std::vector<pid_t> running;
  for (size_t p = 0; p < pods.size(); ++p) {
    const Pod& pod = pods[p];
    // Volumes: claims are shared by name, emptyDirs are the pod's own.
    std::map<std::string, std::string> volume_dirs;
    for (const auto& v : pod.spec.value("volumes", nlohmann::json::array())) {
      std::string dir;
      if (v.contains("persistentVolumeClaim")) {
        dir = dir_.Join("pvc-" + v["persistentVolumeClaim"]["claimName"].get<std::string>());
      } else if (v.contains("emptyDir")) {
        dir = dir_.Join("pod-" + pod.name + "-" + v["name"].get<std::string>());
      } else if (v.contains("secret")) {
        dir = dir_.Join("secret-" + v["secret"]["secretName"].get<std::string>());
      } else {
        FAIL() << pod.name << ": volume " << v.dump() << " is of a kind this test cannot provide";
      }
      std::filesystem::create_directories(dir);
      volume_dirs[v["name"]] = dir;
    }
    auto run_container = [&](const nlohmann::json& c, bool wait) -> int {
      std::map<std::string, std::string> env;
      for (const auto& from : c.value("envFrom", nlohmann::json::array())) {
        for (const auto& [k, v] : config_maps[from["configMapRef"]["name"].get<std::string>()]) {
          env[k] = v;
        }
      }
      for (const auto& e : c.value("env", nlohmann::json::array())) {
        if (e.contains("value")) {
          env[e["name"]] = e["value"];
          continue;
        }
        const std::string field = e["valueFrom"]["fieldRef"]["fieldPath"];
        if (field == "metadata.name") {
          env[e["name"]] = pod.name;
        } else if (field == "status.podIP") {
          env[e["name"]] = hosts_->address(static_cast<int>(p));
        } else if (field == "metadata.labels['apps.kubernetes.io/pod-index']") {
          env[e["name"]] = std::to_string(pod.index);
        } else {
          ADD_FAILURE() << pod.name << ": env " << e.dump() << " is not provided by this test";
        }
      }
      auto expand = [&](std::string text) {
        for (size_t at = text.find("$("); at != std::string::npos; at = text.find("$(", at)) {
          const size_t end = text.find(')', at);
          const std::string name = text.substr(at + 2, end - at - 2);
          if (env.count(name) == 0) {
            at = end;
            continue;
          }
          text.replace(at, end - at + 1, env[name]);
        }
        return text;
      };
      std::vector<std::string> argv;
      for (const auto& a : c["command"]) argv.push_back(expand(a));
      for (const auto& a : c.value("args", nlohmann::json::array())) argv.push_back(expand(a));
      EXPECT_EQ(binaries.count(argv[0]), 1u) << pod.name << ": no binary for " << argv[0];
      argv[0] = binaries.at(argv[0]);
      std::vector<std::string> env_list;
      for (const auto& [k, v] : env) env_list.push_back(k + "=" + v);
      testing::TestHosts::SpawnOptions options;
      options.hostname = pod.name;
      for (const auto& m : c.value("volumeMounts", nlohmann::json::array())) {
        options.mounts.push_back(
            {volume_dirs[m["name"]], m["mountPath"], m.value("readOnly", false)});
      }
      const std::string log = dir_.Join(pod.name + "-" + c["name"].get<std::string>() + ".log");
      const pid_t pid = hosts_->Spawn(static_cast<int>(p), argv, env_list, log, options);
      if (!wait) {
        running.push_back(pid);
        return 0;
      }
      return hosts_->Wait(pid);
    };
    for (const auto& c : pod.spec.value("initContainers", nlohmann::json::array())) {
      ASSERT_EQ(run_container(c, true), 0) << pod.name << " init " << c["name"] << ": "
                                           << Log(pod.name + "-" + c["name"].get<std::string>());
    }
    for (const auto& c : pod.spec["containers"]) run_container(c, false);
  }

  // From outside: the overlay's job file, through the coordinator Service.
  const std::string address = "specstream-coordinator:7000";
  testing::WaitUntil(
      [&] {
        return Cli(outside, address, {"list", "--timeout", "2"}) == 0;
      },
      absl::Seconds(60), absl::Milliseconds(200));
  auto logs = [&] {
    std::string all;
    for (const Pod& pod : pods) {
      for (const auto& c : pod.spec["containers"]) {
        all += "--- " + pod.name + ":\n" + Log(pod.name + "-" + c["name"].get<std::string>());
      }
    }
    return all;
  };
  for (pid_t pid : running) ASSERT_EQ(hosts_->Poll(pid), -1) << "a container exited:\n" << logs();
  ASSERT_EQ(Cli(outside, address,
                {"submit", testing::SourceDir() + "/deploy/k8s/overlays/cpu-smoke/job.yaml", "--id",
                 "smoke-1"}),
            0)
      << Log("cli") << logs();
  ASSERT_EQ(Cli(outside, address, {"wait", "smoke-1", "--timeout", "300"}), 0)
      << Log("cli") << logs();
  ASSERT_EQ(Cli(outside, address, {"status", "smoke-1", "-o", "json"}), 0) << Log("cli");
  const auto job = nlohmann::json::parse(Log("cli"), nullptr, false);
  EXPECT_EQ(job["state"], "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(job["ranks"].size(), 2u) << job.dump();
  EXPECT_TRUE(
      std::filesystem::exists(dir_.Join("pvc-specstream-shared/exports/smoke/model.safetensors")))
      << logs();
}

}  // namespace
}  // namespace specstream
