// `specstream-teacher serve` as a library server: TeacherService over a
// launched target runtime (TeacherServer), who may stream (a standalone
// token, or under a coordinator the running jobs' tokens), the port files,
// the metrics endpoint and the registration with a coordinator, started and
// stopped in order. The binary launches the runtime (its tensor-parallel
// workers re-execute it) and hands it over; tests hand the fake one.
//
//   TeacherDaemonOptions options;
//   options.port = 0;
//   ASSIGN_OR_RETURN(auto daemon, TeacherDaemon::Create(options));  // before the model loads
//   ... launch the runtime ...
//   RETURN_IF_ERROR(daemon->Start(runtime));
//   ... daemon->port() ...
//   daemon->Stop();  // drains for shutdown_timeout_s
//
// Thread-safety: Create, Start and Stop from one thread; Wait and the
// accessors from any.
#ifndef SPECSTREAM_SERVICES_TEACHER_TEACHER_DAEMON_H_
#define SPECSTREAM_SERVICES_TEACHER_TEACHER_DAEMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc/auth.h"

namespace specstream::teacher {
class TargetRuntime;
}

namespace specstream::services {

// serve's flags (specstream-teacher serve --help), but the runtime's.
struct TeacherDaemonOptions {
  std::string host = "127.0.0.1";
  int port = 0;           // 0: any free one
  std::string port_file;  // written with the bound port once listening
  std::string payload_dtype = "bfloat16";
  bool keep_target_ids = false;
  int64_t max_tokens = 0;  // 0: the model's max positions
  int64_t batch_tokens = 8192;
  int64_t answer_batch = 8;  // TeacherServiceOptions::answer_batch
  int64_t chunk_kib = 1024;
  int64_t max_queued_mib = 256;            // TeacherServiceOptions::max_queued_request_bytes
  int64_t max_queued_mib_per_stream = 16;  // ...::max_queued_request_bytes_per_stream
  int max_streams = 512;
  int max_streams_per_peer = 64;
  // auto (in a build with NCCL: the leader's GPU when `devices` are CUDA
  // devices, else device 0 when one is visible; otherwise NCCL is not
  // offered), none, or a device index.
  std::string nccl_device = "auto";
  double nccl_timeout_s = 60;
  double shutdown_timeout_s = 30;
  // Under a coordinator (docs/operations.md): register, heartbeat, and serve
  // streams only to the tokens of running jobs.
  std::string coordinator;
  std::string name;        // default: <advertised host>:<port>
  std::string model_name;  // a short name jobs may use as model.target
  std::string advertise;   // host students dial; default `host`, or the hostname for 0.0.0.0
  // Standalone: the token students must present. Under a coordinator: this
  // daemon's credential there (streams then need a job token).
  std::string token_file;
  bool insecure_no_auth = false;
  std::string tls_ca;     // verifies a TLS coordinator
  TlsServerFiles tls;     // TeacherService's own TLS
  int metrics_port = -1;  // -1: off, 0: any free one
  std::string metrics_port_file;
  // What the registration reports: the runtime's --devices and --model.
  std::string devices = "cpu";
  std::string model;
  // Called with "host:port" once TeacherService listens, before the port
  // file is written (the binary prints "listening on <address>", which
  // whoever waits for the port file may read).
  std::function<void(const std::string& address)> on_listening;
};

// Everything the options say that can be checked before the model loads
// and away from the machine they are meant for: names, numbers, ranges,
// the coordinator's address, TLS files in pairs. InvalidArgument naming the
// flag. (`serve --check-config` adds the runtime's own checks.)
absl::Status CheckTeacherDaemonOptions(const TeacherDaemonOptions& options);

class TeacherDaemon final {
 public:
  // Checks the options and decides who may stream (the token file; a
  // non-loopback host without a token needs insecure_no_auth), before any
  // model loads. Nothing listens yet.
  static absl::StatusOr<std::unique_ptr<TeacherDaemon>> Create(TeacherDaemonOptions options);
  // Stop().
  ~TeacherDaemon();
  TeacherDaemon(const TeacherDaemon&) = delete;
  TeacherDaemon& operator=(const TeacherDaemon&) = delete;

  // Serves `runtime` (which outlives the daemon): TeacherService listens and
  // the port file is written, then the metrics endpoint, then (with a
  // coordinator) the registration starts. Call once.
  absl::Status Start(teacher::TargetRuntime& runtime);
  // Blocks until Stop() has run.
  void Wait();
  // The registration ends, streams still waiting for a job token's verdict
  // are refused, the metrics endpoint closes, the streams drain for
  // shutdown_timeout_s, then gRPC shuts down. Idempotent.
  void Stop();

  int port() const;             // 0 before Start
  std::string address() const;  // "host:port" clients dial; empty before Start
  int metrics_port() const;     // -1 when off or before Start

 private:
  struct Impl;
  explicit TeacherDaemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_TEACHER_TEACHER_DAEMON_H_
