// Jobs through the coordinator, as users run them: a `specstream-coordinator`,
// a `specstream-teacher serve --coordinator` and `specstream-student serve
// --coordinator` daemons on loopback, and the `specstream` CLI. Covers the
// lifecycle, auth, the CLI's exit codes, a coordinator killed and restarted
// mid-job, and a student daemon killed mid-job (restart from checkpoint).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/grpc_health.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

constexpr char kToken[] = "test-token-0123456789";          // users'
constexpr char kDaemonToken[] = "daemon-token-9876543210";  // daemons' (shared)

// GET http://127.0.0.1:port/path; the whole response ("" when unreachable).
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
  if (write(fd, request.data(), request.size()) < 0) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

std::string HealthCheck(int port) {
  return testing::HealthCheck("127.0.0.1:" + std::to_string(port));
}

// Opens `n` TCP connections to 127.0.0.1:port that send nothing (a
// slowloris); the caller closes them.
std::vector<int> IdleConnections(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      fds.push_back(fd);
    } else {
      close(fd);
    }
  }
  return fds;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFile(dir_.Join("token"), std::string(kToken) + "\n");
    testing::WriteFile(dir_.Join("daemon-token"), std::string(kDaemonToken) + "\n");
    testing::WriteFile(dir_.Join("daemon-tokens"), std::string("* ") + kDaemonToken + "\n");
    ASSERT_EQ(RunTool(SPECSTREAM_TEACHER_PATH,
                      "init-random --arch llama --layers 8 --hidden 32 --heads 4 --kv-heads 2 "
                      "--intermediate 64 --vocab 256 --dtype float32 --out " +
                          dir_.Join("target")),
              0);
    std::string data;
    for (int i = 0; i < 32; ++i) {
      std::string ids;
      for (int t = 0; t < 24 + i % 8; ++t) {
        ids += (t ? "," : "") + std::to_string((i * 31 + t * 17) % 256);
      }
      data += "{\"input_ids\":[" + ids + "]}\n";
    }
    testing::WriteFile(dir_.Join("data.jsonl"), data);
  }

  void TearDown() override {
    for (auto& [name, pid] : pids_) {
      if (pid > 0) kill(pid, SIGKILL);
    }
    for (auto& [name, pid] : pids_) {
      if (pid > 0) waitpid(pid, nullptr, 0);
    }
  }

  int RunTool(const std::string& binary, const std::string& args) {
    return testing::RunCommand(binary + " " + args, dir_.Join("tool.out"), dir_.Join("tool.out"));
  }

  // Starts `binary args` in the background with output in <name>.log.
  void Spawn(const std::string& name, const std::string& binary, const std::string& args) {
    const std::string log = dir_.Join(name + ".log");
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const std::string command = "exec " + binary + " " + args + " >>" + log + " 2>&1";
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids_[name] = pid;
  }

  // Kills the only teacher with `signal_number` mid-job (job `id`) and
  // starts it again on its port; the job must succeed with its ledger exact.
  void RestartSoleTeacherMidJob(int signal_number, const std::string& id);

  void Kill(const std::string& name, int signal_number) {
    const pid_t pid = pids_[name];
    ASSERT_GT(pid, 0) << name;
    kill(pid, signal_number);
    waitpid(pid, nullptr, 0);
    pids_[name] = 0;
  }

  std::string Log(const std::string& name) { return testing::ReadFile(dir_.Join(name + ".log")); }

  // Waits for a port file and returns its number.
  int WaitForPort(const std::string& file, const std::string& log_name) {
    const int port = testing::WaitForPortFile(file);
    if (port == 0) ADD_FAILURE() << "no port in " << file << ":\n" << Log(log_name);
    return port;
  }

  void StartCoordinator(int port = 0, const std::string& extra = "") {
    std::filesystem::remove(dir_.Join("coordinator.port"));
    Spawn("coordinator", SPECSTREAM_COORDINATOR_PATH,
          "--host 127.0.0.1 --port " + std::to_string(port) + " --port-file " +
              dir_.Join("coordinator.port") + " --db " + dir_.Join("jobs.db") + " --token-file " +
              dir_.Join("token") + " --daemon-token-file " + dir_.Join("daemon-tokens") +
              " --heartbeat-ms 200 --lost-after-s 3 --metrics-port 0 --metrics-port-file " +
              dir_.Join("coordinator.metrics") + " " + extra);
    coordinator_port_ = WaitForPort(dir_.Join("coordinator.port"), "coordinator");
    address_ = "127.0.0.1:" + std::to_string(coordinator_port_);
  }

  // Returns the teacher's port (`port`, or the one it picked for 0).
  int StartTeacher(const std::string& extra = "", int port = 0) {
    std::filesystem::remove(dir_.Join("teacher.port"));
    Spawn("teacher", SPECSTREAM_TEACHER_PATH,
          "serve --model " + dir_.Join("target") + " --devices cpu --port " + std::to_string(port) +
              " --keep-target-ids --port-file " + dir_.Join("teacher.port") + " --coordinator " +
              address_ + " --token-file " + dir_.Join("daemon-token") + " " + extra);
    return WaitForPort(dir_.Join("teacher.port"), "teacher");
  }

  void StartStudent(const std::string& name, const std::string& extra = "") {
    Spawn(name, SPECSTREAM_STUDENT_PATH,
          "serve --coordinator " + address_ + " --name " + name + " --port 0 --port-file " +
              dir_.Join(name + ".port") + " --metrics-port 0 --metrics-port-file " +
              dir_.Join(name + ".metrics") + " --workdir " + dir_.Join("work-" + name) +
              " --token-file " + dir_.Join("daemon-token") + " " + extra);
    WaitForPort(dir_.Join(name + ".port"), name);
  }

  // Runs the CLI against the coordinator; stdout and stderr are kept.
  int Cli(const std::string& args, bool with_token = true) {
    std::string env = "SPECSTREAM_ADDRESS=" + address_ + " ";
    env += with_token ? std::string("SPECSTREAM_TOKEN=") + kToken + " " : "SPECSTREAM_TOKEN= ";
    return testing::RunCommand(env + SPECSTREAM_CLI_PATH + " " + args + cli_extra_,
                               dir_.Join("cli.out"), dir_.Join("cli.err"));
  }
  std::string CliOut() { return testing::ReadFile(dir_.Join("cli.out")); }
  std::string CliErr() { return testing::ReadFile(dir_.Join("cli.err")); }

  nlohmann::json Status(const std::string& id) {
    EXPECT_EQ(Cli("status " + id + " -o json"), 0) << CliErr();
    return nlohmann::json::parse(CliOut(), nullptr, false);
  }

  // Polls until `predicate(status json)` holds or the timeout passes.
  bool WaitFor(const std::string& id, const std::function<bool(const nlohmann::json&)>& predicate,
               int seconds) {
    return testing::WaitUntil(
        [&] {
          if (Cli("status " + id + " -o json") != 0) return false;
          auto job = nlohmann::json::parse(CliOut(), nullptr, false);
          return !job.is_discarded() && predicate(job);
        },
        absl::Seconds(seconds), absl::Milliseconds(200));
  }

  static int64_t Step(const nlohmann::json& job) {
    if (!job.contains("metrics") || !job["metrics"].contains("step")) return 0;
    const auto& step = job["metrics"]["step"];
    return step.is_string() ? std::stoll(step.get<std::string>()) : step.get<int64_t>();
  }

  std::string OnlineJob(const std::string& name, int dp, int steps, int checkpoint_every,
                        const std::string& extra = "") {
    return "name: " + name + "\ndata:\n  tokenized: " + dir_.Join("data.jsonl") +
           "\nmodel:\n  target: " + dir_.Join("target") +
           "\n  draft:\n    draft_vocab_size: 64\n"
           "optimizer:\n  lr: 3.0e-3\n  warmup_steps: 2\n"
           "training:\n  max_steps: " +
           std::to_string(steps) +
           "\n  batch_size: 2\n  ttt_steps: 3\n  dtype: float32\n"
           "checkpoint:\n  dir: " +
           dir_.Join("ckpt-" + name) + "\n  every_steps: " + std::to_string(checkpoint_every) +
           "\nexport:\n  dir: " + dir_.Join("export-" + name) +
           "\nparallel:\n  dp_size: " + std::to_string(dp) + "\n" + extra;
  }

  testing::TempDir dir_;
  std::map<std::string, pid_t> pids_;
  int coordinator_port_ = 0;
  std::string address_;
  std::string cli_extra_;  // appended to every CLI command line
};

