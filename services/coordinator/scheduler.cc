#include "services/coordinator/scheduler.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/auth.h"
#include "common/jobspec/job_spec.h"
#include "common/logging.h"
#include "common/status.h"

namespace specstream::services {
namespace {

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_STOPPED;
}

// Job ids name directories on the daemons' hosts: keep them to a safe set.
absl::Status ValidateJobId(const std::string& id) {
  if (id.empty() || id.size() > 128) {
    return absl::InvalidArgumentError("id: must be 1 to 128 characters");
  }
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("id: \"", id, "\" may hold only letters, digits, '-', '_' and '.'"));
    }
  }
  if (id[0] == '.') return absl::InvalidArgumentError("id: must not start with '.'");
  return absl::OkStatus();
}

std::string DefaultJobId(const std::string& name) {
  std::string base;
  for (char c : name) {
    base.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '-');
  }
  if (base.empty()) base = "job";
  if (base.size() > 64) base.resize(64);
  return absl::StrCat(base, "-", RandomToken(4));
}

// List page tokens: "j1." + the submission number (ord) to continue below,
// web-safe base64 so clients treat it as opaque. "j1" versions the format.
constexpr absl::string_view kPageTokenPrefix = "j1.";

std::string PageToken(int64_t before_ord) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, before_ord));
}

absl::StatusOr<int64_t> ParsePageToken(const std::string& token) {
  std::string decoded;
  if (absl::WebSafeBase64Unescape(token, &decoded)) {
    absl::string_view text = decoded;
    int64_t before_ord = 0;
    if (absl::ConsumePrefix(&text, kPageTokenPrefix) && absl::SimpleAtoi(text, &before_ord) &&
        before_ord > 0) {
      return before_ord;
    }
  }
  return absl::InvalidArgumentError(
      "page_token: malformed (pass a next_page_token from a previous List, or none)");
}

// How long a lost daemon stays listed (ListDaemons, /metrics).
constexpr absl::Duration kForgetLostAfter = absl::Hours(1);

const char* StateLabel(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED:
      return "queued";
    case v1::JOB_STATE_RUNNING:
      return "running";
    case v1::JOB_STATE_SUCCEEDED:
      return "succeeded";
    case v1::JOB_STATE_FAILED:
      return "failed";
    case v1::JOB_STATE_STOPPED:
      return "stopped";
    default:
      return "unspecified";
  }
}

struct Daemon {
  v1::DaemonStatus status;  // id == info.name
  absl::Time last_heartbeat;
  std::vector<v1::RankStatus> ranks;  // as last reported
  bool draining = false;              // shutting down: no new ranks

  bool lost() const { return status.state() == v1::DAEMON_STATE_LOST; }
  bool HasLiveChild() const {
    return std::any_of(ranks.begin(), ranks.end(),
                       [](const v1::RankStatus& r) { return !r.exited(); });
  }
  bool Free() const {
    return status.info().kind() == v1::DAEMON_KIND_STUDENT && !lost() && !draining &&
           status.job_id().empty() && !HasLiveChild();
  }
};

struct ActiveJob {
  v1::Job job;
  // The job token, in memory only: students present it to teachers. Empty
  // after a coordinator restart (the store keeps only `token_hash`); ranks
  // already running still hold it, and a rank that has yet to start gets
  // a new attempt with a new token.
  std::string token;
  std::string token_hash;   // TokenHash(token): what teachers check
  int32_t master_port = 0;  // rank 0's rendezvous port, once reported
  std::set<int> reported;   // ranks of this attempt their daemon reported
  // An attempt that is ending: its ranks are stopped; at `decide_at` it
  // restarts (a daemon was lost) or fails.
  bool ending = false;
  absl::Time decide_at;
  std::string failure;  // the first non-zero exit
  std::string lost;     // the first lost daemon
  // After a coordinator restart: placements no daemon claims by then are lost.
  absl::Time claim_deadline = absl::InfinitePast();
};

}  // namespace

struct Scheduler::State {
  SchedulerOptions options;
  absl::Mutex mu;
  absl::CondVar events_changed;
  std::map<std::string, Daemon> daemons ABSL_GUARDED_BY(mu);
  std::map<std::string, ActiveJob> active ABSL_GUARDED_BY(mu);
  std::vector<std::string> fifo ABSL_GUARDED_BY(mu);  // active ids, oldest first

