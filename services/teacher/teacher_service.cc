#include "services/teacher/teacher_service.h"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/env.h"
#include "common/grpc/auth.h"
#include "common/grpc/byte_buffer.h"
#include "common/grpc/channel_args.h"
#include "common/grpc/server_defaults.h"
#include "common/grpc/status.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "teacher/stream_session.h"

namespace specstream::services {
namespace {

// The reactor of one StreamHiddenStates call: parses each request for its
// session and frames each message the session writes. It deletes itself in
// OnDone; the session (held by the core and by compute jobs) may outlive
// it, and never calls it after Finish.
class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            public teacher::StreamCall {
 public:
  StreamReactor(teacher::TeacherCore& core, grpc::CallbackServerContext* context)
      : core_(core), session_(core.NewSession(this, context->peer())) {
    // The verdict may come later, on another thread (a job token the
    // teacher has not heard of yet): the session then starts reading, or
    // finishes the call. The session outlives this reactor if need be.
    core.AdmitStream(session_.get(), BearerToken(*context).value_or(""),
                     [session = session_](absl::Status verdict) { session->Begin(verdict); });
  }

  // teacher::StreamCall, called under the session's lock.
  absl::Status StartWrite(const StreamMessage& message) override {
    if (message.is_chunk) {
      out_ =
          FramePayloadChunk(message.request_id, message.offset, message.data, message.data_owner);
    } else {
      ASSIGN_OR_RETURN(out_, SerializeToByteBuffer(message.message));
    }
    grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>::StartWrite(&out_);
    return absl::OkStatus();
  }
  void Finish(const absl::Status& status) override {
    grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>::Finish(ToGrpcStatus(status));
  }
  void StartReading() override { StartRead(&in_); }

  // gRPC.
  void OnReadDone(bool ok) override {
    if (!ok) {
      session_->OnReadsDone();
      return;
    }
    v1::StreamRequest request;
    grpc::ProtoBufferReader reader(&in_);
    const bool parsed = reader.status().ok() && request.ParseFromZeroCopyStream(&reader);
    in_.Clear();
    if (!parsed) {
      session_->OnMalformedRequest();
    } else if (session_->OnRequest(request)) {
      StartRead(&in_);
    }
  }
  void OnWriteDone(bool ok) override {
    out_.Clear();  // the session starts no write before it hears of this one
    session_->OnWriteDone(ok);
  }
  void OnCancel() override { session_->OnCancel(); }
  void OnDone() override {
    int64_t samples_sent = 0;
    const absl::Status status = session_->OnDone(&samples_sent);
    SS_LOG_INFO("teacher stream from {} ended: {} sample(s) sent{}", session_->peer(), samples_sent,
                status.ok() ? "" : absl::StrCat(", ", status.ToString()));
    core_.SessionDone(session_.get());
    delete this;
  }

 private:
  teacher::TeacherCore& core_;
  std::shared_ptr<teacher::StreamSession> session_;
  grpc::ByteBuffer in_;   // owned by the one read in flight
  grpc::ByteBuffer out_;  // owned by the one write in flight
};

}  // namespace

grpc::ServerUnaryReactor* TeacherService::Describe(grpc::CallbackServerContext* context,
                                                   const v1::DescribeRequest* /*request*/,
                                                   v1::DescribeResponse* response) {
  // Describe names the host, its boot id and the model: only for clients
  // the teacher would stream to. gRPC keeps `response` alive until Finish.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_.Admit(BearerToken(*context).value_or(""), context->peer(),
              [this, reactor, response](absl::Status verdict) {
                if (verdict.ok()) *response = core_.description();
                reactor->Finish(ToGrpcStatus(verdict));
              });
  return reactor;
}