// Submit, follow to the end, then inspect the job with every read command;
// the daemons expose /metrics.
TEST_F(CoordinatorTest, JobEndToEndThroughTheCli) {
  StartCoordinator();
  StartTeacher("--metrics-port 0 --metrics-port-file " + dir_.Join("teacher.metrics"));
  StartStudent("s0");
  StartStudent("s1");
  testing::WriteFile(dir_.Join("job.yaml"), OnlineJob("e2e", 2, 8, 4));
  ASSERT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id e2e-1 --follow"), 0)
      << CliOut() << CliErr() << Log("coordinator") << Log("s0") << Log("s1");
  EXPECT_NE(CliOut().find("[rank 0]"), std::string::npos) << CliOut();
  EXPECT_NE(CliOut().find("step 8/8"), std::string::npos) << CliOut();

  nlohmann::json job = Status("e2e-1");
  EXPECT_EQ(job["state"], "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(Step(job), 8) << job.dump();
  EXPECT_EQ(job["ranks"].size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(dir_.Join("export-e2e/model.safetensors")));

  ASSERT_EQ(Cli("list"), 0) << CliErr();
  EXPECT_NE(CliOut().find("e2e-1"), std::string::npos) << CliOut();
  ASSERT_EQ(Cli("logs e2e-1"), 0) << CliErr();
  EXPECT_NE(CliOut().find("step 8/8"), std::string::npos) << CliOut();
  ASSERT_EQ(Cli("wait e2e-1"), 0) << CliErr();

  const int coordinator_metrics = std::stoi(testing::ReadFile(dir_.Join("coordinator.metrics")));
  const std::string scrape = HttpGet(coordinator_metrics, "/metrics");
  EXPECT_NE(scrape.find("specstream_coordinator_daemons{kind=\"student\",state=\"idle\"} 2"),
            std::string::npos)
      << scrape;
  // Every daemon answers the standard health check (Kubernetes grpc probes).
  EXPECT_EQ(HealthCheck(coordinator_port_), "SERVING");
  EXPECT_EQ(HealthCheck(std::stoi(testing::ReadFile(dir_.Join("teacher.port")))), "SERVING");
  EXPECT_EQ(HealthCheck(std::stoi(testing::ReadFile(dir_.Join("s0.port")))), "SERVING");
  // P24 item 3: server reflection takes the token each daemon's other calls
  // take (the user's at the coordinator, the daemon's own at a student
  // daemon, a running job's at a teacher); without it, UNAUTHENTICATED.
  auto target = [&](const std::string& port_file) {
    return "127.0.0.1:" + std::to_string(std::stoi(testing::ReadFile(dir_.Join(port_file))));
  };
  for (const std::string port_file : {"coordinator.port", "s0.port", "teacher.port"}) {
    for (const std::string token : {"", "wrong-token"}) {
      auto refused = testing::ReflectionServices(target(port_file), token);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated)
          << port_file << " " << token << ": " << refused.status();
    }
  }
  auto coordinator_services = testing::ReflectionServices(target("coordinator.port"), kToken);
  ASSERT_TRUE(coordinator_services.ok()) << coordinator_services.status();
  EXPECT_THAT(*coordinator_services, ::testing::Contains("specstream.v1.JobService"));
  auto student_services = testing::ReflectionServices(target("s0.port"), kDaemonToken);
  ASSERT_TRUE(student_services.ok()) << student_services.status();
  EXPECT_THAT(*student_services, ::testing::Contains("grpc.health.v1.Health"));
  // Each binds only its --host (127.0.0.1 here; the student daemon's is the
  // address toward the coordinator): another loopback address finds nothing.
  for (const std::string port_file : {"coordinator.port", "teacher.port", "s0.port"}) {
    const int port = std::stoi(testing::ReadFile(dir_.Join(port_file)));
    EXPECT_NE(testing::HealthCheck("127.0.0.2:" + std::to_string(port), absl::Seconds(1)),
              "SERVING")
        << port_file;
  }
  const int student_metrics = std::stoi(testing::ReadFile(dir_.Join("s0.metrics")));
  EXPECT_NE(HttpGet(student_metrics, "/metrics").find("specstream_student_daemon"),
            std::string::npos);
  // P13 item 5, against each daemon: with 8 idle connections open to its
  // metrics port, /healthz still answers within a second.
  const int teacher_metrics = testing::WaitForPortFile(dir_.Join("teacher.metrics"));
  for (const int metrics_port : {coordinator_metrics, teacher_metrics, student_metrics}) {
    const std::vector<int> idle = IdleConnections(metrics_port, 8);
    EXPECT_EQ(idle.size(), 8u);
    const absl::Time start = absl::Now();
    EXPECT_NE(HttpGet(metrics_port, "/healthz").find("200"), std::string::npos) << metrics_port;
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << metrics_port;
    for (int fd : idle) close(fd);
  }
}

