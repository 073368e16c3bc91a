// The coordinator as a library server: the job store, the scheduler and its
// clock, JobService, RegistryService, the gRPC health service, reflection and
// the metrics endpoint, started and stopped in order. `specstream-coordinator`
// is its flags, Create, Start, a wait for SIGTERM/SIGINT and Stop; tests run
// it in-process.
//
//   CoordinatorServerOptions options;
//   options.db = "/var/lib/specstream/jobs.db";
//   options.insecure_no_auth = true;
//   ASSIGN_OR_RETURN(auto server, CoordinatorServer::Create(options));
//   RETURN_IF_ERROR(server->Start());
//   ... server->port() ...
//   server->Stop();
//
// Thread-safety: Create, Start and Stop from one thread; Wait and the
// accessors from any.
#ifndef SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_
#define SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc/auth.h"

namespace specstream::services {

// The coordinator's flags (specstream-coordinator --help).
struct CoordinatorServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;                   // 0: any free one
  std::string port_file;          // written with the bound port once listening
  std::string db;                 // the SQLite job database; required
  std::string token_file;         // users' bearer token (else $SPECSTREAM_TOKEN)
  std::string daemon_token_file;  // daemon credentials, "NAME TOKEN" per line
  bool insecure_no_auth = false;
  TlsServerFiles tls;
  int metrics_port = -1;  // Prometheus /metrics; -1: off, 0: any free one
  std::string metrics_port_file;
  int heartbeat_ms = 1000;   // the interval daemons heartbeat at
  double lost_after_s = 10;  // without a heartbeat: the daemon is lost
  // Called with the bound port once the gRPC server listens, before the
  // port file is written (the binary prints "listening on host:port").
  std::function<void(int port)> on_listening;
};

// What can be checked away from the coordinator's machine: timing, ports,
// the database path, TLS files given in pairs, the auth flags. A one-line
// summary, or InvalidArgument naming the flag (--check-config prints it; the
// Kubernetes manifest checks run each overlay through it).
absl::StatusOr<std::string> CheckCoordinatorOptions(const CoordinatorServerOptions& options);

class CoordinatorServer final {
 public:
  // Checks the options, loads the credentials and takes the database: its
  // `<db>.lock` (FailedPrecondition, naming --db, while another coordinator
  // holds it), the store and the scheduler. Nothing listens yet.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Create(
      CoordinatorServerOptions options);
  // Stop(), then the database is released.
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // Listens (gRPC, then metrics), writes the port files in that order and
  // starts the scheduler's clock. Unavailable when the port cannot be bound.
  // Call once.
  absl::Status Start();
  // Blocks until Stop() has run.
  void Wait();
  // The clock stops, health turns NOT_SERVING, watch streams end, the gRPC
  // server shuts down (2 s for calls in flight) and the metrics endpoint
  // closes. Idempotent.
  void Stop();

  int port() const;          // 0 before Start
  int metrics_port() const;  // -1 when off or before Start

 private:
  struct Impl;
  explicit CoordinatorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_
