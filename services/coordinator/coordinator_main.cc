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
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "common/exit_code.h"
#include "common/logging.h"
#include "common/shutdown_signal.h"
#include "common/status.h"
#include "services/coordinator/coordinator_server.h"

namespace {

using namespace specstream;            // NOLINT(build/namespaces): a main file
using namespace specstream::services;  // NOLINT(build/namespaces)

absl::Status Run(CoordinatorServerOptions options) {
  RETURN_IF_ERROR(InstallShutdownSignals());
  options.on_listening = [host = options.host](int port) {
    std::cout << "listening on " << host << ":" << port << std::endl;
  };
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server, CoordinatorServer::Create(options));
  RETURN_IF_ERROR(server->Start());
  const int signal_number = WaitForShutdownSignal();
  SS_LOG_INFO("coordinator: {} received; stopping", strsignal(signal_number));
  server->Stop();
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SpecStream coordinator: job store, scheduler and daemon registry"};
  CoordinatorServerOptions flags;
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
    absl::StatusOr<std::string> summary = CheckCoordinatorOptions(flags);
    if (!summary.ok()) return specstream::ReportExit("specstream-coordinator", summary.status());
    std::cout << "specstream-coordinator: configuration OK: " << *summary << "\n";
    return 0;
  }
  return specstream::ReportExit("specstream-coordinator", Run(flags));
}
