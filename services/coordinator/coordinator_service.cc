#include "services/coordinator/coordinator_service.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/grpc/auth.h"
#include "common/grpc/status.h"

namespace specstream::services {
namespace {

// Runs `check` (a credential comparison in constant time: cheap, and never
// waiting) and limits its refusals alone: a call with the right credential
// is served whatever its peer's count, since a NAT or a node shares one
// address among clients and one client's wrong tokens must not lock the
// others out. A refused call counts against its peer, and past the limit is
// answered RESOURCE_EXHAUSTED (saying when to retry) instead.
template <typename Check>
grpc::Status Limited(PeerLimiter& limiter, Env& clock, const grpc::ServerContext& context,
                     Check check) {
  grpc::Status verdict = check();
  if (verdict.ok()) return verdict;
  absl::Status limited = limiter.Refused(PeerLimiter::PeerHost(context.peer()), clock.Now());
  return limited.ok() ? verdict : ToGrpcStatus(limited);
}

// A user's call: the user token, when there is one.
grpc::Status CheckUser(PeerLimiter& limiter, const CoordinatorAuth& auth,
                       const grpc::ServerContext& context) {
  if (auth.user_token.empty()) return grpc::Status::OK;
  return Limited(limiter, Env::Or(auth.clock), context,
                 [&] { return CheckBearer(context, auth.user_token); });
}

// Fills `response` from a StatusOr, converting the error once.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

absl::StatusOr<DaemonCredentials> DaemonCredentials::Parse(absl::string_view text,
                                                           absl::string_view source) {
  DaemonCredentials out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto where = [&] { return absl::StrCat(source, " line ", line_number); };
    if (fields.size() == 1) fields.insert(fields.begin(), "*");  // a bare shared token
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": expected \"NAME TOKEN\", \"* TOKEN\" or \"TOKEN\""));
    }
    for (char c : fields[1]) {
      if (c < 0x21 || c > 0x7e) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), ": the token may only hold visible ASCII characters"));
      }
    }
    if (!out.by_name_.emplace(std::string(fields[0]), std::string(fields[1])).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": daemon ", fields[0], " is given twice"));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no credentials"));
  return out;
}

absl::StatusOr<DaemonCredentials> DaemonCredentials::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--daemon-token-file: ", text.status().message()));
  }
  return Parse(*text, absl::StrCat("--daemon-token-file ", path));
}

absl::Status DaemonCredentials::Check(absl::string_view name, absl::string_view token) const {
  if (token.empty()) return absl::UnauthenticatedError("missing daemon credential");
  auto own = by_name_.find(name);
  if (own != by_name_.end() && TokenMatches(own->second, token)) return absl::OkStatus();
  auto shared = by_name_.find("*");
  if (shared != by_name_.end() && TokenMatches(shared->second, token)) return absl::OkStatus();
  return absl::UnauthenticatedError(
      absl::StrCat("not a daemon credential for the name \"", name, "\""));
}

grpc::Status JobServiceImpl::Authenticate(const grpc::ServerContext& context) {
  return CheckUser(*limiter_, auth_, context);
}

grpc::Status RegistryServiceImpl::AuthenticateDaemon(const grpc::ServerContext& context,
                                                     absl::string_view name) {
  if (auth_.daemons.empty()) return grpc::Status::OK;
  return Limited(*limiter_, Env::Or(auth_.clock), context, [&] {
    return ToGrpcStatus(auth_.daemons.Check(name, BearerToken(context).value_or("")));
  });
}

grpc::Status JobServiceImpl::Submit(grpc::ServerContext* context,
                                    const v1::SubmitJobRequest* request, v1::Job* response) {
  if (auto auth = Authenticate(*context); !auth.ok()) return auth;
  return Reply(scheduler_->Submit(request->spec_yaml(), request->id()), response);
}

grpc::Status JobServiceImpl::Get(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                 v1::Job* response) {
  if (auto auth = Authenticate(*context); !auth.ok()) return auth;
  return Reply(scheduler_->Get(request->id()), response);
}

grpc::Status JobServiceImpl::List(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  if (auto auth = Authenticate(*context); !auth.ok()) return auth;
  return Reply(scheduler_->List(*request), response);
}

grpc::Status JobServiceImpl::Stop(grpc::ServerContext* context, const v1::StopJobRequest* request,
                                  v1::Job* response) {
  if (auto auth = Authenticate(*context); !auth.ok()) return auth;
  return Reply(scheduler_->Stop(request->id(), request->reason()), response);
}

grpc::Status JobServiceImpl::Watch(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                   grpc::ServerWriter<v1::JobEvent>* writer) {
  if (auto auth = Authenticate(*context); !auth.ok()) return auth;
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
  if (auto auth = AuthenticateDaemon(*context, request->info().name()); !auth.ok()) return auth;
  return Reply(scheduler_->Register(*request), response);
}

grpc::Status RegistryServiceImpl::Heartbeat(grpc::ServerContext* context,
                                            const v1::HeartbeatRequest* request,
                                            v1::HeartbeatResponse* response) {
  if (auto auth = AuthenticateDaemon(*context, request->daemon_id()); !auth.ok()) return auth;
  return Reply(scheduler_->Heartbeat(*request), response);
}

grpc::Status RegistryServiceImpl::ListDaemons(grpc::ServerContext* context,
                                              const v1::ListDaemonsRequest* /*request*/,
                                              v1::ListDaemonsResponse* response) {
  // Users list daemons; a daemon credential does not.
  if (auto auth = CheckUser(*limiter_, auth_, *context); !auth.ok()) return auth;
  for (auto& daemon : scheduler_->Daemons()) *response->add_daemons() = std::move(daemon);
  return grpc::Status::OK;
}

}  // namespace specstream::services
