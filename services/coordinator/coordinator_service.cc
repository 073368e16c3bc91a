#include "services/coordinator/coordinator_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc/auth.h"
#include "common/grpc/status.h"

namespace specstream::services {
namespace {

// Fills `response` from a StatusOr, converting the error once.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobServiceImpl::Submit(grpc::ServerContext* context,
                                    const v1::SubmitJobRequest* request, v1::Job* response) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  return Reply(scheduler_->Submit(request->spec_yaml(), request->id()), response);
}

grpc::Status JobServiceImpl::Get(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                 v1::Job* response) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  return Reply(scheduler_->Get(request->id()), response);
}

grpc::Status JobServiceImpl::List(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  auto jobs = scheduler_->List(request->limit());
  if (!jobs.ok()) return ToGrpcStatus(jobs.status());
  for (auto& job : *jobs) *response->add_jobs() = std::move(job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Stop(grpc::ServerContext* context, const v1::StopJobRequest* request,
                                  v1::Job* response) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  return Reply(scheduler_->Stop(request->id(), request->reason()), response);
}

grpc::Status JobServiceImpl::Watch(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                   grpc::ServerWriter<v1::JobEvent>* writer) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  int64_t after = request->after_seq();
  while (!context->IsCancelled()) {
    if (shutting_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator stopping");
    bool finished = false;
    auto events = scheduler_->WaitEvents(
        request->id(), after, request->follow() ? absl::Milliseconds(500) : absl::ZeroDuration(),
        &finished);
    if (!events.ok()) return ToGrpcStatus(events.status());
    for (const v1::JobEvent& event : *events) {
      if (!writer->Write(event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client left");
      after = event.seq();
    }
    // Finished and drained (a page shorter than the limit is the end).
    if (finished && events->size() < 1000) return grpc::Status::OK;
    if (!request->follow() && events->size() < 1000) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client left");
}

grpc::Status RegistryServiceImpl::Register(grpc::ServerContext* context,
                                           const v1::RegisterRequest* request,
                                           v1::RegisterResponse* response) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  return Reply(scheduler_->Register(*request), response);
}

grpc::Status RegistryServiceImpl::Heartbeat(grpc::ServerContext* context,
                                            const v1::HeartbeatRequest* request,
                                            v1::HeartbeatResponse* response) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  return Reply(scheduler_->Heartbeat(*request), response);
}

grpc::Status RegistryServiceImpl::ListDaemons(grpc::ServerContext* context,
                                              const v1::ListDaemonsRequest* /*request*/,
                                              v1::ListDaemonsResponse* response) {
  if (auto auth = CheckBearer(*context, token_); !auth.ok()) return auth;
  for (auto& daemon : scheduler_->Daemons()) *response->add_daemons() = std::move(daemon);
  return grpc::Status::OK;
}

}  // namespace specstream::services