  absl::Time Now() const { return Env::Or(options.env).Now(); }

  // Writes the job (and events) through to the store and wakes watchers. A
  // store failure is logged: the in-memory state stays authoritative until
  // the next write succeeds.
  void Persist(ActiveJob& aj, std::vector<v1::JobEvent> events = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto& e : events) e.set_job_id(aj.job.id());
    absl::Status status = options.store->Update(aj.job, &events);
    if (!status.ok()) SS_LOG_ERROR("job store: {}", std::string(status.message()));
    events_changed.SignalAll();
  }

  void Transition(ActiveJob& aj, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    v1::Job& job = aj.job;
    job.set_state(state);
    job.set_reason(reason);
    const int64_t now_ms = absl::ToUnixMillis(Now());
    if (state == v1::JOB_STATE_RUNNING && job.started_unix_ms() == 0) {
      job.set_started_unix_ms(now_ms);
    }
    if (IsTerminal(state)) {
      job.set_finished_unix_ms(now_ms);
      ReleaseDaemons(job.id());
    }
    v1::JobEvent event;
    event.set_unix_ms(now_ms);
    v1::StateChange* change = event.mutable_state();
    change->set_state(state);
    change->set_reason(reason);
    change->set_attempt(job.attempt());
    SS_LOG_INFO("job {}: {} ({})", job.id(), StateLabel(state), reason);
    Persist(aj, {event});
  }

  void ReleaseDaemons(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto& [id, daemon] : daemons) {
      if (daemon.status.job_id() == job_id) {
        daemon.status.clear_job_id();
        daemon.status.set_rank(0);
        if (!daemon.lost()) daemon.status.set_state(v1::DAEMON_STATE_IDLE);
      }
    }
  }

  // Drops finished jobs from the active set (they live on in the store).
  void Sweep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto it = fifo.begin(); it != fifo.end();) {
      auto job = active.find(*it);
      if (job != active.end() && IsTerminal(job->second.job.state())) {
        active.erase(job);
        it = fifo.erase(it);
      } else {
        ++it;
      }
    }
  }

  void EndAttempt(ActiveJob& aj, absl::Time decide_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!aj.ending) {
      aj.ending = true;
      aj.decide_at = decide_at;
    } else {
      aj.decide_at = std::min(aj.decide_at, decide_at);
    }
  }

  void MarkLost(ActiveJob& aj, const std::string& why, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (aj.lost.empty()) aj.lost = why;
    EndAttempt(aj, now);
  }

  // A rank status from the daemon that runs it (heartbeat or registration).
  void ApplyRankStatus(Daemon& daemon, const v1::RankStatus& status, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = active.find(status.job_id());
    if (it == active.end()) return;
    ActiveJob& aj = it->second;
    v1::Job& job = aj.job;
    if (job.state() != v1::JOB_STATE_RUNNING || status.attempt() != job.attempt() ||
        status.rank() < 0 || status.rank() >= job.ranks_size()) {
      return;
    }
    v1::RankPlacement& placement = *job.mutable_ranks(status.rank());
    if (placement.daemon_id() != daemon.status.id()) return;
    daemon.status.set_job_id(job.id());
    daemon.status.set_rank(status.rank());
    daemon.status.set_state(v1::DAEMON_STATE_BUSY);
    aj.reported.insert(status.rank());
    if (status.rank() == 0 && status.master_port() > 0) aj.master_port = status.master_port();
    if (!status.exited() || placement.exited()) return;
    placement.set_exited(true);
    placement.set_exit_code(status.exit_code());
    v1::JobEvent event;
    event.mutable_log()->set_rank(status.rank());
    event.mutable_log()->set_stream("daemon");
    event.mutable_log()->set_text(absl::StrCat("rank ", status.rank(), " on ", daemon.status.id(),
                                               " exited with code ", status.exit_code()));
    Persist(aj, {event});
    if (status.exit_code() != 0) {
      if (status.exit_code() == 128 + SIGKILL && !aj.ending) {
        // Killed from outside (the OOM killer, a node agent) while the
        // attempt was healthy, not a failure of the run: restart from the
        // checkpoint, like a lost daemon. (A rank its daemon had to kill
        // while the attempt was ending for another reason changes nothing.)
        MarkLost(aj,
                 absl::StrCat("rank ", status.rank(), " on ", daemon.status.id(),
                              " was killed (SIGKILL; out of memory?)"),
                 now);
        return;
      }
      if (aj.failure.empty()) {
        aj.failure = absl::StrCat("rank ", status.rank(), " exited with code ", status.exit_code(),
                                  status.reason().empty() ? "" : ": ", status.reason());
      }
      // A lost peer usually shows first as a failing rank: wait for the
      // registry to tell the two apart before deciding.
      EndAttempt(aj, now + options.lost_after);
      return;
    }
    bool all_ok = std::all_of(job.ranks().begin(), job.ranks().end(),
                              [](const auto& p) { return p.exited() && p.exit_code() == 0; });
    if (all_ok && !aj.ending) {
      Transition(aj, v1::JOB_STATE_SUCCEEDED,
                 absl::StrCat("all ", job.ranks_size(), " ranks exited 0"));
    }
  }

  void ApplyOutput(const v1::RankOutput& output) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = active.find(output.job_id());
    if (it == active.end()) return;
    ActiveJob& aj = it->second;
    std::vector<v1::JobEvent> events;
    for (const v1::LogLine& line : output.logs()) {
      v1::JobEvent& e = events.emplace_back();
      *e.mutable_log() = line;
      e.mutable_log()->set_rank(output.rank());
    }
    for (const v1::JobMetrics& metrics : output.metrics()) {
      *events.emplace_back().mutable_metrics() = metrics;
      if (output.attempt() == aj.job.attempt()) *aj.job.mutable_metrics() = metrics;
    }
    if (!events.empty()) Persist(aj, std::move(events));
  }

  v1::RankAssignment Assignment(const ActiveJob& aj, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const v1::Job& job = aj.job;
    v1::RankAssignment a;
    a.set_job_id(job.id());
    a.set_attempt(job.attempt());
    a.set_rank(rank);
    a.set_world_size(job.world_size());
    *a.mutable_spec() = job.spec();
    a.mutable_spec()->mutable_data()->clear_teachers();
    for (const auto& t : job.teachers()) a.mutable_spec()->mutable_data()->add_teachers(t);
    auto master = daemons.find(job.ranks(0).daemon_id());
    a.set_master_addr(master != daemons.end() && !master->second.status.info().host().empty()
                          ? master->second.status.info().host()
                          : "127.0.0.1");
    a.set_master_port(rank == 0 ? 0 : aj.master_port);
    a.set_resume(job.attempt() > 0);
    a.set_job_token(aj.token);
    return a;
  }

  // Ranks the daemon reports that it should not run (any more).
  void StaleRanks(const Daemon& daemon, v1::HeartbeatResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const v1::RankStatus& status : daemon.ranks) {
      if (status.exited()) continue;
      auto it = active.find(status.job_id());
      bool keep = false;
      if (it != active.end()) {
        const ActiveJob& aj = it->second;
        keep = aj.job.state() == v1::JOB_STATE_RUNNING && !aj.ending &&
               status.attempt() == aj.job.attempt() && status.rank() >= 0 &&
               status.rank() < aj.job.ranks_size() &&
               aj.job.ranks(status.rank()).daemon_id() == daemon.status.id();
      }
      if (!keep) *response.add_stop() = status;
    }
  }

  // Paths compare lexically normalised, without a trailing '/'.
  static std::string NormalizeModel(const std::string& model) {
    std::string out = std::filesystem::path(model).lexically_normal().string();
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    return out;
  }

  std::vector<std::string> TeachersFor(const std::string& target)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const std::string wanted = NormalizeModel(target);
    std::vector<std::string> out;
    for (const auto& [id, daemon] : daemons) {
      const v1::DaemonInfo& info = daemon.status.info();
      if (info.kind() != v1::DAEMON_KIND_TEACHER || daemon.lost()) continue;
      if (NormalizeModel(info.model()) == wanted ||
          (!info.model_name().empty() && info.model_name() == target)) {
        out.push_back(info.address());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // Starts the job when the gang and its teachers are available; otherwise
  // records what it waits for and returns false.
  bool TryStart(ActiveJob& aj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    v1::Job& job = aj.job;
    std::vector<Daemon*> free;
    for (auto& [id, daemon] : daemons) {
      if (daemon.Free()) free.push_back(&daemon);
    }
    std::string waiting;
    std::vector<std::string> teachers(job.spec().data().teachers().begin(),
                                      job.spec().data().teachers().end());
    if (static_cast<int>(free.size()) < job.world_size()) {
      int live = 0;
      for (const auto& [id, daemon] : daemons) {
        live += daemon.status.info().kind() == v1::DAEMON_KIND_STUDENT && !daemon.lost();
      }
      waiting = absl::StrCat("waiting for ", job.world_size(), " free student daemons (",
                             free.size(), " free, ", live, " live)");
    } else if (!job.spec().data().tokenized().empty() && teachers.empty()) {
      teachers = TeachersFor(job.spec().model().target());
      if (teachers.empty()) {
        std::vector<std::string> served;
        for (const auto& [id, daemon] : daemons) {
          const v1::DaemonInfo& info = daemon.status.info();
          if (info.kind() == v1::DAEMON_KIND_TEACHER && !daemon.lost()) {
            served.push_back(info.model_name().empty() ? info.model() : info.model_name());
          }
        }
        waiting = absl::StrCat(
            "waiting for a teacher serving ", job.spec().model().target(),
            served.empty()
                ? " (no live teachers)"
                : absl::StrCat(" (live teachers serve: ", absl::StrJoin(served, ", "), ")"));
      }
    }
    if (!waiting.empty()) {
      if (job.reason() != waiting) {
        job.set_reason(waiting);
        Persist(aj);
      }
      return false;
    }
    job.clear_ranks();
    std::vector<std::string> names;
    for (int rank = 0; rank < job.world_size(); ++rank) {
      Daemon& daemon = *free[rank];
      v1::RankPlacement* placement = job.add_ranks();
      placement->set_rank(rank);
      placement->set_daemon_id(daemon.status.id());
      placement->set_daemon_name(daemon.status.info().name());
      daemon.status.set_job_id(job.id());
      daemon.status.set_rank(rank);
      daemon.status.set_state(v1::DAEMON_STATE_BUSY);
      names.push_back(daemon.status.id());
    }
    job.clear_teachers();
    for (const auto& t : teachers) job.add_teachers(t);
    if (aj.token.empty()) {
      // A job recovered after a coordinator restart starts this attempt
      // with a new token (the store has only the old one's hash).
      aj.token = RandomToken(16);
      aj.token_hash = TokenHash(aj.token);
      if (absl::Status s = options.store->SetTokenHash(job.id(), aj.token_hash); !s.ok()) {
        SS_LOG_ERROR("job store: {}", std::string(s.message()));
      }
    }
    aj.master_port = 0;
    aj.reported.clear();
    aj.ending = false;
    aj.failure.clear();
    aj.lost.clear();
    aj.claim_deadline = absl::InfinitePast();
    Transition(aj, v1::JOB_STATE_RUNNING,
               absl::StrCat("attempt ", job.attempt(), " on ", absl::StrJoin(names, ", "),
                            teachers.empty() ? "" : "; teachers ", absl::StrJoin(teachers, ", ")));
    return true;
  }

  // `why` by value: it may be aj.lost, which is cleared here.
  void Restart(ActiveJob& aj, std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    v1::Job& job = aj.job;
    if (job.attempt() >= job.max_restarts()) {
      Transition(aj, v1::JOB_STATE_FAILED,
                 absl::StrCat(why, "; max_restarts (", job.max_restarts(), ") used up"));
      return;
    }
    ReleaseDaemons(job.id());
    job.set_attempt(job.attempt() + 1);
    job.clear_ranks();
    aj.master_port = 0;
    aj.reported.clear();
    aj.ending = false;
    aj.failure.clear();
    aj.lost.clear();
    Transition(aj, v1::JOB_STATE_QUEUED,
               absl::StrCat("restart ", job.attempt(), " of ", job.max_restarts(),
                            " from the latest checkpoint after: ", why));
  }

  void TickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const absl::Time now = Now();
    for (auto it = daemons.begin(); it != daemons.end();) {
      Daemon& daemon = it->second;
      // Lost daemons are forgotten after a while (names with a pid come
      // and go); one that still holds a placement stays until its job moves.
      if (daemon.lost() && daemon.status.job_id().empty() &&
          now - daemon.last_heartbeat > kForgetLostAfter) {
        it = daemons.erase(it);
        continue;
      }
      if (!daemon.lost() && now - daemon.last_heartbeat > options.lost_after) {
        daemon.status.set_state(v1::DAEMON_STATE_LOST);
        SS_LOG_WARN("daemon {} lost: no heartbeat for {}", it->first,
                    absl::FormatDuration(now - daemon.last_heartbeat));
      }
      ++it;
    }
    for (const std::string& id : fifo) {
      ActiveJob& aj = active.at(id);
      if (aj.job.state() != v1::JOB_STATE_RUNNING) continue;
      for (const v1::RankPlacement& placement : aj.job.ranks()) {
        if (placement.exited()) continue;
        auto daemon = daemons.find(placement.daemon_id());
        if (daemon != daemons.end() && daemon->second.lost()) {
          MarkLost(aj,
                   absl::StrCat("student daemon ", placement.daemon_id(),
                                " lost while running rank ", placement.rank()),
                   now);
        } else if (daemon == daemons.end() && now > aj.claim_deadline) {
          MarkLost(aj,
                   absl::StrCat("student daemon ", placement.daemon_id(),
                                " did not re-register with rank ", placement.rank()),
                   now);
        } else if (daemon != daemons.end() && now > aj.claim_deadline &&
                   (daemon->second.status.job_id() != aj.job.id() ||
                    daemon->second.status.rank() != placement.rank())) {
          // It came back (after our restart, or its own) without the rank.
          MarkLost(aj,
                   absl::StrCat("student daemon ", placement.daemon_id(),
                                " re-registered without rank ", placement.rank()),
                   now);
        }
      }
    }
    for (const std::string& id : fifo) {
      ActiveJob& aj = active.at(id);
      if (aj.job.state() != v1::JOB_STATE_RUNNING || !aj.ending || now < aj.decide_at) continue;
      if (!aj.lost.empty()) {
        Restart(aj, aj.lost);
      } else {
        Transition(aj, v1::JOB_STATE_FAILED, aj.failure);
      }
    }
    for (const std::string& id : fifo) {
      ActiveJob& aj = active.at(id);
      if (aj.job.state() != v1::JOB_STATE_QUEUED) continue;
      if (!TryStart(aj)) break;  // strict FIFO: later jobs wait behind it
    }
    Sweep();
  }
};

