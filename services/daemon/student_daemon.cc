#include "services/daemon/student_daemon.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "common/grpc/reflection.h"
#include "common/grpc/server_defaults.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/net_address.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "nlohmann/json.hpp"
#include "services/daemon/rank_process.h"
#include "services/daemon/registration.h"
#include "specstream/v1/coordinator.pb.h"

namespace specstream::services {
namespace {

constexpr absl::Duration kLoopTick = absl::Milliseconds(100);
// How long a shutdown waits for the coordinator to hear that the daemon is
// draining before it stops its ranks anyway.
constexpr absl::Duration kDrainTimeout = absl::Seconds(5);
// Beyond the stop grace, how long Shutdown waits for SIGKILLed children.
constexpr absl::Duration kKillSlack = absl::Seconds(3);
// How often shutdown looks for exited ranks.
constexpr absl::Duration kExitPoll = absl::Milliseconds(50);

std::string RankKey(absl::string_view job_id, int attempt, int rank) {
  return absl::StrCat(job_id, "/", attempt, "/", rank);
}

// Job ids come from users; keep them one harmless path component.
std::string PathComponent(absl::string_view id) {
  std::string out;
  for (char c : id) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.';
    out.push_back(safe ? c : '_');
  }
  if (out.empty() || out == "." || out == "..") out = absl::StrCat("job_", out);
  return out;
}

// A port free right now (the rendezvous store of rank 0 binds it moments
// later; a race with another process is possible but rare).
absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("picking a rendezvous port: ", std::strerror(error)));
  }
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

std::string DefaultName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::strncpy(host, "student", sizeof(host) - 1);
  }
  return absl::StrCat(host, "-", getpid());
}

// One rank this daemon runs or ran, until a heartbeat reply acknowledges its
// exit.
struct RankEntry {
  v1::RankAssignment assignment;
  std::string key;
  int master_port = 0;   // rank 0: the rendezvous port reported
  bool started = false;  // Run() tried to start it (process set or failed)
  std::unique_ptr<RankProcess> process;
  // Set when it never ran: the start failed, or a stop came first.
  std::optional<int> failed_code;
  std::string failed_reason;
  bool stop_before_start = false;
  std::vector<v1::LogLine> daemon_logs;  // "daemon" lines not yet sent
  bool exit_logged = false;              // logged and counted in the metrics
  bool exit_reported = false;            // a heartbeat carried the exit

  std::optional<int> ExitCode() const {
    if (failed_code.has_value()) return failed_code;
    if (process != nullptr) return process->ExitCode();
    return std::nullopt;
  }

  void DaemonLog(std::string text) {
    v1::LogLine line;
    line.set_rank(assignment.rank());
    line.set_stream("daemon");
    line.set_text(std::move(text));
    daemon_logs.push_back(std::move(line));
  }
};

}  // namespace

struct StudentDaemon::Impl {
  StudentDaemonOptions options;
  v1::DaemonInfo info;
  std::string address;  // host:port
  int port = 0;
  // The server's one service of its own beside health: reflection, with the
  // daemon's token. Outlives `server`.
  std::unique_ptr<ReflectionService> reflection;
  std::unique_ptr<grpc::Server> server;
  MetricsRegistry metrics;
  std::unique_ptr<MetricsHttpServer> metrics_server;

  // Shutdown() may run in a signal handler: a lock-free store only.
  std::atomic<bool> shutdown_requested{false};
  static_assert(std::atomic<bool>::is_always_lock_free);
  std::atomic<bool> run_called{false};

  absl::Mutex mu;
  // Ordered so heartbeats list ranks in a stable order.
  std::map<std::string, std::unique_ptr<RankEntry>> entries ABSL_GUARDED_BY(mu);
  // Every key ever accepted: a stale reply repeating a finished start must
  // not run it twice.
  absl::flat_hash_set<std::string> seen ABSL_GUARDED_BY(mu);
  std::deque<std::string> pending_starts ABSL_GUARDED_BY(mu);

