// A daemon's side of the coordinator's RegistryService: register, then
// heartbeat every interval the coordinator asks for; register again when the
// coordinator does not know us (it restarted or declared us lost) and keep
// retrying while it is unreachable. The daemon plugs in through callbacks.
//
// Output handed to a heartbeat that fails is kept and sent with the next one,
// so log lines survive a coordinator restart.
//
// Thread-safety: the callbacks run on the registration thread, one at a
// time; they must not block for long.
#ifndef SPECSTREAM_SERVICES_DAEMON_REGISTRATION_H_
#define SPECSTREAM_SERVICES_DAEMON_REGISTRATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/grpc/auth.h"
#include "specstream/v1/coordinator.pb.h"

namespace specstream::services {

struct RegistrationOptions {
  std::string coordinator;  // host:port
  std::string token;        // bearer token ("" when the coordinator has none)
  TlsClientFiles tls;
  v1::DaemonInfo info;
  double rpc_timeout_seconds = 5;
  // Fills RegisterRequest.ranks: what the daemon still runs.
  std::function<void(v1::RegisterRequest&)> fill_register;
  // Fills HeartbeatRequest.ranks and .output.
  std::function<void(v1::HeartbeatRequest&)> fill_heartbeat;
  // Every heartbeat reply.
  std::function<void(const v1::HeartbeatResponse&)> on_reply;
  // The clock of the backoff, the heartbeat interval and Drain's timeout
  // (null: Env::Default()).
  Env* clock = nullptr;
};

class Registration final {
 public:
  // Validates the options and starts the thread; does not wait for the
  // coordinator (a daemon may start first).
  static absl::StatusOr<std::unique_ptr<Registration>> Start(RegistrationOptions options);
  ~Registration();  // stops the thread (no deregistration: the coordinator
                    // notices the silence)
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // "" until registered.
  std::string daemon_id() const;
  // Sends the next heartbeat now rather than after the interval.
  void Poke();
  // Marks every following heartbeat `draining` (the daemon is shutting
  // down) and waits up to `timeout` for one to be acknowledged; true when
  // the coordinator has heard it.
  bool Drain(absl::Duration timeout);

 private:
  struct Impl;
  explicit Registration(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The job tokens a teacher daemon admits: those of the running jobs it was
// assigned to, known by their hashes (HeartbeatResponse.job_token_hashes),
// replaced with every heartbeat reply. Admission never blocks a thread: an
// unknown token may belong to a job that started after the last reply, so
// it waits (as a callback, with a deadline) for the next replies.
// Thread-safe; callbacks run on the caller's thread, the registration
// thread (Replace) or the set's own timer thread, never under its lock.
class JobTokenSet final {
 public:
  // `clock` (null: Env::Default()) times the admissions' waits.
  explicit JobTokenSet(Env* clock = nullptr);
  // Close().
  ~JobTokenSet();
  JobTokenSet(const JobTokenSet&) = delete;
  JobTokenSet& operator=(const JobTokenSet&) = delete;

  void Replace(const v1::HeartbeatResponse& reply);
  // What Admit calls to ask for an early heartbeat (e.g. Registration::Poke);
  // cleared with {} before the registration goes away.
  void SetPoke(std::function<void()> poke);
  // Calls `done` once: OK when `token` belongs to an assigned running job;
  // for an unknown token, pokes and waits up to `wait` for a reply that
  // holds it, then UNAUTHENTICATED. UNAVAILABLE once closed.
  void Admit(const std::string& token, absl::Duration wait, std::function<void(absl::Status)> done);
  // Refuses every waiting admission (UNAVAILABLE) and any later one, and
  // stops the timer thread. Idempotent; call before what the callbacks use
  // goes away.
  void Close();

 private:
  struct Waiter {
    std::string hash;
    absl::Time deadline;
    std::function<void(absl::Status)> done;
  };
  void TimerLoop();

  Env& clock_;
  absl::Mutex mu_;
  std::vector<std::string> hashes_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiting_ ABSL_GUARDED_BY(mu_);
  std::function<void()> poke_ ABSL_GUARDED_BY(mu_);
  uint64_t added_ ABSL_GUARDED_BY(mu_) = 0;  // waiters ever added (wakes the timer)
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;  // started last: it reads the members above
};

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_DAEMON_REGISTRATION_H_
