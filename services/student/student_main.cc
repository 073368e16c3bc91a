// `specstream-student`: the draft trainer.
//   train   --config job.yaml [--resume] [--nproc N] [--host ADDR]
//           (torchrun-style env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
//           this rank's own address: --host, SPECSTREAM_HOST,
//           GLOO_SOCKET_IFNAME, else the one that routes to MASTER_ADDR)
//   export  --checkpoint DIR --out DIR                 (SGLang / vLLM layout)
//   eval    --checkpoint DIR --data STORE [--target DIR] (one JSON line; DIR
//           a checkpoint or an exported draft, which needs --target)
//   serve   --coordinator HOST:PORT [...]              (a student daemon: runs
//           the ranks the coordinator assigns until SIGTERM/SIGINT)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/exit_code.h"
#include "common/grpc/auth.h"
#include "common/host.h"
#include "common/jobspec/job_spec.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/openmp_wait.h"
#include "common/shutdown_signal.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "common/torch/process_group.h"
#include "common/torch/threads.h"
#include "services/daemon/student_daemon.h"
#include "services/student/grpc_teacher_connection.h"
#include "student/student_commands.h"
#include "student/trainer.h"

namespace {

using namespace specstream;           // NOLINT(build/namespaces): a main file
using namespace specstream::student;  // NOLINT(build/namespaces)
using namespace specstream::jobspec;  // NOLINT(build/namespaces)

int ExitCode(const absl::Status& status) { return ReportExit("specstream-student", status); }

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  int parsed = 0;
  return value != nullptr && absl::SimpleAtoi(value, &parsed) ? parsed : fallback;
}

// --nproc N: start N local ranks of this command (without --nproc), wait for
// all; the first failure stops the others.
int LaunchLocalRanks(int nproc, int argc, char** argv) {
  int port = 0;
  RendezvousOptions probe;
  // Find a free port by binding a store briefly; rank 0 will re-bind it.
  {
    auto store = CreateTcpStore(probe, &port);
    if (!store.ok()) return ExitCode(store.status());
  }
  absl::StatusOr<std::string> self = SelfExecutable();
  if (!self.ok()) return ExitCode(self.status());
  SubprocessOptions rank_process;
  rank_process.argv.push_back(*self);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    rank_process.argv.push_back(a);
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nproc; ++rank) {
    rank_process.env = {absl::StrCat("RANK=", rank),
                        absl::StrCat("LOCAL_RANK=", rank),
                        absl::StrCat("WORLD_SIZE=", nproc),
                        absl::StrCat("LOCAL_WORLD_SIZE=", nproc),
                        "MASTER_ADDR=127.0.0.1",
                        absl::StrCat("MASTER_PORT=", port)};
    absl::StatusOr<SpawnedProcess> child = Spawn(rank_process);
    if (!child.ok()) {
      std::cerr << "specstream-student: cannot start rank " << rank << ": "
                << child.status().message() << "\n";
      for (pid_t p : pids) kill(p, SIGTERM);
      return 1;
    }
    pids.push_back(child->pid);
  }
  int exit_code = 0;
  for (size_t remaining = pids.size(); remaining > 0; --remaining) {
    int status = 0;
    pid_t done = wait(&status);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code != 0 && exit_code == 0) {
      exit_code = code;
      std::cerr << "specstream-student: a rank (pid " << done << ") failed; stopping the others\n";
      for (pid_t p : pids) {
        if (p != done) kill(p, SIGTERM);
      }
    }
  }
  return exit_code;
}