  // Run()'s thread only (and the destructor after it).
  std::unique_ptr<Registration> registration;

  // Logs and counts an exit once (whichever of Tick and a heartbeat sees it
  // first); true the first time.
  bool NoteExit(RankEntry& entry, int code) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (entry.exit_logged) return false;
    entry.exit_logged = true;
    const v1::RankAssignment& a = entry.assignment;
    if (code == 0) {
      SS_LOG_INFO("job {} attempt {} rank {} exited 0", a.job_id(), a.attempt(), a.rank());
    } else {
      SS_LOG_WARN("job {} attempt {} rank {} exited {}", a.job_id(), a.attempt(), a.rank(), code);
    }
    entry.DaemonLog(absl::StrCat("exited with code ", code));
    metrics.AddCounter("specstream_student_daemon_rank_exits_total",
                       "Rank processes that exited, by exit code", {{"code", absl::StrCat(code)}},
                       1);
    return true;
  }

  // ---- registration callbacks (the registration thread) ----

  v1::RankStatus StatusOf(RankEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    v1::RankStatus status;
    status.set_job_id(entry.assignment.job_id());
    status.set_attempt(entry.assignment.attempt());
    status.set_rank(entry.assignment.rank());
    if (entry.assignment.rank() == 0) status.set_master_port(entry.master_port);
    if (const std::optional<int> code = entry.ExitCode()) {
      status.set_exited(true);
      status.set_exit_code(*code);
      if (*code != 0) {
        // The error line, not the tail of the log (whose first line is
        // the trainer's banner).
        std::string reason =
            entry.process != nullptr ? entry.process->ErrorLine() : entry.failed_reason;
        if (reason.empty()) {
          reason = *code > 128 && *code < 128 + NSIG
                       ? absl::StrCat("killed by signal ", *code - 128, " (exit code ", *code, ")")
                       : absl::StrCat("exited with code ", *code);
        }
        status.set_reason(std::move(reason));
      }
    }
    return status;
  }

  void FillRegister(v1::RegisterRequest& request) {
    absl::MutexLock lock(&mu);
    for (auto& [key, entry] : entries) *request.add_ranks() = StatusOf(*entry);
  }

  void FillHeartbeat(v1::HeartbeatRequest& request) {
    absl::MutexLock lock(&mu);
    for (auto& [key, entry] : entries) {
      // The exit first: once it is visible, all output is buffered, so the
      // output taken below is complete when the exit is reported.
      v1::RankStatus status = StatusOf(*entry);
      if (status.exited()) {
        NoteExit(*entry, status.exit_code());
        entry->exit_reported = true;
      }
      *request.add_ranks() = std::move(status);

      v1::RankOutput output;
      for (v1::LogLine& line : entry->daemon_logs) *output.add_logs() = std::move(line);
      entry->daemon_logs.clear();
      if (entry->process != nullptr) {
        RankProcessOutput taken = entry->process->TakeOutput();
        for (RankOutputLine& line : taken.lines) {
          v1::LogLine* log = output.add_logs();
          log->set_rank(entry->assignment.rank());
          log->set_stream(std::move(line.stream));
          log->set_text(std::move(line.text));
        }
        for (std::string& line : taken.metrics) {
          v1::JobMetrics* metric = output.add_metrics();
          const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
          if (parsed.is_object()) {
            const auto step = parsed.find("step");
            if (step != parsed.end() && step->is_number()) metric->set_step(step->get<int64_t>());
            const auto total = parsed.find("total_steps");
            if (total != parsed.end() && total->is_number()) {
              metric->set_total_steps(total->get<int64_t>());
            }
          }
          metric->set_json(std::move(line));
        }
      }
      if (output.logs_size() > 0 || output.metrics_size() > 0) {
        output.set_job_id(entry->assignment.job_id());
        output.set_attempt(entry->assignment.attempt());
        output.set_rank(entry->assignment.rank());
        *request.add_output() = std::move(output);
      }
    }
  }

  void OnReply(const v1::HeartbeatResponse& reply) {
    absl::MutexLock lock(&mu);
    // The heartbeat this answers reported these exits: the coordinator has
    // them, so they are done.
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->second->exit_reported) {
        it = entries.erase(it);
      } else {
        ++it;
      }
    }
    for (const v1::RankAssignment& start : reply.start()) {
      const std::string key = RankKey(start.job_id(), start.attempt(), start.rank());
      if (seen.contains(key)) continue;
      seen.insert(key);
      auto entry = std::make_unique<RankEntry>();
      entry->assignment = start;
      entry->key = key;
      entry->master_port = start.master_port();
      if (start.rank() == 0 && start.master_port() == 0) {
        // Picked here, not at start, so the next heartbeat can report it.
        absl::StatusOr<int> picked = PickFreePort();
        if (picked.ok()) {
          entry->master_port = *picked;
        } else {
          entry->failed_code = 1;
          entry->failed_reason = std::string(picked.status().message());
        }
      }
      SS_LOG_INFO("assigned job {} attempt {} rank {}/{}", start.job_id(), start.attempt(),
                  start.rank(), start.world_size());
      pending_starts.push_back(key);
      entries.emplace(key, std::move(entry));
    }
    for (const v1::RankStatus& stop : reply.stop()) {
      auto it = entries.find(RankKey(stop.job_id(), stop.attempt(), stop.rank()));
      if (it == entries.end()) continue;
      RankEntry& entry = *it->second;
      if (entry.process != nullptr) {
        if (!entry.process->stopping() && !entry.process->ExitCode().has_value()) {
          SS_LOG_INFO("stopping job {} attempt {} rank {} (coordinator)", stop.job_id(),
                      stop.attempt(), stop.rank());
          entry.DaemonLog("stopping: the coordinator asked (SIGTERM, then SIGKILL after " +
                          absl::StrCat(options.stop_grace_seconds) + " s)");
          entry.process->Stop();
        }
      } else if (!entry.started) {
        entry.stop_before_start = true;
      }
    }
  }

  // ---- Run()'s thread ----

  // Writes the spec and starts the child. Failures become an exit of the
  // rank (reported like any other), not an error of the daemon.
  void StartRank(RankEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    entry.started = true;
    const v1::RankAssignment& a = entry.assignment;
    if (entry.failed_code.has_value()) return;  // e.g. no rendezvous port
    if (entry.stop_before_start) {
      entry.failed_code = 128 + SIGTERM;
      entry.failed_reason = "stopped before it started";
      return;
    }
    absl::Status status = [&]() -> absl::Status {
      const std::filesystem::path dir = std::filesystem::path(options.workdir) /
                                        PathComponent(a.job_id()) /
                                        absl::StrCat("attempt-", a.attempt(), "-rank-", a.rank());
      std::error_code error;
      std::filesystem::create_directories(dir, error);
      if (error) {
        return absl::InternalError(absl::StrCat("creating ", dir.string(), ": ", error.message()));
      }
      v1::JobSpec spec = a.spec();
      if (spec.metrics().jsonl().empty()) {
        spec.mutable_metrics()->set_jsonl((dir / "metrics.jsonl").string());
      }
      std::string json;
      google::protobuf::util::JsonPrintOptions print;
      print.preserve_proto_field_names = true;
      print.add_whitespace = true;
      if (auto printed = google::protobuf::util::MessageToJsonString(spec, &json, print);
          !printed.ok()) {
        return absl::InternalError(absl::StrCat("job spec to JSON: ", printed.ToString()));
      }
      const std::string config = (dir / "job.json").string();
      RETURN_IF_ERROR(WriteFileAtomically(config, json));

      RankProcessOptions process;
      process.argv = {options.train_executable, "train", "--config", config};
      if (a.resume()) process.argv.push_back("--resume");
      for (const auto& [flag, path] : {std::pair{"--teacher-tls-ca", options.teacher_tls.ca},
                                       std::pair{"--teacher-tls-cert", options.teacher_tls.cert},
                                       std::pair{"--teacher-tls-key", options.teacher_tls.key}}) {
        if (path.empty()) continue;
        process.argv.push_back(flag);
        process.argv.push_back(path);
      }
      if (!options.devices.empty()) {
        process.argv.push_back("--device");
        process.argv.push_back(options.devices.front());
      }
      const std::string master_addr = a.master_addr().empty() ? options.host : a.master_addr();
      process.env = {
          absl::StrCat("RANK=", a.rank()),
          absl::StrCat("WORLD_SIZE=", a.world_size()),
          "LOCAL_RANK=0",
          absl::StrCat("MASTER_ADDR=", master_addr),
          absl::StrCat("MASTER_PORT=", entry.master_port),
          absl::StrCat("SPECSTREAM_HOST=", options.host),
          absl::StrCat("SPECSTREAM_JOB_TOKEN=", a.job_token()),
      };
      // Only rank 0 writes metrics; another rank tailing a shared path would
      // report rank 0's lines as its own.
      if (a.rank() == 0) process.metrics_jsonl = spec.metrics().jsonl();
      process.stop_grace_seconds = options.stop_grace_seconds;
      process.clock = options.clock;
      if (options.echo_child_output) {
        process.echo_prefix = absl::StrCat("[", a.job_id(), " rank ", a.rank(), "]");
      }
      ASSIGN_OR_RETURN(entry.process, RankProcess::Start(std::move(process)));
      SS_LOG_INFO("started job {} attempt {} rank {}/{} as pid {} (MASTER_ADDR={} MASTER_PORT={})",
                  a.job_id(), a.attempt(), a.rank(), a.world_size(), entry.process->pid(),
                  master_addr, entry.master_port);
      entry.DaemonLog(absl::StrCat("started on ", info.name(), " as pid ", entry.process->pid(),
                                   ": ", options.train_executable, " train --config ", config,
                                   a.resume() ? " --resume" : ""));
      metrics.AddCounter("specstream_student_daemon_ranks_started_total", "Rank processes started",
                         {}, 1);
      return absl::OkStatus();
    }();
    if (!status.ok()) {
      SS_LOG_ERROR("job {} attempt {} rank {}: cannot start: {}", a.job_id(), a.attempt(), a.rank(),
                   status.ToString());
      entry.failed_code = 127;
      entry.failed_reason = absl::StrCat("the daemon could not start the rank: ", status.message());
      entry.DaemonLog(entry.failed_reason);
    }
  }

  // Starts what was assigned, logs and counts exits, refreshes gauges.
  // Returns true when something changed that the coordinator should hear
  // about soon.
  bool Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    bool changed = false;
    while (!pending_starts.empty()) {
      const std::string key = std::move(pending_starts.front());
      pending_starts.pop_front();
      auto it = entries.find(key);
      if (it == entries.end() || it->second->started) continue;
      StartRank(*it->second);
      changed = true;
    }
    int running = 0;
    for (auto& [key, entry] : entries) {
      const std::optional<int> code = entry->ExitCode();
      if (!code.has_value()) {
        if (entry->process != nullptr) ++running;
        continue;
      }
      changed |= NoteExit(*entry, *code);
    }
    metrics.SetGauge("specstream_student_daemon_busy", "1 while a rank process runs", {},
                     running > 0 ? 1 : 0);
    metrics.SetGauge("specstream_student_daemon_ranks_running", "Rank processes running", {},
                     running);
    return changed;
  }

  int RunningCount() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    int running = 0;
    for (auto& [key, entry] : entries) {
      if (entry->process != nullptr && !entry->process->ExitCode().has_value()) ++running;
    }
    return running;
  }
};

