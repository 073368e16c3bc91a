// The student daemon (`specstream-student serve`): registers with the
// coordinator, runs the ranks it is assigned as `specstream-student train`
// child processes (RankProcess), and reports their state and output in every
// heartbeat.
//
//   StudentDaemonOptions options;
//   options.coordinator = "coord:7000";
//   options.workdir = "/var/lib/specstream";
//   ASSIGN_OR_RETURN(auto daemon, StudentDaemon::Create(options));
//   // elsewhere (a signal handler): daemon->Shutdown();
//   RETURN_IF_ERROR(daemon->Run());
//
// Each assignment gets <workdir>/<job_id>/attempt-<a>-rank-<r>/ holding
// job.json (the spec, as JSON, which LoadJobSpec reads) and, when the spec
// names no metrics file, metrics.jsonl. The child gets RANK, WORLD_SIZE,
// LOCAL_RANK=0, MASTER_ADDR, MASTER_PORT, SPECSTREAM_HOST (the daemon's host,
// which the rank binds) and SPECSTREAM_JOB_TOKEN. For rank 0
// with master_port 0 the daemon picks a free port and reports it.
//
// Alongside: a gRPC server with the standard health service (its address is
// the DaemonInfo.address the coordinator shows) and server reflection (with
// the daemon's own token, as every other call of ours), and, optionally,
// Prometheus metrics over HTTP (specstream_student_daemon_*).
//
// Threading: Run() is the daemon's main loop and the only thread that starts
// children (their PR_SET_PDEATHSIG is tied to it); registration callbacks
// queue work for it. Shutdown() may be called from any thread or a signal
// handler.
#ifndef SPECSTREAM_SERVICES_DAEMON_STUDENT_DAEMON_H_
#define SPECSTREAM_SERVICES_DAEMON_STUDENT_DAEMON_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "common/grpc/auth.h"

namespace specstream::services {

struct StudentDaemonOptions {
  std::string coordinator;  // host:port; required
  std::string token;        // coordinator bearer token ("" when it has none)
  TlsClientFiles tls;       // to the coordinator
  std::string name;         // default: <hostname>-<pid>
  // Where peers reach this host (DaemonInfo.host, the address its ranks
  // bind, MASTER_ADDR when this host runs rank 0); default: the local
  // address that routes to the coordinator. The daemon's gRPC and metrics
  // servers listen on it and nowhere else.
  std::string host;
  // Handed to each rank (train --teacher-tls-*): how it verifies teachers
  // that serve TLS, and its certificate when they require one.
  TlsClientFiles teacher_tls;
  int port = 0;                   // gRPC (health); 0: any free port
  std::string port_file;          // written with the bound port when set
  int metrics_port = -1;          // Prometheus /metrics; -1: off, 0: any
  std::string metrics_port_file;  // written with the bound port when set
  std::string workdir = "specstream-student-work";
  // Reported in DaemonInfo; its rank trains on the first (train --device),
  // else on training.device.
  std::vector<std::string> devices;
  // The trainer binary; default: this executable (/proc/self/exe).
  std::string train_executable;
  // Seconds a stopped rank gets between SIGTERM and SIGKILL (also how long
  // Shutdown waits for children).
  double stop_grace_seconds = 30;
  // The clock of that grace, of the registration's backoff and heartbeats
  // (null: Env::Default()).
  Env* clock = nullptr;
  // Echo children's output lines to this process's stderr, prefixed with
  // "[<job> rank <r>]".
  bool echo_child_output = true;
  double rpc_timeout_seconds = 5;
};

class StudentDaemon final {
 public:
  // Validates the options, creates the workdir, binds the gRPC and metrics
  // servers and writes the port files. Registration starts in Run().
  static absl::StatusOr<std::unique_ptr<StudentDaemon>> Create(StudentDaemonOptions options);
  // Stops whatever still runs (as Shutdown) and joins every thread.
  ~StudentDaemon();
  StudentDaemon(const StudentDaemon&) = delete;
  StudentDaemon& operator=(const StudentDaemon&) = delete;

  // Registers and serves until Shutdown(); then stops the children, waits
  // for them (up to the stop grace plus a few seconds) and returns. Call
  // once.
  absl::Status Run();

  // Asks Run() to return. Async-signal-safe (one atomic store); Run notices
  // within ~100 ms.
  void Shutdown();

  // The bound ports (metrics: -1 when off).
  int port() const;
  int metrics_port() const;
  std::string address() const;  // host:port as registered

 private:
  struct Impl;
  explicit StudentDaemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_DAEMON_STUDENT_DAEMON_H_