// A DSpark draft as a coordinator job: the spec is validated at submit, two
// student daemons train it online from the registered teacher (which
// captures the draft's layers per stream), and the export is SGLang's.
TEST_F(CoordinatorTest, BlockDraftJobThroughTheCli) {
  StartCoordinator();
  StartTeacher();
  StartStudent("s0");
  StartStudent("s1");
  std::string job = OnlineJob("dspark", 2, 4, 2);
  auto replace = [&](const std::string& from, const std::string& to) {
    job.replace(job.find(from), from.size(), to);
  };
  replace("    draft_vocab_size: 64\n",
          "    type: dspark\n    block_size: 4\n    num_anchors: 4\n    mask_token_id: 255\n"
          "    markov_rank: 8\n");
  replace("  ttt_steps: 3\n", "");
  testing::WriteFile(dir_.Join("dspark.yaml"), job);
  // A block-draft field on an EAGLE-3 job is refused at submit, naming it.
  std::string bad = OnlineJob("bad", 2, 4, 2);
  bad.replace(bad.find("    draft_vocab_size: 64\n"), 0, "    block_size: 4\n");
  testing::WriteFile(dir_.Join("bad.yaml"), bad);
  EXPECT_NE(Cli("submit " + dir_.Join("bad.yaml")), 0);
  EXPECT_NE(CliErr().find("model.draft.block_size"), std::string::npos) << CliErr();

  ASSERT_EQ(Cli("submit " + dir_.Join("dspark.yaml") + " --id dspark-1 --follow"), 0)
      << CliOut() << CliErr() << Log("coordinator") << Log("s0") << Log("s1");
  EXPECT_NE(CliOut().find("step 4/4"), std::string::npos) << CliOut();
  EXPECT_NE(CliOut().find("dspark draft"), std::string::npos) << CliOut();
  nlohmann::json status = Status("dspark-1");
  EXPECT_EQ(status["state"], "JOB_STATE_SUCCEEDED") << status.dump();
  const auto config =
      nlohmann::json::parse(testing::ReadFile(dir_.Join("export-dspark/config.json")));
  EXPECT_EQ(config["architectures"][0], "Qwen3DSparkModel");
}

