// gRPC adapters over Scheduler: JobService (users) and RegistryService
// (daemons). Each handler checks the caller's credential, calls the
// scheduler and converts the status once. Watch polls the scheduler's event
// wait in short slices so a cancelled client or a server shutdown ends it
// promptly.
//
// Roles: users hold the user token (JobService, ListDaemons); daemons hold
// a daemon credential (Register, Heartbeat), bound to the daemon's name
// unless it is a shared one. Neither can act as the other. Refusals are
// counted per peer (common/peer_limiter.h): past its limit a peer's refused
// calls are answered RESOURCE_EXHAUSTED; a call with the right credential
// is always served.
#ifndef SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
#define SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "common/peer_limiter.h"
#include "services/coordinator/scheduler.h"
#include "specstream/v1/coordinator.grpc.pb.h"

namespace specstream::services {

// The daemons' credentials (--daemon-token-file). Each line is
// "NAME TOKEN": the daemon called NAME, and only it, presents TOKEN; or
// "* TOKEN" (or just "TOKEN"): a shared daemon token, accepted under any
// name (simpler to deploy, but a holder can then take any daemon's name).
// Blank lines and lines starting with '#' are skipped.
class DaemonCredentials final {
 public:
  // InvalidArgument naming `source` and the line for a malformed line, a
  // token gRPC cannot carry, or a name given twice.
  static absl::StatusOr<DaemonCredentials> Parse(absl::string_view text, absl::string_view source);
  static absl::StatusOr<DaemonCredentials> Load(const std::string& path);

  bool empty() const { return by_name_.empty(); }
  // OK when `token` is `name`'s (or the shared one); UNAUTHENTICATED
  // otherwise, never saying which names exist.
  absl::Status Check(absl::string_view name, absl::string_view token) const;

 private:
  std::map<std::string, std::string, std::less<>> by_name_;  // "*": shared
};

// What a coordinator checks. Both empty: no authentication
// (--insecure-no-auth).
struct CoordinatorAuth {
  std::string user_token;
  DaemonCredentials daemons;
  // Counts every refusal of the coordinator's services per peer, so a peer
  // refused by one is limited by all; null: each service counts its own
  // (with default limits).
  std::shared_ptr<PeerLimiter> limiter;
  // The limiter's clock (null: Env::Default()).
  Env* clock = nullptr;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `scheduler` outlives the service.
  JobServiceImpl(Scheduler* scheduler, const CoordinatorAuth& auth)
      : scheduler_(scheduler),
        auth_(auth),
        limiter_(auth.limiter != nullptr ? auth.limiter : std::make_shared<PeerLimiter>()) {}

  // Ends open Watch streams (before Server::Shutdown).
  void Shutdown() { shutting_down_ = true; }

  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                      v1::Job* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetJobRequest* request,
                   v1::Job* response) override;
  grpc::Status List(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                    v1::ListJobsResponse* response) override;
  grpc::Status Stop(grpc::ServerContext* context, const v1::StopJobRequest* request,
                    v1::Job* response) override;
  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                     grpc::ServerWriter<v1::JobEvent>* writer) override;

  // A user's call (the user token, under the per-peer limits): what every
  // JobService call checks, and server reflection too.
  grpc::Status Authenticate(const grpc::ServerContext& context);

 private:
  Scheduler* scheduler_;
  const CoordinatorAuth auth_;
  std::shared_ptr<PeerLimiter> limiter_;
  std::atomic<bool> shutting_down_{false};
};

class RegistryServiceImpl final : public v1::RegistryService::Service {
 public:
  RegistryServiceImpl(Scheduler* scheduler, const CoordinatorAuth& auth)
      : scheduler_(scheduler),
        auth_(auth),
        limiter_(auth.limiter != nullptr ? auth.limiter : std::make_shared<PeerLimiter>()) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status ListDaemons(grpc::ServerContext* context, const v1::ListDaemonsRequest* request,
                           v1::ListDaemonsResponse* response) override;

 private:
  // A daemon acting as `name`.
  grpc::Status AuthenticateDaemon(const grpc::ServerContext& context, absl::string_view name);

  Scheduler* scheduler_;
  const CoordinatorAuth auth_;
  std::shared_ptr<PeerLimiter> limiter_;
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