Scheduler::Scheduler(std::unique_ptr<State> state) : state_(std::move(state)) {}
Scheduler::~Scheduler() = default;

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(SchedulerOptions options) {
  if (options.store == nullptr) return absl::InvalidArgumentError("scheduler: store required");
  if (options.lost_after <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("scheduler: heartbeat interval and lost_after must be > 0");
  }
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, state->options.store->ListActive());
  const absl::Time now = state->Now();
  absl::MutexLock lock(&state->mu);
  for (v1::Job& job : jobs) {
    ActiveJob aj;
    ASSIGN_OR_RETURN(aj.token_hash, state->options.store->TokenHash(job.id()));
    aj.job = std::move(job);
    aj.claim_deadline = now + state->options.lost_after;
    // Exits recorded before the restart: the attempt was ending (or done).
    if (aj.job.state() == v1::JOB_STATE_RUNNING) {
      for (const v1::RankPlacement& placement : aj.job.ranks()) {
        if (placement.exited() && placement.exit_code() != 0 && aj.failure.empty()) {
          aj.failure =
              absl::StrCat("rank ", placement.rank(), " exited with code ", placement.exit_code());
          aj.ending = true;
          aj.decide_at = now + state->options.lost_after;
        }
      }
    }
    const std::string id = aj.job.id();
    SS_LOG_INFO("recovered job {} ({})", id, StateLabel(aj.job.state()));
    ActiveJob& recovered = state->active.emplace(id, std::move(aj)).first->second;
    state->fifo.push_back(id);
    const auto& ranks = recovered.job.ranks();
    if (recovered.job.state() == v1::JOB_STATE_RUNNING && !ranks.empty() &&
        std::all_of(ranks.begin(), ranks.end(),
                    [](const auto& p) { return p.exited() && p.exit_code() == 0; })) {
      state->Transition(recovered, v1::JOB_STATE_SUCCEEDED,
                        absl::StrCat("all ", ranks.size(), " ranks exited 0"));
    }
  }
  state->Sweep();
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(state)));
}