// Auth, bad input and every exit code of the job commands.
TEST_F(CoordinatorTest, AuthErrorsAndExitCodes) {
  StartCoordinator();
  testing::WriteFile(dir_.Join("job.yaml"), OnlineJob("codes", 4, 8, 4));

  EXPECT_EQ(Cli("list", /*with_token=*/false), 3);
  EXPECT_NE(CliErr().find("unauthenticated"), std::string::npos) << CliErr();
  {
    const std::string command = "SPECSTREAM_ADDRESS=" + address_ + " SPECSTREAM_TOKEN=wrong " +
                                SPECSTREAM_CLI_PATH + " list >/dev/null 2>" + dir_.Join("cli.err");
    const int status = std::system(command.c_str());
    EXPECT_EQ(WEXITSTATUS(status), 3) << CliErr();
  }
  // Roles (P13 item 7): a daemon credential is not a user's token, and a
  // user's token cannot register a daemon.
  {
    const std::string command = "SPECSTREAM_ADDRESS=" + address_ +
                                " SPECSTREAM_TOKEN=" + kDaemonToken + " " + SPECSTREAM_CLI_PATH +
                                " list >/dev/null 2>" + dir_.Join("cli.err");
    EXPECT_EQ(WEXITSTATUS(std::system(command.c_str())), 3) << CliErr();
  }
  Spawn("impostor", SPECSTREAM_STUDENT_PATH,
        "serve --coordinator " + address_ + " --name impostor --port 0 --workdir " +
            dir_.Join("work-impostor") + " --token-file " + dir_.Join("token"));
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        return testing::FileExists(dir_.Join("impostor.log")) &&
               Log("impostor").find("not a daemon credential") != std::string::npos;
      },
      absl::Seconds(30)))
      << Log("impostor");
  Kill("impostor", SIGTERM);

  testing::WriteFile(dir_.Join("bad.yaml"),
                     OnlineJob("bad", 1, 8, 4, "optimizer_typo:\n  lr: 1\n"));
  EXPECT_EQ(Cli("submit " + dir_.Join("bad.yaml")), 2);
  EXPECT_NE(CliErr().find("optimizer_typo"), std::string::npos) << CliErr();
  std::string negative = OnlineJob("neg", 1, 8, 4);
  negative.replace(negative.find("lr: 3.0e-3"), 10, "lr: -1");
  testing::WriteFile(dir_.Join("neg.yaml"), negative);
  EXPECT_EQ(Cli("submit " + dir_.Join("neg.yaml")), 2);
  EXPECT_NE(CliErr().find("optimizer.lr"), std::string::npos) << CliErr();
  EXPECT_EQ(Cli("submit " + dir_.Join("missing.yaml")), 2);
  EXPECT_EQ(Cli("frobnicate"), 2);

  EXPECT_EQ(Cli("status no-such-job"), 4);
  EXPECT_EQ(Cli("logs no-such-job"), 4);
  EXPECT_EQ(Cli("wait no-such-job"), 4);
  EXPECT_EQ(Cli("stop no-such-job"), 4);

  // No student daemons: the job queues, and a bounded wait times out.
  ASSERT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id codes-1"), 0) << CliErr();
  EXPECT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id codes-1"), 2);  // id taken
  EXPECT_NE(CliErr().find("already exists"), std::string::npos) << CliErr();
  nlohmann::json job = Status("codes-1");
  EXPECT_EQ(job["state"], "JOB_STATE_QUEUED");
  EXPECT_NE(job["reason"].get<std::string>().find("waiting for 4 free student daemons (0 free"),
            std::string::npos)
      << job.dump();
  EXPECT_EQ(Cli("wait codes-1 --timeout 1"), 124);
  ASSERT_EQ(Cli("stop codes-1"), 0) << CliErr();
  EXPECT_EQ(Status("codes-1")["state"], "JOB_STATE_STOPPED");
  EXPECT_EQ(Cli("wait codes-1"), 1);

  // Unreachable coordinator.
  Kill("coordinator", SIGKILL);
  EXPECT_EQ(Cli("list --timeout 2"), 3);
}