grpc::ServerUnaryReactor* TeacherService::Answer(grpc::CallbackServerContext* context,
                                                 const v1::AnswerRequest* request,
                                                 v1::AnswerResponse* response) {
  // gRPC keeps `request` and `response` alive until Finish.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  core_.Admit(BearerToken(*context).value_or(""), context->peer(),
              [this, reactor, request, response](absl::Status verdict) {
                if (!verdict.ok()) return reactor->Finish(ToGrpcStatus(verdict));
                core_.Answer(
                    *request, [reactor, response](absl::StatusOr<std::vector<int32_t>> answer) {
                      if (answer.ok()) {
                        response->mutable_answer_ids()->Add(answer->begin(), answer->end());
                      }
                      reactor->Finish(ToGrpcStatus(answer.status()));
                    });
              });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TeacherService::StreamHiddenStates(
    grpc::CallbackServerContext* context) {
  return new StreamReactor(core_, context);
}

teacher::TeacherServiceOptions::Authorizer TokenAuthorizer(std::string token) {
  return [token = std::move(token)](const std::string& presented,
                                    std::function<void(absl::Status)> done) {
    if (presented.empty()) return done(absl::UnauthenticatedError("missing bearer token"));
    done(TokenMatches(token, presented) ? absl::OkStatus()
                                        : absl::UnauthenticatedError("wrong bearer token"));
  };
}

// --- The server --------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TeacherServer>> TeacherServer::Start(teacher::TargetRuntime& runtime,
                                                                    TeacherServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: ", options.port, " not in [0, 65535]"));
  }
  if (options.host.empty()) return absl::InvalidArgumentError("host: empty");
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options.tls));
  std::unique_ptr<TeacherServer> server(new TeacherServer());
  ASSIGN_OR_RETURN(server->core_, teacher::TeacherCore::Create(runtime, options.service));
  teacher::TeacherCore& core = *server->core_;
  server->service_ = std::make_unique<TeacherService>(core);
  // Reflection asks what a stream does (TeacherCore::Admit: the token, the
  // per-peer limits); a job token not yet heard of waits for its verdict.
  server->reflection_ = std::make_unique<ReflectionService>(
      std::vector<std::string>{kTeacherServiceName}, [&core](grpc::ServerContext& context) {
        absl::Notification decided;
        absl::Status verdict;
        core.Admit(BearerToken(context).value_or(""), context.peer(), [&](absl::Status status) {
          verdict = std::move(status);
          decided.Notify();
        });
        decided.WaitForNotification();
        return ToGrpcStatus(verdict);
      });

  EnableServerDefaults();
  const std::string listen = ListenAddress(options.host, options.port);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, credentials, &port);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->reflection_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<uint64_t>(core.max_request_bytes(), INT_MAX)));
  builder.SetMaxSendMessageSize(
      static_cast<int>(std::min<uint64_t>(core.max_message_bytes(), INT_MAX)));
  AddServerArguments(builder,
                     KeepaliveServerArguments(options.keepalive_time, options.keepalive_timeout));
  AddServerArguments(builder, BulkPayloadServerArguments(options.service.chunk_bytes));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (in use or not local?)"));
  }
  server->port_ = port;
  server->address_ = ListenAddress(options.host, port);
  SetServing(*server->server_, true, {kTeacherServiceName});
  SS_LOG_INFO("teacher server: listening on {}", server->address_);
  return server;
}

TeacherServer::~TeacherServer() { Shutdown(absl::ZeroDuration()); }

void TeacherServer::Shutdown(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  // gRPC's deadlines are on the real clock.
  const absl::Time deadline = Env::Default().Now() + timeout;
  SetServing(*server_, false);
  core_->StartDraining();
  if (!core_->WaitUntilIdle(timeout)) {
    SS_LOG_WARN("teacher server: streams still open after {}; cancelling them",
                absl::FormatDuration(timeout));
  }
  // Refuses new calls at once and cancels calls still open at the deadline.
  server_->Shutdown(absl::ToChronoTime(std::max(deadline, Env::Default().Now())));
  core_->Stop();
  const teacher::TeacherCore::Stats stats = core_->stats();
  SS_LOG_INFO("teacher server: shut down ({} stream(s), {} sample(s) sent, {} sample error(s))",
              stats.streams, stats.samples_sent, stats.sample_errors);
}

}  // namespace specstream::services