absl::StatusOr<v1::Job> Scheduler::Submit(const std::string& spec_yaml, const std::string& id) {
  // Every check comes before the one store write, and that write holds the
  // job with its first event: a refused spec leaves nothing behind, and an
  // accepted one is never stored half-made (without a state, say).
  ASSIGN_OR_RETURN(v1::JobSpec spec, jobspec::ParseJobSpecYaml(spec_yaml));
  v1::Job job;
  job.set_id(id.empty() ? DefaultJobId(spec.name()) : id);
  RETURN_IF_ERROR(ValidateJobId(job.id()));
  job.set_name(spec.name());
  job.set_spec_yaml(spec_yaml);
  const int64_t dp = std::max<int64_t>(spec.parallel().dp_size(), 1);
  job.set_world_size(static_cast<int32_t>(dp * spec.parallel().cp_size()));
  job.set_max_restarts(static_cast<int32_t>(spec.max_restarts()));
  *job.mutable_spec() = std::move(spec);
  const std::string reason =
      absl::StrCat("submitted; needs ", job.world_size(), " student daemons");
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_reason(reason);
  absl::MutexLock lock(&state_->mu);
  const int64_t now_ms = absl::ToUnixMillis(state_->Now());
  job.set_created_unix_ms(now_ms);
  std::vector<v1::JobEvent> events(1);
  events[0].set_unix_ms(now_ms);
  events[0].mutable_state()->set_state(v1::JOB_STATE_QUEUED);
  events[0].mutable_state()->set_reason(reason);
  events[0].mutable_state()->set_attempt(0);
  ActiveJob aj;
  aj.token = RandomToken(16);
  aj.token_hash = TokenHash(aj.token);
  RETURN_IF_ERROR(state_->options.store->Insert(job, aj.token_hash, &events));
  SS_LOG_INFO("job {}: {} ({})", job.id(), StateLabel(v1::JOB_STATE_QUEUED), reason);
  const std::string job_id = job.id();
  aj.job = std::move(job);
  state_->active.emplace(job_id, std::move(aj));
  state_->fifo.push_back(job_id);
  state_->events_changed.SignalAll();
  state_->TickLocked();
  auto it = state_->active.find(job_id);
  if (it != state_->active.end()) return it->second.job;
  return state_->options.store->Get(job_id);
}