StudentDaemon::StudentDaemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<StudentDaemon>> StudentDaemon::Create(StudentDaemonOptions options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator: address required (host:port)");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port: must be 0..65535, got ", options.port));
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port: must be -1 (off) or 0..65535, got ", options.metrics_port));
  }
  if (!(options.stop_grace_seconds >= 0)) {
    return absl::InvalidArgumentError("stop grace must be >= 0 seconds");
  }
  if (options.workdir.empty()) return absl::InvalidArgumentError("--workdir: must not be empty");
  if (options.host.empty()) {
    // The address this host reaches the coordinator from is the one the
    // job's other hosts reach it at (ranks bind it; rank 0 serves the
    // rendezvous store there).
    ASSIGN_OR_RETURN(HostPort coordinator, SplitHostPort(options.coordinator, "--coordinator"));
    absl::StatusOr<std::string> local = LocalAddressToward(coordinator.host);
    if (!local.ok()) {
      return absl::UnavailableError(
          absl::StrCat("--host: not given, and ", local.status().message()));
    }
    options.host = *local;
  }
  if (options.name.empty()) options.name = DefaultName();
  if (options.train_executable.empty()) {
    ASSIGN_OR_RETURN(options.train_executable, SelfExecutable());
  }
  if (options.train_executable[0] != '/' || access(options.train_executable.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("train executable ", options.train_executable,
                                                   ": not an absolute executable path"));
  }
  std::error_code error;
  std::filesystem::create_directories(options.workdir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workdir ", options.workdir, ": ", error.message()));
  }
  // Children get an absolute --config whatever their working directory.
  options.workdir = std::filesystem::absolute(options.workdir, error).lexically_normal().string();

  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const StudentDaemonOptions& o = impl->options;

  EnableServerDefaults();
  grpc::ServerBuilder builder;
  // Only where --host says (or the address toward the coordinator): the
  // daemon listens on no other interface.
  builder.AddListeningPort(ListenAddress(o.host, o.port), grpc::InsecureServerCredentials(),
                           &impl->port);
  impl->reflection = std::make_unique<ReflectionService>(
      std::vector<std::string>{},
      [token = o.token](grpc::ServerContext& context) { return CheckBearer(context, token); });
  builder.RegisterService(impl->reflection.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", ListenAddress(o.host, o.port), " (gRPC health)"));
  }
  impl->address = absl::StrCat(o.host, ":", impl->port);
  RETURN_IF_ERROR(WritePortFile(o.port_file, impl->port));
  ASSIGN_OR_RETURN(impl->metrics_server, StartMetricsEndpoint(o.host, o.metrics_port,
                                                              o.metrics_port_file, &impl->metrics));

  impl->info.set_name(o.name);
  impl->info.set_kind(v1::DAEMON_KIND_STUDENT);
  impl->info.set_address(impl->address);
  impl->info.set_host(o.host);
  for (const std::string& device : o.devices) impl->info.add_devices(device);

  impl->metrics.SetGauge("specstream_student_daemon_busy", "1 while a rank process runs", {}, 0);
  impl->metrics.SetGauge("specstream_student_daemon_ranks_running", "Rank processes running", {},
                         0);
  impl->metrics.SetGauge("specstream_student_daemon_registered",
                         "1 while registered with the coordinator", {}, 0);
  impl->metrics.AddCounter("specstream_student_daemon_ranks_started_total",
                           "Rank processes started", {}, 0);
  SS_LOG_INFO("student daemon {} listening on {} (workdir {}, trainer {})", o.name, impl->address,
              o.workdir, o.train_executable);
  return std::unique_ptr<StudentDaemon>(new StudentDaemon(std::move(impl)));
}

