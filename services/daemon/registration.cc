#include "services/daemon/registration.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/grpc/auth.h"
#include "common/grpc/channel_args.h"
#include "common/logging.h"
#include "grpcpp/create_channel.h"
#include "specstream/v1/coordinator.grpc.pb.h"

namespace specstream::services {
namespace {

constexpr size_t kMaxPendingLines = 20000;

}  // namespace

struct Registration::Impl {
  RegistrationOptions options;
  std::unique_ptr<v1::RegistryService::Stub> stub;
  std::thread thread;

  mutable absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool poked ABSL_GUARDED_BY(mu) = false;
  bool draining ABSL_GUARDED_BY(mu) = false;
  bool drain_acknowledged ABSL_GUARDED_BY(mu) = false;
  std::string daemon_id ABSL_GUARDED_BY(mu);

  // Output of failed heartbeats, resent first.
  std::vector<v1::RankOutput> pending_output;
  absl::Duration interval = absl::Seconds(1);

  std::unique_ptr<grpc::ClientContext> NewContext() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(options.rpc_timeout_seconds * 1000)));
    AddBearer(*context, options.token);
    return context;
  }

  // Sleeps `d` or until stopping or poked; true when stopping.
  bool Sleep(absl::Duration d) {
    absl::MutexLock lock(&mu);
    auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return stopping || poked; };
    Env::Or(options.clock).AwaitWithTimeout(mu, absl::Condition(&wake), d);
    poked = false;
    return stopping;
  }

  bool TryRegister() {
    v1::RegisterRequest request;
    *request.mutable_info() = options.info;
    if (options.fill_register) options.fill_register(request);
    v1::RegisterResponse response;
    auto context = NewContext();
    grpc::Status status = stub->Register(context.get(), request, &response);
    if (!status.ok()) {
      SS_LOG_WARN("coordinator {}: register failed: {} ({})", options.coordinator,
                  status.error_message(), static_cast<int>(status.error_code()));
      return false;
    }
    if (response.heartbeat_interval_ms() > 0) {
      interval = absl::Milliseconds(response.heartbeat_interval_ms());
    }
    SS_LOG_INFO("registered with coordinator {} as {}", options.coordinator, response.daemon_id());
    absl::MutexLock lock(&mu);
    daemon_id = response.daemon_id();
    return true;
  }

  // Keeps at most kMaxPendingLines log lines of undelivered output, dropping
  // the oldest (a long coordinator outage must not grow the daemon without
  // bound, nor make heartbeats too large to deliver).
  void KeepPending(google::protobuf::RepeatedPtrField<v1::RankOutput>& outputs) {
    for (auto& output : outputs) pending_output.push_back(std::move(output));
    size_t lines = 0;
    for (const auto& output : pending_output) lines += output.logs_size();
    size_t dropped = 0;
    for (auto& output : pending_output) {
      if (lines <= kMaxPendingLines) break;
      const size_t cut =
          std::min(lines - kMaxPendingLines, static_cast<size_t>(output.logs_size()));
      output.mutable_logs()->DeleteSubrange(0, static_cast<int>(cut));
      lines -= cut;
      dropped += cut;
    }
    if (dropped > 0) {
      SS_LOG_WARN("coordinator unreachable: dropped {} undelivered log lines", dropped);
    }
  }

  // false: the coordinator does not know us any more (register again).
  bool Heartbeat(const std::string& id) {
    v1::HeartbeatRequest request;
    request.set_daemon_id(id);
    for (auto& output : pending_output) *request.add_output() = std::move(output);
    pending_output.clear();
    if (options.fill_heartbeat) options.fill_heartbeat(request);
    {
      absl::MutexLock lock(&mu);
      request.set_draining(draining);
    }
    v1::HeartbeatResponse response;
    auto context = NewContext();
    grpc::Status status = stub->Heartbeat(context.get(), request, &response);
    if (status.ok()) {
      if (options.on_reply) options.on_reply(response);
      if (request.draining()) {
        absl::MutexLock lock(&mu);
        drain_acknowledged = true;
      }
      return true;
    }
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // Too large to deliver: drop the output rather than retry it forever.
      SS_LOG_WARN("heartbeat too large ({} bytes); dropping its output", request.ByteSizeLong());
    } else {
      // Keep what did not get through for the next heartbeat.
      KeepPending(*request.mutable_output());
    }
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      SS_LOG_WARN("coordinator {} does not know daemon {}; registering again", options.coordinator,
                  id);
      return false;
    }
    SS_LOG_DEBUG("heartbeat failed: {}", status.error_message());
    return true;
  }

  void Loop() {
    Backoff backoff = ControlPlaneBackoff();
    while (true) {
      std::string id;
      {
        absl::MutexLock lock(&mu);
        if (stopping) return;
        id = daemon_id;
      }
      if (id.empty()) {
        if (TryRegister()) {
          backoff.Reset();
          continue;
        }
        if (Sleep(backoff.delay())) return;
        backoff.Grow();
        continue;
      }
      if (!Heartbeat(id)) {
        absl::MutexLock lock(&mu);
        daemon_id.clear();
        continue;
      }
      if (Sleep(interval)) return;
    }
  }
};