std::string EnvString(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// How a rank reaches its teachers: the token it presents (a standalone
// teacher's, or the job token a student daemon sets in
// $SPECSTREAM_JOB_TOKEN) and TLS.
struct TeacherAccessFlags {
  std::string token_file;
  TlsClientFiles tls;
};

absl::Status Train(const std::string& config_path, bool resume, const std::string& host,
                   const std::string& device, int progress, const TeacherAccessFlags& teachers) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, LoadJobSpec(config_path));
  ASSIGN_OR_RETURN(TrainerConfig config,
                   TrainerConfigFromJobSpec(spec, device, EnvInt("LOCAL_RANK", 0)));
  config.resume = resume;
  config.progress_terminal = progress;
  // The job token a student daemon sets for a coordinator job admits its
  // streams at the teachers; --teacher-token-file names a standalone
  // teacher's token instead.
  if (!teachers.token_file.empty()) {
    ASSIGN_OR_RETURN(config.job_token, LoadToken(teachers.token_file));
  } else if (const char* token = std::getenv("SPECSTREAM_JOB_TOKEN"); token != nullptr) {
    config.job_token = token;
  }
  services::GrpcTeacherConnectorOptions connector;
  connector.token = config.job_token;
  connector.tls = teachers.tls;
  ASSIGN_OR_RETURN(config.teacher_connector,
                   services::GrpcTeacherConnector::Create(std::move(connector)));
  const int rank = EnvInt("RANK", 0);
  const int world = EnvInt("WORLD_SIZE", 1);
  SetLogRank(rank);
  const int64_t dp = spec.parallel().dp_size();
  if (dp > 0 && dp * spec.parallel().cp_size() != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.dp_size: ", dp, " x cp_size ", spec.parallel().cp_size(), " = ",
                     dp * spec.parallel().cp_size(), " ranks, but the world has ", world));
  }
  // An impossible layout fails here, before any rank waits for the others.
  RETURN_IF_ERROR(ValidateCpLayout(CpLayout{world, static_cast<int>(config.cp_size),
                                            static_cast<int>(config.ulysses_degree), rank},
                                   0, 0));
  c10::intrusive_ptr<CommGroup> group;
  ProcessGroupHandle handle;
  if (world > 1) {
    RendezvousOptions rendezvous;
    rendezvous.rank = rank;
    rendezvous.world_size = world;
    rendezvous.master_addr = EnvString("MASTER_ADDR");
    if (rendezvous.master_addr.empty()) rendezvous.master_addr = "127.0.0.1";
    rendezvous.master_port = EnvInt("MASTER_PORT", 29500);
    rendezvous.local_addr = host.empty() ? EnvString("SPECSTREAM_HOST") : host;
    rendezvous.interface = EnvString("GLOO_SOCKET_IFNAME");
    rendezvous.join_timeout = config.rendezvous_timeout;
    ASSIGN_OR_RETURN(config.local_address, ResolveLocalAddress(rendezvous));
    rendezvous.local_addr = config.local_address;
    SS_LOG_INFO("rendezvous: rank {}/{} binds {} and joins {}:{} (deadline {} s), trains on {}",
                rank, world, config.local_address, rendezvous.master_addr, rendezvous.master_port,
                rendezvous.join_timeout.count() / 1000.0, config.device.str());
    ASSIGN_OR_RETURN(handle, CreateGlooGroup(rendezvous));
    group = handle.group;
  }
  ASSIGN_OR_RETURN(auto trainer, Trainer::Create(config, rank, world, group, handle.store));
  return trainer->Run();
}

struct ServeFlags {
  services::StudentDaemonOptions daemon;
  std::string token_file;
};

// What a student daemon's flags say that can be checked away from its
// machine: the coordinator's address, ports, the work directory, the
// devices' names (not that the machine has them). RunServe runs it first;
// `serve --check-config` runs only it (the Kubernetes manifest checks run
// each overlay's flags through it). Returns a one-line summary.
absl::StatusOr<std::string> CheckServeConfig(const ServeFlags& flags) {
  const services::StudentDaemonOptions& d = flags.daemon;
  RETURN_IF_ERROR(SplitHostPort(d.coordinator, "--coordinator").status());
  RETURN_IF_ERROR(CheckListenPorts(d.port, d.metrics_port));
  if (d.workdir.empty()) return absl::InvalidArgumentError("--workdir: must not be empty");
  if (d.stop_grace_seconds < 0) {
    return absl::InvalidArgumentError("--stop-grace: must be >= 0 seconds");
  }
  for (const std::string& device : d.devices) {
    if (device == "auto" || !IsTrainingDevice(device)) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: unknown device \"", device,
                                                     "\" (expected cpu, cuda or cuda:N)"));
    }
  }
  return absl::StrCat("coordinator ", d.coordinator, ", devices ",
                      d.devices.empty() ? "(training.device)" : absl::StrJoin(d.devices, ","),
                      ", workdir ", d.workdir);
}