absl::StatusOr<v1::Job> Scheduler::Get(const std::string& id) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->active.find(id);
  if (it != state_->active.end()) return it->second.job;
  return state_->options.store->Get(id);
}

absl::StatusOr<v1::ListJobsResponse> Scheduler::List(const v1::ListJobsRequest& request) {
  if (request.limit() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("limit: must be >= 0, got ", request.limit()));
  }
  int64_t before_ord = 0;
  if (!request.page_token().empty()) {
    ASSIGN_OR_RETURN(before_ord, ParsePageToken(request.page_token()));
  }
  absl::MutexLock lock(&state_->mu);
  ASSIGN_OR_RETURN(JobStore::Page page,
                   state_->options.store->ListPage(before_ord, request.limit(),
                                                   state_->options.list_page_bytes));
  v1::ListJobsResponse response;
  response.mutable_jobs()->Reserve(static_cast<int>(page.jobs.size()));
  for (v1::Job& job : page.jobs) {
    v1::Job* listed = response.add_jobs();
    auto it = state_->active.find(job.id());
    if (it == state_->active.end()) {
      *listed = std::move(job);
      continue;
    }
    // The in-memory state is the newer one; list it without its spec.
    *listed = it->second.job;
    listed->clear_spec_yaml();
    listed->clear_spec();
  }
  if (page.next_before_ord > 0) response.set_next_page_token(PageToken(page.next_before_ord));
  return response;
}