// A job that fails in its ranks ends FAILED with the rank's error, and a
// teacher under a coordinator refuses streams without a running job's token.
TEST_F(CoordinatorTest, FailingJobAndTeacherTokens) {
  StartCoordinator();
  StartTeacher();
  StartStudent("s0");
  // The ranks cannot read their data.
  std::string broken = OnlineJob("broken", 1, 8, 4);
  broken.replace(broken.find(dir_.Join("data.jsonl")), dir_.Join("data.jsonl").size(),
                 dir_.Join("nowhere.jsonl"));
  testing::WriteFile(dir_.Join("broken.yaml"), broken);
  EXPECT_EQ(Cli("submit " + dir_.Join("broken.yaml") + " --id broken-1 --wait"), 1)
      << CliOut() << CliErr();
  nlohmann::json job = Status("broken-1");
  EXPECT_EQ(job["state"], "JOB_STATE_FAILED");
  EXPECT_NE(job["reason"].get<std::string>().find("nowhere.jsonl"), std::string::npos)
      << job.dump();
  // The error line alone, not the log's tail (P13 item 12).
  EXPECT_EQ(job["reason"].get<std::string>().find('\n'), std::string::npos) << job.dump();
  EXPECT_EQ(job["reason"].get<std::string>().find("trainer: rank"), std::string::npos)
      << job.dump();

  // A rank started by hand, without a job token, is refused by the teacher.
  const int teacher_port = std::stoi(testing::ReadFile(dir_.Join("teacher.port")));
  std::string direct = OnlineJob("direct", 0, 4, 4);
  direct.replace(direct.find("  tokenized:"), 0,
                 "  teachers: [\"127.0.0.1:" + std::to_string(teacher_port) + "\"]\n");
  testing::WriteFile(dir_.Join("direct.yaml"), direct);
  EXPECT_NE(RunTool(SPECSTREAM_STUDENT_PATH, "train --config " + dir_.Join("direct.yaml")), 0);
  EXPECT_NE(testing::ReadFile(dir_.Join("tool.out")).find("token"), std::string::npos)
      << testing::ReadFile(dir_.Join("tool.out"));
}