absl::Status RunServe(ServeFlags flags) {
  RETURN_IF_ERROR(CheckServeConfig(flags).status());
  ASSIGN_OR_RETURN(flags.daemon.token, LoadToken(flags.token_file));
  ASSIGN_OR_RETURN(auto daemon, services::StudentDaemon::Create(std::move(flags.daemon)));
  std::cout << "listening on " << daemon->address() << std::endl;
  // SIGTERM/SIGINT ask the daemon to stop its ranks and return.
  RETURN_IF_ERROR(InstallShutdownSignals());
  std::thread waiter([&daemon] {
    WaitForShutdownSignal();
    daemon->Shutdown();
  });
  absl::Status status = daemon->Run();
  WakeShutdownWaiter();  // Run may end without a signal (an error)
  waiter.join();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread: may re-execute this binary (common/openmp_wait.h).
  specstream::PreferPassiveOpenMpWait(argv);
  CLI::App app{
      "SpecStream student: trains draft models (eagle3, EAGLE 3.1 flags, peagle, dflash, dspark)"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");

  std::string config_path;
  bool resume = false;
  int nproc = 0;
  std::string train_host, train_device;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a draft from a job YAML");
  train_cmd->add_option("--config", config_path, "Job YAML (docs/job-config.md)")->required();
  train_cmd->add_flag("--resume", resume, "Continue from the latest checkpoint");
  train_cmd->add_option("--nproc", nproc, "Start this many local ranks (DDP over Gloo)");
  train_cmd->add_option("--host", train_host,
                        "This rank's own address for its process groups (default: "
                        "$SPECSTREAM_HOST, the address of $GLOO_SOCKET_IFNAME, else the local "
                        "address that routes to MASTER_ADDR)");
  TeacherAccessFlags teacher_access;
  train_cmd->add_option("--teacher-token-file", teacher_access.token_file,
                        "Token a standalone teacher (serve --token-file) requires (default: "
                        "$SPECSTREAM_JOB_TOKEN, which a student daemon sets)");
  train_cmd->add_option("--teacher-tls-ca", teacher_access.tls.ca,
                        "PEM roots to verify teachers that serve TLS");
  train_cmd->add_option("--teacher-tls-cert", teacher_access.tls.cert,
                        "Client certificate for teachers that require one (mTLS)");
  train_cmd->add_option("--teacher-tls-key", teacher_access.tls.key, "Key for --teacher-tls-cert");
  train_cmd->add_option("--device", train_device,
                        "Where this rank trains: cpu, cuda (cuda:LOCAL_RANK) or cuda:N; overrides "
                        "training.device (default auto: cuda:LOCAL_RANK when CUDA is present)");

  std::string export_checkpoint, export_out;
  CLI::App* export_cmd = app.add_subcommand("export", "Write the SGLang/vLLM draft layout");
  export_cmd
      ->add_option("--checkpoint", export_checkpoint, "Checkpoint root (latest) or step directory")
      ->required();
  export_cmd->add_option("--out", export_out, "Output directory")->required();

  std::string eval_checkpoint, eval_data, eval_target;
  int eval_ttt = 0;
  int64_t eval_max_length = 0;
  CLI::App* eval_cmd = app.add_subcommand("eval", "Loss, acc_k and acceptance length on a store");
  eval_cmd
      ->add_option("--checkpoint", eval_checkpoint,
                   "Checkpoint root (newest good step), step directory or exported draft")
      ->required();
  eval_cmd->add_option("--data", eval_data, "Offline store")->required();
  eval_cmd->add_option("--target", eval_target,
                       "Target model directory (required for an exported draft; overrides a "
                       "checkpoint's)");
  eval_cmd->add_option("--ttt-steps", eval_ttt, "TTT steps (default: the training run's)");
  eval_cmd->add_option("--max-length", eval_max_length, "Truncate samples (0: off)");

  ServeFlags serve;
  services::StudentDaemonOptions& daemon = serve.daemon;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve", "Run a student daemon: the coordinator's ranks, until SIGTERM/SIGINT (exit 0)");
  serve_cmd->add_option("--coordinator", daemon.coordinator, "Coordinator address (host:port)")
      ->required();
  serve_cmd->add_option("--name", daemon.name, "Daemon name (default: <hostname>-<pid>)");
  serve_cmd->add_option(
      "--host", daemon.host,
      "Address peers reach this host at; its ranks bind it (default: the local address "
      "that routes to the coordinator)");
  serve_cmd->add_option("--port", daemon.port, "gRPC health port (0: any free port)");
  serve_cmd->add_option("--port-file", daemon.port_file, "Write the bound gRPC port here");
  serve_cmd->add_option("--metrics-port", daemon.metrics_port,
                        "Prometheus /metrics port (-1: off, 0: any free port)");
  serve_cmd->add_option("--metrics-port-file", daemon.metrics_port_file,
                        "Write the bound metrics port here");
  serve_cmd->add_option("--workdir", daemon.workdir,
                        "Per-rank directories (job.json, metrics.jsonl)");
  serve_cmd
      ->add_option("--devices", daemon.devices,
                   "This daemon's devices (comma-separated): reported to the coordinator; its "
                   "rank trains on the first (train --device)")
      ->delimiter(',');
  serve_cmd->add_option("--stop-grace", daemon.stop_grace_seconds,
                        "Seconds between SIGTERM and SIGKILL when a rank is stopped");
  serve_cmd->add_option("--token-file", serve.token_file,
                        "This daemon's credential at the coordinator (default: $SPECSTREAM_TOKEN)");
  serve_cmd->add_option("--tls-ca", daemon.tls.ca, "PEM roots to verify the coordinator (TLS)");
  serve_cmd->add_option("--tls-cert", daemon.tls.cert, "Client certificate (mutual TLS)");
  serve_cmd->add_option("--tls-key", daemon.tls.key, "Client key (mutual TLS)");
  serve_cmd->add_option("--teacher-tls-ca", daemon.teacher_tls.ca,
                        "Its ranks verify TLS teachers against these PEM roots");
  serve_cmd->add_option("--teacher-tls-cert", daemon.teacher_tls.cert,
                        "Its ranks' client certificate for teachers that require one");
  serve_cmd->add_option("--teacher-tls-key", daemon.teacher_tls.key, "Key for --teacher-tls-cert");
  bool check_config = false;
  serve_cmd->add_flag("--check-config", check_config,
                      "Check the flags (addresses, ports, devices' names; not the machine), "
                      "print OK and exit");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (*train_cmd && nproc > 1) return LaunchLocalRanks(nproc, argc, argv);

  LoggingOptions logging;
  logging.role = *serve_cmd ? "student-daemon" : "student";
  logging.level = log_level;
  logging.rank = EnvInt("RANK", -1);
  if (!InitLogging(logging)) {
    std::cerr << "specstream-student: unknown --log-level \"" << log_level << "\"\n";
    return 2;
  }
  SS_LOG_DEBUG("compute threads: {}", ConfigureComputeThreads());
  if (*serve_cmd && check_config) {
    absl::StatusOr<std::string> summary = CheckServeConfig(serve);
    if (!summary.ok()) return ExitCode(summary.status());
    std::cout << "specstream-student serve: configuration OK: " << *summary << "\n";
    return 0;
  }
  if (*serve_cmd) return ExitCode(RunServe(std::move(serve)));
  if (*train_cmd) {
    return ExitCode(Train(config_path, resume, train_host, train_device, -1, teacher_access));
  }
  if (*export_cmd) return ExitCode(ExportCheckpoint(export_checkpoint, export_out));
  if (*eval_cmd) {
    auto result =
        EvaluateCheckpoint(eval_checkpoint, eval_data, eval_ttt, eval_max_length, eval_target);
    if (!result.ok()) return ExitCode(result.status());
    std::cout << *result << "\n";
    return 0;
  }
  return 2;
}