absl::StatusOr<std::unique_ptr<Registration>> Registration::Start(RegistrationOptions options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator: address required (host:port)");
  }
  if (options.info.kind() == v1::DAEMON_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError("daemon kind must be teacher or student");
  }
  auto credentials = MakeChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  auto impl = std::make_unique<Impl>();
  impl->stub = v1::RegistryService::NewStub(grpc::CreateCustomChannel(
      options.coordinator, *credentials, CoordinatorChannelArguments(kMaxControlMessageBytes)));
  impl->options = std::move(options);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<Registration>(new Registration(std::move(impl)));
}

Registration::Registration(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Registration::~Registration() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  impl_->thread.join();
}

void Registration::Poke() {
  absl::MutexLock lock(&impl_->mu);
  impl_->poked = true;
}

JobTokenSet::JobTokenSet(Env* clock) : clock_(Env::Or(clock)), timer_([this] { TimerLoop(); }) {}

JobTokenSet::~JobTokenSet() { Close(); }

void JobTokenSet::Replace(const v1::HeartbeatResponse& reply) {
  std::vector<Waiter> admitted;
  {
    absl::MutexLock lock(&mu_);
    hashes_.assign(reply.job_token_hashes().begin(), reply.job_token_hashes().end());
    // Waiters whose job is now known are admitted; the others keep waiting
    // for their deadline (this reply may predate their job).
    std::vector<Waiter> still;
    for (Waiter& w : waiting_) {
      const bool known = std::find(hashes_.begin(), hashes_.end(), w.hash) != hashes_.end();
      (known ? admitted : still).push_back(std::move(w));
    }
    waiting_.swap(still);
  }
  for (Waiter& w : admitted) w.done(absl::OkStatus());
}

void JobTokenSet::SetPoke(std::function<void()> poke) {
  absl::MutexLock lock(&mu_);
  poke_ = std::move(poke);
}

void JobTokenSet::Admit(const std::string& token, absl::Duration wait,
                        std::function<void(absl::Status)> done) {
  if (token.empty()) {
    return done(absl::UnauthenticatedError("missing bearer token (a job token)"));
  }
  std::string hash = TokenHash(token);
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return done(absl::UnavailableError("the teacher is shutting down"));
    if (std::find(hashes_.begin(), hashes_.end(), hash) == hashes_.end()) {
      waiting_.push_back(Waiter{std::move(hash), clock_.Now() + wait, std::move(done)});
      ++added_;
      if (poke_) poke_();
      return;
    }
  }
  done(absl::OkStatus());
}

void JobTokenSet::Close() {
  std::vector<Waiter> refused;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    refused.swap(waiting_);
  }
  for (Waiter& w : refused) w.done(absl::UnavailableError("the teacher is shutting down"));
  timer_.join();
}

void JobTokenSet::TimerLoop() {
  mu_.Lock();
  while (!closed_) {
    absl::Time next = absl::InfiniteFuture();
    for (const Waiter& w : waiting_) next = std::min(next, w.deadline);
    // Woken by Close, or by a new waiter (its deadline may be the earliest).
    const uint64_t seen = added_;
    auto changed = [this, seen]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || added_ != seen; };
    clock_.AwaitWithDeadline(mu_, absl::Condition(&changed), next);
    const absl::Time now = clock_.Now();
    std::vector<Waiter> expired;
    std::vector<Waiter> still;
    for (Waiter& w : waiting_) (w.deadline <= now ? expired : still).push_back(std::move(w));
    waiting_.swap(still);
    if (expired.empty()) continue;
    mu_.Unlock();
    for (Waiter& w : expired) {
      w.done(absl::UnauthenticatedError("the token belongs to no running job of this teacher"));
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

bool Registration::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&impl_->mu);
  impl_->draining = true;
  impl_->poked = true;
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(impl_->mu) {
    return impl_->drain_acknowledged || impl_->stopping;
  };
  return Env::Or(impl_->options.clock)
             .AwaitWithTimeout(impl_->mu, absl::Condition(&done), timeout) &&
         impl_->drain_acknowledged;
}

std::string Registration::daemon_id() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->daemon_id;
}

}  // namespace specstream::services