absl::StatusOr<v1::Job> Scheduler::Stop(const std::string& id, const std::string& reason) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->active.find(id);
  if (it == state_->active.end()) return state_->options.store->Get(id);
  state_->Transition(it->second, v1::JOB_STATE_STOPPED,
                     reason.empty() ? "stopped by request" : reason);
  v1::Job job = it->second.job;
  state_->TickLocked();
  return job;
}

absl::StatusOr<std::vector<v1::JobEvent>> Scheduler::WaitEvents(const std::string& id,
                                                                int64_t after_seq,
                                                                absl::Duration wait,
                                                                bool* finished) {
  Env& clock = Env::Or(state_->options.env);
  const absl::Time deadline = clock.Now() + wait;
  absl::MutexLock lock(&state_->mu);
  if (state_->active.count(id) == 0) RETURN_IF_ERROR(state_->options.store->Get(id).status());
  while (true) {
    ASSIGN_OR_RETURN(std::vector<v1::JobEvent> events,
                     state_->options.store->Events(id, after_seq, 1000));
    *finished = state_->active.count(id) == 0;
    if (!events.empty() || *finished) return events;
    if (clock.WaitWithDeadline(state_->events_changed, state_->mu, deadline)) return events;
  }
}

absl::StatusOr<v1::RegisterResponse> Scheduler::Register(const v1::RegisterRequest& request) {
  const v1::DaemonInfo& info = request.info();
  if (info.name().empty()) return absl::InvalidArgumentError("info.name: required");
  if (info.kind() == v1::DAEMON_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError("info.kind: must be teacher or student");
  }
  if (info.kind() == v1::DAEMON_KIND_TEACHER && info.address().empty()) {
    return absl::InvalidArgumentError("info.address: required for a teacher");
  }
  absl::MutexLock lock(&state_->mu);
  const absl::Time now = state_->Now();
  Daemon& daemon = state_->daemons[info.name()];
  // A daemon that comes back without the rank it was running restarted:
  // that rank is gone.
  const std::string old_job = daemon.status.job_id();
  const int old_rank = daemon.status.rank();
  daemon.status.Clear();
  daemon.status.set_id(info.name());
  *daemon.status.mutable_info() = info;
  daemon.status.set_state(v1::DAEMON_STATE_IDLE);
  daemon.last_heartbeat = now;
  daemon.status.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  daemon.ranks.assign(request.ranks().begin(), request.ranks().end());
  for (const v1::RankStatus& status : request.ranks()) {
    state_->ApplyRankStatus(daemon, status, now);
  }
  if (!old_job.empty() && daemon.status.job_id() != old_job) {
    auto it = state_->active.find(old_job);
    if (it != state_->active.end() && it->second.job.state() == v1::JOB_STATE_RUNNING &&
        it->second.reported.count(old_rank) > 0 && old_rank < it->second.job.ranks_size() &&
        !it->second.job.ranks(old_rank).exited()) {
      state_->MarkLost(
          it->second,
          absl::StrCat("student daemon ", info.name(), " restarted while running rank ", old_rank),
          now);
    } else if (it != state_->active.end()) {
      // Assigned but not started yet: keep the assignment.
      daemon.status.set_job_id(old_job);
      daemon.status.set_rank(old_rank);
      daemon.status.set_state(v1::DAEMON_STATE_BUSY);
    }
  }
  SS_LOG_INFO("daemon {} registered ({} at {}, {} ranks reported)", info.name(),
              info.kind() == v1::DAEMON_KIND_TEACHER ? "teacher" : "student", info.address(),
              request.ranks_size());
  state_->TickLocked();
  v1::RegisterResponse response;
  response.set_daemon_id(info.name());
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(state_->options.heartbeat_interval));
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> Scheduler::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&state_->mu);
  auto found = state_->daemons.find(request.daemon_id());
  if (found == state_->daemons.end() || found->second.lost()) {
    return absl::NotFoundError(absl::StrCat("daemon ", request.daemon_id(), " is not registered"));
  }
  Daemon& daemon = found->second;
  const absl::Time now = state_->Now();
  daemon.last_heartbeat = now;
  daemon.status.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  daemon.ranks.assign(request.ranks().begin(), request.ranks().end());
  if (request.draining() && !daemon.draining) {
    daemon.draining = true;
    SS_LOG_INFO("daemon {} is shutting down", daemon.status.id());
    auto job = state_->active.find(daemon.status.job_id());
    if (job != state_->active.end() && job->second.job.state() == v1::JOB_STATE_RUNNING) {
      state_->MarkLost(job->second,
                       absl::StrCat("student daemon ", daemon.status.id(),
                                    " shut down while running rank ", daemon.status.rank()),
                       now);
    }
  }
  // Output first: a rank's last lines arrive with its exit.
  for (const v1::RankOutput& output : request.output()) state_->ApplyOutput(output);
  for (const v1::RankStatus& status : request.ranks()) {
    state_->ApplyRankStatus(daemon, status, now);
  }
  state_->TickLocked();

  v1::HeartbeatResponse response;
  if (daemon.status.info().kind() == v1::DAEMON_KIND_TEACHER) {
    // Only the jobs this teacher serves, and only hashes.
    const std::string& address = daemon.status.info().address();
    for (const auto& [id, aj] : state_->active) {
      const auto& teachers = aj.job.teachers();
      if (aj.job.state() == v1::JOB_STATE_RUNNING &&
          std::find(teachers.begin(), teachers.end(), address) != teachers.end()) {
        response.add_job_token_hashes(aj.token_hash);
      }
    }
    return response;
  }
  state_->StaleRanks(daemon, response);
  auto job = state_->active.find(daemon.status.job_id());
  if (job != state_->active.end()) {
    const ActiveJob& aj = job->second;
    const int rank = daemon.status.rank();
    if (aj.job.state() == v1::JOB_STATE_RUNNING && !aj.ending && rank < aj.job.ranks_size() &&
        aj.job.ranks(rank).daemon_id() == daemon.status.id() && aj.reported.count(rank) == 0 &&
        (rank == 0 || aj.master_port > 0)) {
      if (aj.token.empty()) {
        // Recovered after a coordinator restart: the token this attempt's
        // other ranks hold is gone, so this rank cannot join them.
        state_->MarkLost(job->second,
                         absl::StrCat("the coordinator restarted before rank ", rank,
                                      " started, and job tokens are not stored"),
                         now);
      } else {
        *response.add_start() = state_->Assignment(aj, rank);
      }
    }
  }
  return response;
}

