// `specstream-coordinator`: the job store, scheduler and daemon registry.
//
//   specstream-coordinator --port P --db FILE [--host H] [--port-file F]
//       (--token-file F --daemon-token-file F | --insecure-no-auth)
//       [--tls-cert F --tls-key F [--tls-client-ca F]]
//       [--metrics-port M] [--metrics-port-file F]
//       [--heartbeat-ms MS] [--lost-after-s S]
//
// Serves JobService, RegistryService, the gRPC health service and
// reflection (with the user token) until SIGTERM/SIGINT; jobs live in the
// SQLite file, so a restarted coordinator picks up where it left off.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/exit_code.h"
#include "common/file.h"
#include "common/grpc/auth.h"
#include "common/grpc/channel_args.h"
#include "common/grpc/reflection.h"
#include "common/grpc/server_defaults.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/net_address.h"
#include "common/shutdown_signal.h"
#include "common/status.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/job_store.h"
#include "services/coordinator/scheduler.h"

namespace {

using namespace specstream;            // NOLINT(build/namespaces): a main file
using namespace specstream::services;  // NOLINT(build/namespaces)

struct Flags {
  std::string host = "0.0.0.0";
  int port = 0;
  std::string port_file;
  std::string db;
  std::string token_file;
  std::string daemon_token_file;
  bool insecure_no_auth = false;
  TlsServerFiles tls;
  int metrics_port = -1;
  std::string metrics_port_file;
  int heartbeat_ms = 1000;
  double lost_after_s = 10;
};

// What the flags say that can be checked away from the coordinator's
// machine: timing, ports, the database path, TLS files given in pairs. Run
// runs it first; --check-config runs only it (the Kubernetes manifest
// checks run each overlay's flags through it). Returns a one-line summary.
absl::StatusOr<std::string> CheckConfig(const Flags& flags) {
  if (flags.heartbeat_ms <= 0) return absl::InvalidArgumentError("--heartbeat-ms: must be > 0");
  if (flags.lost_after_s * 1000 <= flags.heartbeat_ms) {
    return absl::InvalidArgumentError("--lost-after-s: must exceed the heartbeat interval");
  }
  RETURN_IF_ERROR(CheckListenPorts(flags.port, flags.metrics_port));
  if (flags.db.empty()) return absl::InvalidArgumentError("--db: must not be empty");
  RETURN_IF_ERROR(CheckTlsServerFlags(flags.tls));
  if (flags.insecure_no_auth && (!flags.token_file.empty() || !flags.daemon_token_file.empty())) {
    return absl::InvalidArgumentError(
        "--insecure-no-auth: contradicts --token-file / --daemon-token-file");
  }
  if (!flags.insecure_no_auth && flags.daemon_token_file.empty()) {
    return absl::InvalidArgumentError(
        "--daemon-token-file: required (daemons hold credentials of their own, so a user's "
        "token cannot register a daemon; docs/operations.md), unless --insecure-no-auth");
  }
  return absl::StrCat("port ", flags.port, ", db ", flags.db, ", heartbeat ", flags.heartbeat_ms,
                      " ms, lost after ", flags.lost_after_s, " s, tls ",
                      flags.tls.cert.empty() ? "off" : "on", ", auth ",
                      flags.insecure_no_auth ? "OFF" : "on");
}

absl::Status Run(const Flags& flags) {
  RETURN_IF_ERROR(CheckConfig(flags).status());
  RETURN_IF_ERROR(InstallShutdownSignals());

  CoordinatorAuth auth;
  auth.limiter = std::make_shared<PeerLimiter>();  // one count for both services
  if (!flags.insecure_no_auth) {
    ASSIGN_OR_RETURN(auth.user_token, LoadToken(flags.token_file));
    if (auth.user_token.empty()) {
      return absl::InvalidArgumentError(
          "--token-file: required (the users' token; or $SPECSTREAM_TOKEN), unless "
          "--insecure-no-auth");
    }
    ASSIGN_OR_RETURN(auth.daemons, DaemonCredentials::Load(flags.daemon_token_file));
  } else {
    SS_LOG_WARN(
        "coordinator: --insecure-no-auth: ANYONE who reaches this port can submit jobs and "
        "register daemons");
  }
  ASSIGN_OR_RETURN(auto credentials, MakeServerCredentials(flags.tls));
  // One coordinator per database: two would schedule the same jobs twice.
  const std::string lock_path = flags.db + ".lock";
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return ErrnoStatus("open", lock_path);
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--db: another coordinator is using ",
                                                      flags.db, " (", lock_path, " is locked)"));
  }
  ASSIGN_OR_RETURN(auto store, JobStore::Open(flags.db));
  SchedulerOptions options;
  options.store = store.get();
  options.heartbeat_interval = absl::Milliseconds(flags.heartbeat_ms);
  options.lost_after = absl::Seconds(flags.lost_after_s);
  ASSIGN_OR_RETURN(auto scheduler, Scheduler::Create(options));

  JobServiceImpl jobs(scheduler.get(), auth);
  RegistryServiceImpl registry(scheduler.get(), auth);
  // Reflection answers users (grpcurl with the user token).
  ReflectionService reflection(
      {v1::JobService::service_full_name(), v1::RegistryService::service_full_name()},
      [&jobs](grpc::ServerContext& context) { return jobs.Authenticate(context); });
  EnableServerDefaults();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(flags.host, ":", flags.port), credentials, &port);
  builder.SetMaxReceiveMessageSize(kMaxControlMessageBytes);
  builder.RegisterService(&jobs);
  builder.RegisterService(&registry);
  builder.RegisterService(&reflection);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", flags.host, ":", flags.port));
  }

  MetricsRegistry metrics;
  metrics.AddCollector([&scheduler](MetricsRegistry& r) { scheduler->Collect(r); });
  ASSIGN_OR_RETURN(
      std::unique_ptr<MetricsHttpServer> metrics_server,
      StartMetricsEndpoint(flags.host, flags.metrics_port, flags.metrics_port_file, &metrics));

  SS_LOG_INFO("coordinator listening on {}:{} (db {}, auth {}, tls {})", flags.host, port, flags.db,
              flags.insecure_no_auth ? "OFF" : "user token + daemon credentials",
              flags.tls.cert.empty() ? "off" : "on");
  std::cout << "listening on " << flags.host << ":" << port << std::endl;
  RETURN_IF_ERROR(WritePortFile(flags.port_file, port));

  // The scheduler's clock: lost daemons, attempt decisions, queued jobs.
  absl::Notification stop_ticking;
  std::thread ticker([&] {
    const absl::Duration period = absl::Milliseconds(std::max(flags.heartbeat_ms / 2, 50));
    while (!stop_ticking.WaitForNotificationWithTimeout(period)) scheduler->Tick();
  });

  const int signal_number = WaitForShutdownSignal();
  SS_LOG_INFO("coordinator: {} received; stopping", strsignal(signal_number));
  stop_ticking.Notify();
  ticker.join();
  SetServing(*server, false);
  jobs.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SpecStream coordinator: job store, scheduler and daemon registry"};
  Flags flags;
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  app.add_option("--host", flags.host, "Listening address (default 0.0.0.0)");
  app.add_option("--port", flags.port, "gRPC port; 0 picks a free one")->required();
  app.add_option("--port-file", flags.port_file, "Write the bound port here once listening");
  app.add_option("--db", flags.db, "SQLite job database (created if absent; WAL mode)")->required();
  app.add_option("--token-file", flags.token_file,
                 "Users' bearer token: submit, watch, list, stop (else $SPECSTREAM_TOKEN)");
  app.add_option("--daemon-token-file", flags.daemon_token_file,
                 "Daemon credentials, one \"NAME TOKEN\" per line (\"* TOKEN\": any name)");
  app.add_flag("--insecure-no-auth", flags.insecure_no_auth,
               "Run without authentication (warns; for a trusted network only)");
  app.add_option("--tls-cert", flags.tls.cert, "PEM server certificate (enables TLS)");
  app.add_option("--tls-key", flags.tls.key, "PEM server private key");
  app.add_option("--tls-client-ca", flags.tls.client_ca,
                 "PEM CA bundle: require client certificates signed by it");
  app.add_option("--metrics-port", flags.metrics_port,
                 "Prometheus /metrics HTTP port (0: any free one; default off)");
  app.add_option("--metrics-port-file", flags.metrics_port_file, "Write the metrics port here");
  app.add_option("--heartbeat-ms", flags.heartbeat_ms, "Heartbeat interval daemons use");
  app.add_option("--lost-after-s", flags.lost_after_s,
                 "Seconds without a heartbeat before a daemon counts as lost");
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "Check the flags (timing, ports, paths given; not the files), print OK and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  specstream::LoggingOptions logging;
  logging.role = "coordinator";
  logging.level = log_level;
  if (!specstream::InitLogging(logging)) {
    std::cerr << "specstream-coordinator: unknown --log-level \"" << log_level << "\"\n";
    return 2;
  }
  if (check_config) {
    absl::StatusOr<std::string> summary = CheckConfig(flags);
    if (!summary.ok()) return specstream::ReportExit("specstream-coordinator", summary.status());
    std::cout << "specstream-coordinator: configuration OK: " << *summary << "\n";
    return 0;
  }
  return specstream::ReportExit("specstream-coordinator", Run(flags));
}