absl::Status StudentDaemon::Run() {
  Impl& d = *impl_;
  if (d.run_called.exchange(true)) {
    return absl::FailedPreconditionError("StudentDaemon::Run called twice");
  }
  RegistrationOptions registration;
  registration.coordinator = d.options.coordinator;
  registration.token = d.options.token;
  registration.tls = d.options.tls;
  registration.info = d.info;
  registration.rpc_timeout_seconds = d.options.rpc_timeout_seconds;
  registration.clock = d.options.clock;
  registration.fill_register = [&d](v1::RegisterRequest& request) { d.FillRegister(request); };
  registration.fill_heartbeat = [&d](v1::HeartbeatRequest& request) { d.FillHeartbeat(request); };
  registration.on_reply = [&d](const v1::HeartbeatResponse& reply) { d.OnReply(reply); };
  ASSIGN_OR_RETURN(d.registration, Registration::Start(std::move(registration)));

  auto wake = [&d]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) {
    return !d.pending_starts.empty() || d.shutdown_requested.load();
  };
  while (!d.shutdown_requested.load()) {
    bool changed = false;
    {
      absl::MutexLock lock(&d.mu);
      d.mu.AwaitWithTimeout(absl::Condition(&wake), kLoopTick);
      if (d.shutdown_requested.load()) break;
      changed = d.Tick();
    }
    // Rank 0's port, a start failure or an exit: tell the coordinator now.
    if (changed) d.registration->Poke();
    d.metrics.SetGauge("specstream_student_daemon_registered",
                       "1 while registered with the coordinator", {},
                       d.registration->daemon_id().empty() ? 0 : 1);
  }

  SetServing(*d.server, false);
  // Not ready any more (Kubernetes readiness), then tell the coordinator
  // first, so that a job losing its rank here
  // restarts elsewhere instead of failing on the rank's SIGTERM exit.
  int live = 0;
  {
    absl::MutexLock lock(&d.mu);
    live = d.RunningCount();
  }
  if (live > 0 && !d.registration->Drain(kDrainTimeout)) {
    SS_LOG_WARN("the coordinator did not acknowledge the shutdown within {}",
                absl::FormatDuration(kDrainTimeout));
  }
  SS_LOG_INFO("shutting down: stopping rank processes (grace {} s)", d.options.stop_grace_seconds);
  {
    absl::MutexLock lock(&d.mu);
    d.pending_starts.clear();
    for (auto& [key, entry] : d.entries) {
      if (entry->process != nullptr) entry->process->Stop();
    }
  }
  Env& clock = Env::Or(d.options.clock);
  const absl::Time deadline =
      clock.Now() + absl::Seconds(d.options.stop_grace_seconds) + kKillSlack;
  int running = 0;
  while (true) {
    {
      absl::MutexLock lock(&d.mu);
      running = d.RunningCount();
    }
    if (running == 0 || clock.Now() >= deadline) break;
    absl::SleepFor(kExitPoll);  // the ranks exit in real time
  }
  if (running > 0) SS_LOG_WARN("{} rank process(es) still running at shutdown", running);
  d.registration.reset();
  SS_LOG_INFO("student daemon stopped");
  return absl::OkStatus();
}

void StudentDaemon::Shutdown() { impl_->shutdown_requested.store(true); }

StudentDaemon::~StudentDaemon() {
  Shutdown();
  impl_->registration.reset();  // no callbacks from here on
  {
    // RankProcess destructors stop and reap whatever still runs (Run() not
    // called, or children that outlived its wait).
    absl::MutexLock lock(&impl_->mu);
    impl_->entries.clear();
  }
  if (impl_->server != nullptr) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  impl_->metrics_server.reset();
}

int StudentDaemon::port() const { return impl_->port; }

int StudentDaemon::metrics_port() const {
  return impl_->metrics_server != nullptr ? impl_->metrics_server->port() : -1;
}

std::string StudentDaemon::address() const { return impl_->address; }

}  // namespace specstream::services