std::vector<v1::DaemonStatus> Scheduler::Daemons() {
  absl::MutexLock lock(&state_->mu);
  std::vector<v1::DaemonStatus> out;
  for (const auto& [id, daemon] : state_->daemons) out.push_back(daemon.status);
  return out;
}

void Scheduler::Tick() {
  absl::MutexLock lock(&state_->mu);
  state_->TickLocked();
}

void Scheduler::Collect(MetricsRegistry& registry) {
  std::map<std::string, int> jobs;
  std::map<std::pair<std::string, std::string>, int> daemons;
  {
    absl::MutexLock lock(&state_->mu);
    for (const auto& [id, aj] : state_->active) ++jobs[StateLabel(aj.job.state())];
    for (const auto& [id, daemon] : state_->daemons) {
      const bool teacher = daemon.status.info().kind() == v1::DAEMON_KIND_TEACHER;
      const char* state = daemon.lost()                                    ? "lost"
                          : daemon.status.state() == v1::DAEMON_STATE_BUSY ? "busy"
                                                                           : "idle";
      ++daemons[{teacher ? "teacher" : "student", state}];
    }
  }
  registry.ClearGauge("specstream_coordinator_jobs");
  for (const char* state : {"queued", "running"}) {
    registry.SetGauge("specstream_coordinator_jobs", "Active jobs by state", {{"state", state}},
                      jobs[state]);
  }
  registry.ClearGauge("specstream_coordinator_daemons");
  for (const auto& [key, count] : daemons) {
    registry.SetGauge("specstream_coordinator_daemons", "Registered daemons by kind and state",
                      {{"kind", key.first}, {"state", key.second}}, count);
  }
}

}  // namespace specstream::services
