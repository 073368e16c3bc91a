#include "services/coordinator/coordinator_server.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/file.h"
#include "common/grpc/channel_args.h"
#include "common/grpc/reflection.h"
#include "common/grpc/server_defaults.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/net_address.h"
#include "common/status.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/job_store.h"
#include "services/coordinator/scheduler.h"

namespace specstream::services {
namespace {

// The flock(2)ed <db>.lock, released when closed.
struct LockFile {
  int fd = -1;
  ~LockFile() {
    if (fd >= 0) close(fd);
  }
};
}  // namespace

absl::StatusOr<std::string> CheckCoordinatorOptions(const CoordinatorServerOptions& options) {
  if (options.heartbeat_ms <= 0) {
    return absl::InvalidArgumentError("--heartbeat-ms: must be > 0");
  }
  if (options.lost_after_s * 1000 <= options.heartbeat_ms) {
    return absl::InvalidArgumentError("--lost-after-s: must exceed the heartbeat interval");
  }
  RETURN_IF_ERROR(CheckListenPorts(options.port, options.metrics_port));
  if (options.db.empty()) return absl::InvalidArgumentError("--db: must not be empty");
  RETURN_IF_ERROR(CheckTlsServerFlags(options.tls));
  if (options.insecure_no_auth &&
      (!options.token_file.empty() || !options.daemon_token_file.empty())) {
    return absl::InvalidArgumentError(
        "--insecure-no-auth: contradicts --token-file / --daemon-token-file");
  }
  if (!options.insecure_no_auth && options.daemon_token_file.empty()) {
    return absl::InvalidArgumentError(
        "--daemon-token-file: required (daemons hold credentials of their own, so a user's "
        "token cannot register a daemon; docs/operations.md), unless --insecure-no-auth");
  }
  return absl::StrCat("port ", options.port, ", db ", options.db, ", heartbeat ",
                      options.heartbeat_ms, " ms, lost after ", options.lost_after_s, " s, tls ",
                      options.tls.cert.empty() ? "off" : "on", ", auth ",
                      options.insecure_no_auth ? "OFF" : "on");
}

// Members in the order they are built; destroyed in reverse (the services
// before the scheduler, the scheduler before the store, the lock last).
struct CoordinatorServer::Impl {
  LockFile lock;
  CoordinatorServerOptions options;
  std::unique_ptr<JobStore> store;
  std::unique_ptr<Scheduler> scheduler;
  CoordinatorAuth auth;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<JobServiceImpl> jobs;
  std::unique_ptr<RegistryServiceImpl> registry;
  std::unique_ptr<ReflectionService> reflection;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  MetricsRegistry metrics;
  std::unique_ptr<MetricsHttpServer> metrics_server;
  absl::Notification stop_ticking;
  std::thread ticker;  // the scheduler's clock
  bool started = false;
  absl::Notification stopped;  // Stop() has run
};

CoordinatorServer::CoordinatorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Create(
    CoordinatorServerOptions options) {
  RETURN_IF_ERROR(CheckCoordinatorOptions(options).status());
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.options = std::move(options);
  const CoordinatorServerOptions& o = s.options;
  s.auth.limiter = std::make_shared<PeerLimiter>();  // one count for both services
  if (!o.insecure_no_auth) {
    ASSIGN_OR_RETURN(s.auth.user_token, LoadToken(o.token_file));
    if (s.auth.user_token.empty()) {
      return absl::InvalidArgumentError(
          "--token-file: required (the users' token; or $SPECSTREAM_TOKEN), unless "
          "--insecure-no-auth");
    }
    ASSIGN_OR_RETURN(s.auth.daemons, DaemonCredentials::Load(o.daemon_token_file));
  } else {
    SS_LOG_WARN(
        "coordinator: --insecure-no-auth: ANYONE who reaches this port can submit jobs and "
        "register daemons");
  }
  ASSIGN_OR_RETURN(s.credentials, MakeServerCredentials(o.tls));
  // One coordinator per database: two would schedule the same jobs twice.
  const std::string lock_path = o.db + ".lock";
  s.lock.fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s.lock.fd < 0) return ErrnoStatus("open", lock_path);
  if (flock(s.lock.fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--db: another coordinator is using ", o.db, " (", lock_path, " is locked)"));
  }
  ASSIGN_OR_RETURN(s.store, JobStore::Open(o.db));
  SchedulerOptions scheduler;
  scheduler.store = s.store.get();
  scheduler.heartbeat_interval = absl::Milliseconds(o.heartbeat_ms);
  scheduler.lost_after = absl::Seconds(o.lost_after_s);
  ASSIGN_OR_RETURN(s.scheduler, Scheduler::Create(scheduler));
  s.jobs = std::make_unique<JobServiceImpl>(s.scheduler.get(), s.auth);
  s.registry = std::make_unique<RegistryServiceImpl>(s.scheduler.get(), s.auth);
  // Reflection answers users (grpcurl with the user token).
  JobServiceImpl* jobs = s.jobs.get();
  s.reflection = std::make_unique<ReflectionService>(
      std::vector<std::string>{v1::JobService::service_full_name(),
                               v1::RegistryService::service_full_name()},
      [jobs](grpc::ServerContext& context) { return jobs->Authenticate(context); });
  Scheduler* collected = s.scheduler.get();
  s.metrics.AddCollector([collected](MetricsRegistry& r) { collected->Collect(r); });
  return std::unique_ptr<CoordinatorServer>(new CoordinatorServer(std::move(impl)));
}

absl::Status CoordinatorServer::Start() {
  Impl& s = *impl_;
  const CoordinatorServerOptions& o = s.options;
  if (s.started) return absl::FailedPreconditionError("coordinator: Start called twice");
  s.started = true;
  EnableServerDefaults();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.port), s.credentials, &s.port);
  builder.SetMaxReceiveMessageSize(kMaxControlMessageBytes);
  builder.RegisterService(s.jobs.get());
  builder.RegisterService(s.registry.get());
  builder.RegisterService(s.reflection.get());
  s.server = builder.BuildAndStart();
  if (s.server == nullptr || s.port == 0) {
    s.server.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.host, ":", o.port));
  }
  ASSIGN_OR_RETURN(s.metrics_server,
                   StartMetricsEndpoint(o.host, o.metrics_port, o.metrics_port_file, &s.metrics));
  SS_LOG_INFO("coordinator listening on {}:{} (db {}, auth {}, tls {})", o.host, s.port, o.db,
              o.insecure_no_auth ? "OFF" : "user token + daemon credentials",
              o.tls.cert.empty() ? "off" : "on");
  if (o.on_listening) o.on_listening(s.port);
  RETURN_IF_ERROR(WritePortFile(o.port_file, s.port));
  // The scheduler's clock: lost daemons, attempt decisions, queued jobs.
  const absl::Duration period = absl::Milliseconds(std::max(o.heartbeat_ms / 2, 50));
  Scheduler* scheduler = s.scheduler.get();
  absl::Notification* stop = &s.stop_ticking;
  s.ticker = std::thread([scheduler, stop, period] {
    while (!stop->WaitForNotificationWithTimeout(period)) scheduler->Tick();
  });
  return absl::OkStatus();
}

void CoordinatorServer::Wait() { impl_->stopped.WaitForNotification(); }

void CoordinatorServer::Stop() {
  Impl& s = *impl_;
  if (s.stopped.HasBeenNotified()) return;
  if (!s.stop_ticking.HasBeenNotified()) s.stop_ticking.Notify();
  if (s.ticker.joinable()) s.ticker.join();
  if (s.server != nullptr) {
    SetServing(*s.server, false);
    s.jobs->Shutdown();
    s.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    s.server->Wait();
  }
  s.metrics_server.reset();
  s.stopped.Notify();
}

int CoordinatorServer::port() const { return impl_->port; }

int CoordinatorServer::metrics_port() const {
  return impl_->metrics_server != nullptr ? impl_->metrics_server->port() : -1;
}

}  // namespace specstream::services
