// gRPC adapters over Scheduler: JobService (users) and RegistryService
// (daemons). Each handler checks the bearer token, calls the scheduler and
// converts the status once. Watch polls the scheduler's event wait in short
// slices so a cancelled client or a server shutdown ends it promptly.
#ifndef SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
#define SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <string>

#include "services/coordinator/scheduler.h"
#include "specstream/v1/coordinator.grpc.pb.h"

namespace specstream::services {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `scheduler` outlives the service; `token` empty: no auth.
  JobServiceImpl(Scheduler* scheduler, std::string token)
      : scheduler_(scheduler), token_(std::move(token)) {}

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

 private:
  Scheduler* scheduler_;
  const std::string token_;
  std::atomic<bool> shutting_down_{false};
};

class RegistryServiceImpl final : public v1::RegistryService::Service {
 public:
  RegistryServiceImpl(Scheduler* scheduler, std::string token)
      : scheduler_(scheduler), token_(std::move(token)) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status ListDaemons(grpc::ServerContext* context, const v1::ListDaemonsRequest* request,
                           v1::ListDaemonsResponse* response) override;

 private:
  Scheduler* scheduler_;
  const std::string token_;
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