// kill -9 the coordinator mid-job and start it again on the same database:
// the job, its state and its daemons come back, and it finishes.
TEST_F(CoordinatorTest, CoordinatorRestartedMidJob) {
  StartCoordinator();
  StartTeacher();
  StartStudent("s0");
  StartStudent("s1");
  testing::WriteFile(dir_.Join("job.yaml"), OnlineJob("restart", 2, 300, 10));
  ASSERT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id coord-1"), 0) << CliErr();
  // Early in the run, so that it is still running after the restart.
  ASSERT_TRUE(WaitFor(
      "coord-1",
      [](const nlohmann::json& job) {
        return job["state"] == "JOB_STATE_RUNNING" && Step(job) >= 2 && Step(job) < 100;
      },
      120))
      << Log("coordinator") << Log("s0");
  Kill("coordinator", SIGKILL);  // and reaped: its port is free again
  StartCoordinator(coordinator_port_);
  EXPECT_EQ(Status("coord-1")["state"], "JOB_STATE_RUNNING");
  ASSERT_EQ(Cli("wait coord-1 --timeout 300"), 0)
      << CliErr() << Log("coordinator") << Log("s0") << Log("s1");
  nlohmann::json job = Status("coord-1");
  EXPECT_EQ(job["state"], "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(job.value("attempt", 0), 0) << job.dump();  // no restart was needed
  EXPECT_EQ(Step(job), 300);
}

// kill -9 a student daemon mid-job (its rank dies with it): the job restarts
// from its latest checkpoint on the free daemon and finishes.
TEST_F(CoordinatorTest, StudentDaemonKilledMidJob) {
  StartCoordinator();
  StartTeacher();
  StartStudent("s0");
  StartStudent("s1");
  StartStudent("s2");
  testing::WriteFile(dir_.Join("job.yaml"), OnlineJob("lost", 2, 300, 5));
  ASSERT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id lost-1"), 0) << CliErr();
  ASSERT_TRUE(WaitFor(
      "lost-1",
      [](const nlohmann::json& job) {
        return job["state"] == "JOB_STATE_RUNNING" && Step(job) >= 10 && Step(job) < 150;
      },
      120))
      << Log("coordinator");
  nlohmann::json job = Status("lost-1");
  const std::string victim = job["ranks"][1]["daemon_id"];
  Kill(victim, SIGKILL);
  ASSERT_EQ(Cli("wait lost-1 --timeout 300"), 0)
      << CliErr() << Log("coordinator") << Log("s0") << Log("s1") << Log("s2");
  job = Status("lost-1");
  EXPECT_EQ(job["state"], "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(job.value("attempt", 0), 1) << job.dump();
  EXPECT_EQ(Step(job), 300);
  for (const auto& rank : job["ranks"]) EXPECT_NE(rank["daemon_id"], victim);
  ASSERT_EQ(Cli("logs lost-1"), 0);
  EXPECT_NE(CliOut().find("resume: continuing from step"), std::string::npos) << CliOut();
}

// P24 item 1: the job's only teacher is killed (kill -9) mid-job and serves
// again on its port a moment later. The student waits for it within
// data.teacher_grace_s (the restarted teacher refuses the job's token until
// the coordinator's heartbeat has told it, and that refusal too is waited
// out), the job succeeds without a restart, and the ledger lists every
// sample exactly once per epoch.
constexpr int kRestartSteps = 480;  // 30 epochs of 16 steps

void CoordinatorTest::RestartSoleTeacherMidJob(int signal_number, const std::string& id) {
  StartCoordinator();
  const int teacher_port = StartTeacher();
  StartStudent("s0");
  const std::string ledger = dir_.Join("ledger-" + id);
  // 32 samples, batch 2: 16 steps an epoch. 480 steps take several seconds
  // even on an idle machine, so the poll below (a CLI call every 200 ms, the
  // step as of the student's last heartbeat) finds the job between steps 10
  // and 400; at 160 steps a fast run could finish inside one heartbeat.
  std::string spec = OnlineJob("teacher-restart-" + id, 1, kRestartSteps, 1000);
  spec.replace(spec.find("data:\n") + 6, 0, "  ledger_dir: " + ledger + "\n");
  testing::WriteFile(dir_.Join("job.yaml"), spec);
  ASSERT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id " + id), 0) << CliErr();
  ASSERT_TRUE(WaitFor(
      id,
      [](const nlohmann::json& job) {
        return job["state"] == "JOB_STATE_RUNNING" && Step(job) >= 10 && Step(job) < 400;
      },
      120))
      << Log("coordinator");
  Kill("teacher", signal_number);
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_EQ(StartTeacher("", teacher_port), teacher_port) << Log("teacher");
  ASSERT_EQ(Cli("wait " + id + " --timeout 300"), 0)
      << CliErr() << Log("coordinator") << Log("teacher") << Log("s0");
  nlohmann::json job = Status(id);
  EXPECT_EQ(job["state"], "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(job.value("attempt", 0), 0) << job.dump();  // waited for, not restarted
  EXPECT_EQ(Step(job), kRestartSteps);
  ASSERT_EQ(Cli("logs " + id), 0);
  EXPECT_NE(CliOut().find("is back"), std::string::npos) << CliOut();

  // Every sample once per epoch: each run of 16 steps trains all 32.
  std::map<int, std::map<int64_t, int>> by_epoch;  // epoch -> sample -> count
  int steps = 0;
  const std::string lines = testing::ReadFile(ledger + "/ledger-rank0.jsonl");
  for (absl::string_view line : absl::StrSplit(lines, '\n', absl::SkipEmpty())) {
    const nlohmann::json record = nlohmann::json::parse(line);
    for (int64_t id : record["sample_ids"]) ++by_epoch[steps / 16][id];
    ++steps;
  }
  EXPECT_EQ(steps, kRestartSteps);
  EXPECT_EQ(by_epoch.size(), static_cast<size_t>(kRestartSteps / 16));
  for (const auto& [epoch, counts] : by_epoch) {
    EXPECT_EQ(counts.size(), 32u) << "epoch " << epoch;
    for (const auto& [id, count] : counts) {
      EXPECT_EQ(count, 1) << "epoch " << epoch << ", sample " << id;
    }
  }
}

TEST_F(CoordinatorTest, SoleTeacherKilledAndRestartedMidJobSucceeds) {
  RestartSoleTeacherMidJob(SIGKILL, "tr-kill");
}

// The same with SIGTERM: the teacher drains (its streams end UNAVAILABLE)
// and exits, and the student waits for it as for a killed one.
TEST_F(CoordinatorTest, SoleTeacherStoppedAndRestartedMidJobSucceeds) {
  RestartSoleTeacherMidJob(SIGTERM, "tr-term");
}

// kill -9 the rank process itself (what the OOM killer does) while its
// daemon lives on: the job restarts from its checkpoint under max_restarts
// rather than failing (P13 item 9), and the daemon reclaims what the rank
// left.
TEST_F(CoordinatorTest, RankProcessKilledMidJobRestarts) {
  StartCoordinator();
  StartTeacher();
  StartStudent("s0");
  testing::WriteFile(dir_.Join("job.yaml"), OnlineJob("oom", 1, 300, 5));
  ASSERT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id oom-1"), 0) << CliErr();
  ASSERT_TRUE(WaitFor(
      "oom-1",
      [](const nlohmann::json& job) {
        return job["state"] == "JOB_STATE_RUNNING" && Step(job) >= 10 && Step(job) < 150;
      },
      120))
      << Log("coordinator");
  // The rank: the daemon's child running `train --config <workdir>/...`.
  const std::string find =
      "pgrep -f -- 'train --config " + dir_.Join("work-s0") + "' > " + dir_.Join("rank.pid");
  ASSERT_EQ(std::system(find.c_str()), 0) << Log("s0");
  const pid_t rank = std::stoi(testing::ReadFile(dir_.Join("rank.pid")));
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  ASSERT_EQ(Cli("wait oom-1 --timeout 300"), 0) << CliErr() << Log("coordinator") << Log("s0");
  nlohmann::json job = Status("oom-1");
  EXPECT_EQ(job["state"], "JOB_STATE_SUCCEEDED") << job.dump();
  EXPECT_EQ(job.value("attempt", 0), 1) << job.dump();
  EXPECT_EQ(Step(job), 300);
  ASSERT_EQ(Cli("logs oom-1"), 0);
  EXPECT_NE(CliOut().find("exited with code 137"), std::string::npos) << CliOut();
  EXPECT_NE(CliOut().find("resume: continuing from step"), std::string::npos) << CliOut();
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(entry.path().filename().string().rfind("specstream-" + std::to_string(rank) + "-", 0),
              0u)
        << entry.path();
  }
}

// The coordinator serving TLS only: the CLI and the daemons verify it with
// --tls-ca, and a job runs; a client without the CA cannot connect.
TEST_F(CoordinatorTest, TlsCoordinator) {
  if (!testing::HaveOpenssl()) GTEST_SKIP() << "openssl CLI not found";
  const std::string error = testing::MakeTestCertificates(dir_.path());
  ASSERT_EQ(error, "") << error;
  StartCoordinator(
      0, "--tls-cert " + dir_.Join("server.pem") + " --tls-key " + dir_.Join("server.key"));
  const std::string ca = " --tls-ca " + dir_.Join("ca.pem");
  StartTeacher(ca);
  StartStudent("s0", ca);
  EXPECT_EQ(Cli("list --timeout 3"), 3);  // plaintext against TLS
  cli_extra_ = ca;
  ASSERT_EQ(Cli("list"), 0) << CliErr();
  testing::WriteFile(dir_.Join("job.yaml"), OnlineJob("tls", 1, 4, 4));
  ASSERT_EQ(Cli("submit " + dir_.Join("job.yaml") + " --id tls-1 --wait"), 0)
      << CliOut() << CliErr() << Log("coordinator") << Log("s0");
  EXPECT_EQ(Step(Status("tls-1")), 4);
}

// Each daemon's --check-config checks its flags' values (not the machine:
// a teacher on two GPUs checks here, where there are none; no model is
// read) and names the flag it refuses, starting nothing.
TEST_F(CoordinatorTest, DaemonsCheckTheirConfigWithoutStarting) {
  const std::string out = dir_.Join("tool.out");
  const std::string teacher = "serve --model " + dir_.Join("no-model") + " --port 0 ";
  ASSERT_EQ(
      RunTool(SPECSTREAM_TEACHER_PATH,
              teacher + "--devices cuda:0,cuda:1 --tp 2 --coordinator c:50051 --check-config"),
      0)
      << testing::ReadFile(out);
  EXPECT_NE(testing::ReadFile(out).find("configuration OK: runtime hf, 2 TP rank(s) on "
                                        "cuda:0,cuda:1"),
            std::string::npos)
      << testing::ReadFile(out);
  const std::vector<std::pair<std::string, std::string>> bad_teachers = {
      {"--devices gpu0", "unknown device \"gpu0\""},
      {"--devices cpu,cpu --ep 3", "--ep 3 does not divide the tensor-parallel size 2"},
      {"--runtime vllm", "--runtime \"vllm\""},
      {"--payload-dtype float64", "--payload-dtype"},
      {"--coordinator no-port", "--coordinator"},
      {"--batch-tokens 0", "--batch-tokens"},
      {"--max-queued-mib 0", "--max-queued-mib: 0 not in [1, 1048576]"},
      {"--max-queued-mib-per-stream 0", "--max-queued-mib-per-stream: 0 not in [1, 1048576]"},
      {"--max-streams 0", "--max-streams: 0 must be >= 1"},
      {"--max-streams-per-peer -1", "--max-streams-per-peer: -1 must be >= 1"},
  };
  for (const auto& [flags, reason] : bad_teachers) {
    EXPECT_EQ(RunTool(SPECSTREAM_TEACHER_PATH, teacher + flags + " --check-config"), 2) << flags;
    EXPECT_NE(testing::ReadFile(out).find(reason), std::string::npos)
        << flags << ": " << testing::ReadFile(out);
  }

  const std::string student = "serve --coordinator c:50051 --port 0 --workdir " + dir_.Join("w");
  ASSERT_EQ(RunTool(SPECSTREAM_STUDENT_PATH, student + " --devices cuda:0 --check-config"), 0)
      << testing::ReadFile(out);
  EXPECT_NE(testing::ReadFile(out).find("devices cuda:0"), std::string::npos);
  EXPECT_EQ(RunTool(SPECSTREAM_STUDENT_PATH, student + " --devices gpu --check-config"), 2);
  EXPECT_NE(testing::ReadFile(out).find("--devices: unknown device \"gpu\""), std::string::npos)
      << testing::ReadFile(out);
  EXPECT_EQ(RunTool(SPECSTREAM_STUDENT_PATH, student + " --metrics-port 70000 --check-config"), 2);
  EXPECT_NE(testing::ReadFile(out).find("--metrics-port 70000"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("w")));  // nothing started

  const std::string coordinator = "--port 0 --db " + dir_.Join("c.db") + " --token-file " +
                                  dir_.Join("token") + " --daemon-token-file " +
                                  dir_.Join("daemon-tokens");
  ASSERT_EQ(RunTool(SPECSTREAM_COORDINATOR_PATH, coordinator + " --check-config"), 0)
      << testing::ReadFile(out);
  // Users and daemons hold different credentials; no auth is said aloud.
  EXPECT_EQ(
      RunTool(SPECSTREAM_COORDINATOR_PATH, "--port 0 --db " + dir_.Join("c.db") + " --token-file " +
                                               dir_.Join("token") + " --check-config"),
      2);
  EXPECT_NE(testing::ReadFile(out).find("--daemon-token-file: required"), std::string::npos)
      << testing::ReadFile(out);
  EXPECT_EQ(RunTool(SPECSTREAM_COORDINATOR_PATH,
                    "--port 0 --db " + dir_.Join("c.db") + " --insecure-no-auth --check-config"),
            0)
      << testing::ReadFile(out);
  EXPECT_NE(testing::ReadFile(out).find("auth OFF"), std::string::npos);
  EXPECT_EQ(RunTool(SPECSTREAM_COORDINATOR_PATH,
                    coordinator + " --heartbeat-ms 2000 --lost-after-s 1 --check-config"),
            2);
  EXPECT_NE(testing::ReadFile(out).find("--lost-after-s"), std::string::npos);
  EXPECT_EQ(RunTool(SPECSTREAM_COORDINATOR_PATH,
                    coordinator + " --tls-cert " + dir_.Join("x.pem") + " --check-config"),
            2);
  EXPECT_NE(testing::ReadFile(out).find("--tls-cert and --tls-key"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("c.db")));
}

}  // namespace
}  // namespace specstream
