#include "services/cli/job_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/env.h"
#include "common/file.h"
#include "common/grpc/auth.h"
#include "common/grpc/channel_args.h"
#include "common/grpc/status.h"
#include "common/jobspec/job_spec.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/terminal_text.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "nlohmann/json.hpp"
#include "services/cli/data_commands.h"
#include "specstream/v1/coordinator.grpc.pb.h"

namespace specstream::services {
namespace {

// The commands' waits bound gRPC deadlines, which are on the real clock.
absl::Time Now() { return Env::Default().Now(); }

using v1::Job;
using v1::JobEvent;
using v1::JobState;

// Unary calls are quick (the coordinator answers from its store); 30 s only
// catches a wedged coordinator.
constexpr absl::Duration kDefaultRpcTimeout = absl::Seconds(30);
// Reconnecting during a wait: ControlPlaneBackoff, and giving up after the
// coordinator was unreachable for this long in a row (a restart takes
// seconds; a coordinator gone for minutes needs a person).
constexpr absl::Duration kGiveUpAfter = absl::Minutes(5);
// Reasons can hold a rank's last stderr lines; the list shows the start.
constexpr size_t kListReasonChars = 80;

bool IsTerminal(JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_STOPPED;
}

std::string StateName(JobState state) {
  return std::string(absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

std::string OneLine(absl::string_view text) {
  return absl::StrReplaceAll(absl::StripTrailingAsciiWhitespace(text), {{"\r", ""}, {"\n", " | "}});
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return absl::InternalError(absl::StrCat("JSON: ", status.ToString()));
  return json;
}

absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  ASSIGN_OR_RETURN(std::string json, ToJson(message));
  out << json << "\n";
  out.flush();
  return absl::OkStatus();
}

// One conversion from a failed RPC to the status the exit codes are read
// from, with the messages a user can act on.
absl::Status RpcError(const grpc::Status& status, absl::string_view what,
                      const std::string& address) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::UnauthenticatedError(absl::StrCat(
          "unauthenticated: check --token-file / SPECSTREAM_TOKEN (", status.error_message(), ")"));
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(
          absl::StrCat("cannot reach the coordinator at ", address, ": ", status.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      // An RPC deadline is the coordinator not answering (exit 3); only a
      // user's --timeout on a wait is 124 (TimedOut).
      return absl::UnavailableError(
          absl::StrCat(what, ": no answer from the coordinator at ", address, " in time"));
    default:
      return Annotate(FromGrpcStatus(status), what);
  }
}

// Metrics JSON fields the CLI shows; absent ones stay empty.
struct MetricsView {
  std::optional<double> loss;
  std::vector<double> acc;
  std::optional<double> sim_accept_len;
  std::optional<double> tokens_per_s;
};

MetricsView ParseMetrics(const std::string& text) {
  MetricsView view;
  if (text.empty()) return view;
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return view;
  auto number = [&](const char* key) -> std::optional<double> {
    auto it = json.find(key);
    if (it == json.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  view.loss = number("loss");
  view.sim_accept_len = number("sim_accept_len");
  view.tokens_per_s = number("tokens_per_s");
  auto acc = json.find("acc_k");
  if (acc != json.end() && acc->is_array()) {
    for (const auto& a : *acc) {
      if (a.is_number()) view.acc.push_back(a.get<double>());
    }
  }
  return view;
}

std::string FormatAcc(const std::vector<double>& acc) {
  return absl::StrJoin(acc, " ",
                       [](std::string* out, double a) { absl::StrAppendFormat(out, "%.3f", a); });
}

std::string FormatStep(const v1::JobMetrics& metrics) {
  if (metrics.total_steps() > 0) {
    return absl::StrCat(metrics.step(), "/", metrics.total_steps());
  }
  return metrics.step() > 0 ? absl::StrCat(metrics.step()) : "-";
}

// "step 120/1000 loss 2.314 acc 0.710 0.520 accept_len 3.21 tok/s 12.3k"
std::string MetricsSummary(const v1::JobMetrics& metrics) {
  MetricsView view = ParseMetrics(metrics.json());
  std::string line = absl::StrCat("step ", FormatStep(metrics));
  if (view.loss) absl::StrAppendFormat(&line, " loss %.4f", *view.loss);
  if (!view.acc.empty()) absl::StrAppend(&line, " acc ", FormatAcc(view.acc));
  if (view.sim_accept_len) absl::StrAppendFormat(&line, " accept_len %.2f", *view.sim_accept_len);
  if (view.tokens_per_s) absl::StrAppend(&line, " tok/s ", FormatCount(*view.tokens_per_s));
  return line;
}

std::string StateLine(const std::string& id, JobState state, int32_t attempt,
                      absl::string_view reason) {
  std::string line = absl::StrCat(EscapeForTerminal(id), " ", StateName(state));
  if (attempt > 0) absl::StrAppend(&line, " (attempt ", attempt, ")");
  if (!reason.empty()) absl::StrAppend(&line, ": ", EscapeForTerminal(OneLine(reason)));
  return line;
}

// The channel, the stub and the per-call settings (bearer, deadlines).
// Synchronous stub on purpose: the CLI has one call in flight and blocks on
// it anyway; the reactor API the daemons use would buy nothing here.
class JobClient final {
 public:
  static absl::StatusOr<std::unique_ptr<JobClient>> Create(const RemoteOptions& options) {
    std::string address = options.address;
    if (address.empty()) {
      const char* env = std::getenv(kAddressEnvVar);
      if (env != nullptr) address = env;
    }
    if (address.empty()) {
      return absl::InvalidArgumentError(
          "no coordinator address: pass --address HOST:PORT or set SPECSTREAM_ADDRESS");
    }
    if (options.output != "table" && options.output != "json") {
      return absl::InvalidArgumentError(
          absl::StrCat("-o: expected table or json, got \"", options.output, "\""));
    }
    if (options.timeout_seconds < 0) {
      return absl::InvalidArgumentError("--timeout: must be >= 0");
    }
    ASSIGN_OR_RETURN(std::string token, LoadToken(options.token_file));
    TlsClientFiles tls;
    tls.ca = options.tls_ca;
    ASSIGN_OR_RETURN(auto credentials, MakeChannelCredentials(tls));
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxControlMessageBytes);
    args.SetMaxSendMessageSize(kMaxControlMessageBytes);
    // The channel's own reconnect schedule (default: from 1 s, x1.6, up to
    // 120 s) would keep failing our retries fast long after a restarted
    // coordinator is back; follow ours instead.
    const Backoff backoff = ControlPlaneBackoff();
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, absl::ToInt64Milliseconds(backoff.first()));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, absl::ToInt64Milliseconds(backoff.max()));
    auto channel = grpc::CreateCustomChannel(address, credentials, args);
    absl::Duration timeout = options.timeout_seconds > 0 ? absl::Seconds(options.timeout_seconds)
                                                         : absl::InfiniteDuration();
    return std::unique_ptr<JobClient>(
        new JobClient(std::move(address), std::move(token), std::move(channel), timeout));
  }

  const std::string& address() const { return address_; }
  // When the waiting commands give up (InfiniteFuture without --timeout).
  absl::Time wait_deadline() const { return wait_deadline_; }
  absl::Duration timeout() const { return timeout_; }
  v1::JobService::Stub& stub() { return *stub_; }

  // A context with the bearer token and `deadline` (none when infinite).
  void Prepare(grpc::ClientContext& context, absl::Time deadline) const {
    AddBearer(context, token_);
    if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
  }
  // Unary calls: --timeout when set, else 30 s; never past the wait deadline.
  absl::Time RpcDeadline() const {
    absl::Duration limit = timeout_ == absl::InfiniteDuration() ? kDefaultRpcTimeout : timeout_;
    return std::min(Now() + limit, wait_deadline_);
  }

  absl::StatusOr<Job> Submit(const v1::SubmitJobRequest& request) {
    return Unary("submit", request, &v1::JobService::Stub::Submit);
  }
  // `wait_for_ready`: wait (until the RPC deadline) for the channel to
  // connect rather than failing at once while the coordinator is down.
  absl::StatusOr<Job> Get(const std::string& id, bool wait_for_ready = false) {
    v1::GetJobRequest request;
    request.set_id(id);
    return Unary("job " + id, request, &v1::JobService::Stub::Get, wait_for_ready);
  }
  absl::StatusOr<Job> Stop(const std::string& id, const std::string& reason) {
    v1::StopJobRequest request;
    request.set_id(id);
    request.set_reason(reason);
    return Unary("stop " + id, request, &v1::JobService::Stub::Stop);
  }
  // One page; `page_token` empty: the first.
  absl::StatusOr<v1::ListJobsResponse> List(int32_t limit, const std::string& page_token) {
    v1::ListJobsRequest request;
    request.set_limit(limit);
    request.set_page_token(page_token);
    return Unary("list", request, &v1::JobService::Stub::List);
  }

 private:
  JobClient(std::string address, std::string token, std::shared_ptr<grpc::Channel> channel,
            absl::Duration timeout)
      : address_(std::move(address)),
        token_(std::move(token)),
        stub_(v1::JobService::NewStub(channel)),
        timeout_(timeout),
        wait_deadline_(timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                           : Now() + timeout) {}

  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(absl::string_view what, const Request& request,
                                 grpc::Status (v1::JobService::Stub::*method)(grpc::ClientContext*,
                                                                              const Request&,
                                                                              Response*),
                                 bool wait_for_ready = false) {
    grpc::ClientContext context;
    Prepare(context, RpcDeadline());
    context.set_wait_for_ready(wait_for_ready);
    Response response;
    grpc::Status status = ((*stub_).*method)(&context, request, &response);
    if (!status.ok()) return RpcError(status, what, address_);
    return response;
  }

  std::string address_;
  std::string token_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  absl::Duration timeout_;
  absl::Time wait_deadline_;
};

// What a watch prints as events arrive.
enum class WatchOutput {
  kQuiet,   // `wait`, `submit --wait`: nothing
  kLogs,    // `logs`: log lines only
  kFollow,  // `submit --follow`: logs, plus state changes and progress on stderr
};

// Prints events. Log lines go to `out`; with kFollow, state changes and
// metrics go to stderr as a progress bar (stderr a terminal) or as lines.
class EventPrinter final {
 public:
  EventPrinter(WatchOutput mode, bool json, std::ostream& out, std::ostream& err)
      : mode_(mode),
        json_(json),
        out_(out),
        err_(err),
        bar_(mode == WatchOutput::kFollow && !json && isatty(STDERR_FILENO) != 0) {}

  absl::Status Handle(const JobEvent& event) {
    if (mode_ == WatchOutput::kQuiet) return absl::OkStatus();
    if (json_) {
      if (mode_ == WatchOutput::kLogs && !event.has_log()) return absl::OkStatus();
      return PrintJson(event, out_);
    }
    if (event.has_log()) {
      ClearBar();
      out_ << "[rank " << event.log().rank() << "] "
           << absl::StripSuffix(absl::StripSuffix(event.log().text(), "\n"), "\r") << "\n";
      out_.flush();
      RedrawBar();
    } else if (mode_ == WatchOutput::kFollow && event.has_state()) {
      const v1::StateChange& change = event.state();
      // The bar's last line stays above the final state.
      if (IsTerminal(change.state())) Finish();
      ClearBar();
      err_ << "state: "
           << StateLine(event.job_id(), change.state(), change.attempt(), change.reason()) << "\n";
      err_.flush();
      RedrawBar();
    } else if (mode_ == WatchOutput::kFollow && event.has_metrics()) {
      ShowMetrics(event.metrics());
    }
    return absl::OkStatus();
  }

  // Leaves the bar's final line in place.
  void Finish() {
    if (progress_ != nullptr) progress_->Finish();
    progress_.reset();
  }

 private:
  void ShowMetrics(const v1::JobMetrics& metrics) {
    if (!bar_) {
      err_ << "metrics: " << MetricsSummary(metrics) << "\n";
      err_.flush();
      return;
    }
    if (metrics.total_steps() <= 0) return;
    if (progress_ == nullptr || metrics.total_steps() != total_steps_) {
      ProgressOptions options;
      options.label = "step";
      options.total = metrics.total_steps();
      options.unit = "steps";
      options.rate_unit = "step";
      options.terminal = 1;
      options.stream = stderr;
      progress_ = std::make_unique<ProgressReporter>(options);
      total_steps_ = metrics.total_steps();
      first_step_ = metrics.step();
    }
    last_step_ = metrics.step();
    // The secondary counter is steps since we started watching: a step rate.
    progress_->Update(last_step_, last_step_ - first_step_);
  }

  // A line printed while the bar is drawn would land after it.
  void ClearBar() {
    if (progress_ == nullptr) return;
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
  void RedrawBar() {
    if (progress_ != nullptr) progress_->Update(last_step_, last_step_ - first_step_);
  }

  WatchOutput mode_;
  bool json_;
  std::ostream& out_;
  std::ostream& err_;
  bool bar_;
  std::unique_ptr<ProgressReporter> progress_;
  int64_t total_steps_ = 0;
  int64_t first_step_ = 0;
  int64_t last_step_ = 0;
};

absl::Status TimedOut(const JobClient& client, const std::string& id, JobState last_state) {
  return absl::DeadlineExceededError(
      absl::StrFormat("timed out after %s waiting for job %s (last state %s)",
                      absl::FormatDuration(client.timeout()), id, StateName(last_state)));
}

// Sleeps `backoff`'s delay (not past the wait deadline) after an
// UNAVAILABLE, and grows it. Fails once the coordinator was unreachable for
// kGiveUpAfter.
absl::Status BackOff(JobClient& client, const absl::Status& error, absl::Time& unavailable_since,
                     Backoff& backoff, std::ostream& err) {
  absl::Time now = Now();
  if (unavailable_since == absl::InfinitePast()) unavailable_since = now;
  if (now - unavailable_since > kGiveUpAfter) {
    return absl::UnavailableError(
        absl::StrCat(error.message(), " (gave up after ", absl::FormatDuration(kGiveUpAfter), ")"));
  }
  err << "specstream: " << error.message() << "; reconnecting in "
      << absl::FormatDuration(backoff.delay()) << "\n";
  err.flush();
  absl::SleepFor(
      std::max(absl::ZeroDuration(), std::min(backoff.delay(), client.wait_deadline() - now)));
  backoff.Grow();
  return absl::OkStatus();
}

// Get, retried while the coordinator is unavailable (used once we know it
// exists, mid-wait). Each try waits for the channel to connect, so a
// restarted coordinator is seen as soon as it listens again.
absl::StatusOr<Job> GetWithRetry(JobClient& client, const std::string& id, JobState last_state,
                                 absl::Time& unavailable_since, Backoff& backoff,
                                 std::ostream& err) {
  while (true) {
    if (Now() >= client.wait_deadline()) return TimedOut(client, id, last_state);
    absl::StatusOr<Job> job = client.Get(id, /*wait_for_ready=*/true);
    if (job.ok()) return job;
    const bool past_deadline = Now() >= client.wait_deadline();
    if (job.status().code() == absl::StatusCode::kDeadlineExceeded && past_deadline) {
      return TimedOut(client, id, last_state);
    }
    if (job.status().code() != absl::StatusCode::kUnavailable &&
        job.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return job;
    }
    RETURN_IF_ERROR(BackOff(client, job.status(), unavailable_since, backoff, err));
  }
}

absl::StatusOr<Job> GetWithRetry(JobClient& client, const std::string& id, JobState last_state,
                                 std::ostream& err) {
  absl::Time unavailable_since = absl::InfinitePast();
  Backoff backoff = ControlPlaneBackoff();
  return GetWithRetry(client, id, last_state, unavailable_since, backoff, err);
}

// Follows the job's events from the start until its terminal state, then
// returns the job as Get reports it. Reconnects (after the last event seen,
// so nothing prints twice) when the coordinator becomes unavailable.
// `initial` is the job as Get reported it just before.
absl::StatusOr<Job> WatchUntilTerminal(JobClient& client, const Job& initial, EventPrinter& printer,
                                       std::ostream& err) {
  const std::string& id = initial.id();
  JobState last_state = initial.state();
  int64_t after_seq = 0;
  absl::Time unavailable_since = absl::InfinitePast();
  Backoff backoff = ControlPlaneBackoff();
  bool terminal_seen = false;
  while (!terminal_seen) {
    if (Now() >= client.wait_deadline()) return TimedOut(client, id, last_state);
    grpc::ClientContext context;
    // The stream lives as long as the job; only --timeout bounds it.
    client.Prepare(context, client.wait_deadline());
    v1::WatchJobRequest request;
    request.set_id(id);
    request.set_after_seq(after_seq);
    request.set_follow(true);
    std::unique_ptr<grpc::ClientReader<JobEvent>> reader = client.stub().Watch(&context, request);
    JobEvent event;
    while (reader->Read(&event)) {
      unavailable_since = absl::InfinitePast();
      backoff.Reset();
      after_seq = event.seq();
      absl::Status handled = printer.Handle(event);
      if (event.has_state()) {
        last_state = event.state().state();
        if (IsTerminal(last_state)) terminal_seen = true;
      }
      if (!handled.ok() || terminal_seen) {
        // Nothing follows the terminal event; don't rely on the server to
        // close the stream.
        context.TryCancel();
        reader->Finish();
        RETURN_IF_ERROR(handled);
        break;
      }
    }
    grpc::Status status = terminal_seen ? grpc::Status::OK : reader->Finish();
    if (terminal_seen) break;
    if (status.ok()) {
      // The stream ended without the terminal event (a coordinator draining
      // its streams): ask, then watch again if the job still runs.
      ASSIGN_OR_RETURN(Job job, GetWithRetry(client, id, last_state, err));
      if (IsTerminal(job.state())) {
        printer.Finish();
        return job;
      }
      absl::SleepFor(std::min(backoff.delay(), client.wait_deadline() - Now()));
      continue;
    }
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        Now() >= client.wait_deadline()) {
      printer.Finish();
      return TimedOut(client, id, last_state);
    }
    absl::Status error = RpcError(status, "watch " + id, client.address());
    if (error.code() != absl::StatusCode::kUnavailable) return error;
    RETURN_IF_ERROR(BackOff(client, error, unavailable_since, backoff, err));
    // Watch again once the coordinator answers (and still knows the job).
    RETURN_IF_ERROR(GetWithRetry(client, id, last_state, unavailable_since, backoff, err).status());
  }
  printer.Finish();
  return GetWithRetry(client, id, last_state, err);
}

// Waits for `initial` to end and prints its final state; the status reflects
// it (SUCCEEDED: OK; FAILED/STOPPED: kAborted, exit code 1).
absl::Status WaitAndReport(JobClient& client, const Job& initial, WatchOutput mode, bool json,
                           std::ostream& out, std::ostream& err) {
  Job job = initial;
  if (!IsTerminal(job.state())) {
    EventPrinter printer(mode, json, out, err);
    ASSIGN_OR_RETURN(job, WatchUntilTerminal(client, initial, printer, err));
  }
  if (json) {
    RETURN_IF_ERROR(PrintJson(job, out));
  } else {
    out << StateLine(job.id(), job.state(), 0, job.reason()) << "\n";
    out.flush();
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED) return absl::OkStatus();
  std::string message = absl::StrCat("job ", job.id(), " ", StateName(job.state()));
  if (!job.reason().empty()) absl::StrAppend(&message, ": ", OneLine(job.reason()));
  return absl::AbortedError(message);
}

// `value` may come from the job's submitter or its ranks: escaped here, so
// every row of the status table is.
void AppendRow(std::string& table, absl::string_view key, absl::string_view value) {
  // Continuation rows (an empty key) line up under the value.
  absl::StrAppendFormat(&table, "%-16s%s\n", key.empty() ? "" : absl::StrCat(key, ":"),
                        EscapeForTerminal(value));
}

// At most `max_bytes` of escaped `text` (EscapeForTerminal's output), cut
// neither inside a UTF-8 sequence nor inside an escape; "..." marks a cut.
std::string Shorten(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes - 3;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;
  // An escape is \xNN or \uNNNN: one starting in the last 5 bytes may cross.
  const size_t backslash = text.rfind('\\', end - 1);
  if (backslash != std::string::npos && end - backslash < 6 && backslash + 1 < text.size()) {
    const size_t length = text[backslash + 1] == 'u' ? 6 : text[backslash + 1] == 'x' ? 4 : 1;
    if (backslash + length > end) end = backslash;
  }
  return text.substr(0, end) + "...";
}

}  // namespace

std::string FormatAge(int64_t age_ms) {
  int64_t s = std::max<int64_t>(0, age_ms / 1000);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m");
  if (s < 86400) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string FormatUnixMs(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::LocalTimeZone());
}

std::string FormatJobTable(const Job& job) {
  std::string table;
  AppendRow(table, "id", job.id());
  AppendRow(table, "name", job.name());
  AppendRow(table, "state", StateName(job.state()));
  AppendRow(table, "reason", job.reason().empty() ? "-" : OneLine(job.reason()));
  AppendRow(table, "attempt", absl::StrCat(job.attempt(), "/", job.max_restarts()));
  AppendRow(table, "world size", absl::StrCat(job.world_size()));
  AppendRow(table, "step", FormatStep(job.metrics()));
  MetricsView view = ParseMetrics(job.metrics().json());
  AppendRow(table, "loss", view.loss ? absl::StrFormat("%.4f", *view.loss) : "-");
  AppendRow(table, "acc", view.acc.empty() ? "-" : FormatAcc(view.acc));
  AppendRow(table, "sim_accept_len",
            view.sim_accept_len ? absl::StrFormat("%.2f", *view.sim_accept_len) : "-");
  AppendRow(table, "tokens/s", view.tokens_per_s ? FormatCount(*view.tokens_per_s) : "-");
  if (job.ranks().empty()) {
    AppendRow(table, "ranks", "-");
  }
  for (int i = 0; i < job.ranks_size(); ++i) {
    const v1::RankPlacement& rank = job.ranks(i);
    std::string value = absl::StrCat(
        rank.rank(), " ", rank.daemon_name().empty() ? rank.daemon_id() : rank.daemon_name());
    if (rank.exited()) absl::StrAppend(&value, " (exited ", rank.exit_code(), ")");
    AppendRow(table, i == 0 ? "ranks" : "", value);
  }
  if (!job.teachers().empty()) AppendRow(table, "teachers", absl::StrJoin(job.teachers(), ", "));
  AppendRow(table, "created", FormatUnixMs(job.created_unix_ms()));
  AppendRow(table, "started", FormatUnixMs(job.started_unix_ms()));
  AppendRow(table, "finished", FormatUnixMs(job.finished_unix_ms()));
  return table;
}

std::string FormatJobList(const v1::ListJobsResponse& jobs, int64_t now_unix_ms) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"ID", "NAME", "STATE", "STEP", "AGE", "REASON"});
  for (const Job& job : jobs.jobs()) {
    std::string reason = Shorten(EscapeForTerminal(OneLine(job.reason())), kListReasonChars);
    rows.push_back(
        {EscapeForTerminal(job.id()), EscapeForTerminal(job.name()), StateName(job.state()),
         FormatStep(job.metrics()),
         job.created_unix_ms() > 0 ? FormatAge(now_unix_ms - job.created_unix_ms()) : "-", reason});
  }
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    absl::StrAppend(&text, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return text;
}

absl::Status RunValidate(const std::string& spec_path, const std::string& output,
                         std::ostream& out) {
  absl::StatusOr<std::string> text = ReadFileToString(spec_path);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  absl::StatusOr<v1::JobSpec> spec = jobspec::ParseJobSpecYaml(*text);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(spec_path, ": ", spec.status().message()));
  }
  if (output == "json") {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    if (!google::protobuf::util::MessageToJsonString(*spec, &json, options).ok()) {
      return absl::InternalError("cannot print the spec as JSON");
    }
    out << json << "\n";
    return absl::OkStatus();
  }
  const int64_t ranks =
      std::max<int64_t>(spec->parallel().dp_size(), 1) * spec->parallel().cp_size();
  out << EscapeForTerminal(spec_path) << ": valid ("
      << (spec->name().empty() ? "unnamed" : EscapeForTerminal(spec->name())) << ", " << ranks
      << (ranks == 1 ? " rank" : " ranks") << ")\n";
  return absl::OkStatus();
}

absl::Status RunSubmit(const RemoteOptions& remote, const SubmitOptions& options, std::ostream& out,
                       std::ostream& err) {
  absl::StatusOr<std::string> spec = ReadFileToString(options.spec_path);
  // A missing file is a usage error (2), not an unknown job (4).
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  ASSIGN_OR_RETURN(auto client, JobClient::Create(remote));
  v1::SubmitJobRequest request;
  request.set_spec_yaml(*std::move(spec));
  request.set_id(options.id);
  ASSIGN_OR_RETURN(Job job, client->Submit(request));
  const bool json = remote.output == "json";
  const bool waiting = options.wait || options.follow;
  if (!json) {
    out << job.id() << "\n";
    out.flush();
  } else if (!waiting) {
    // With a wait, JSON output is the final Job alone (one document).
    return PrintJson(job, out);
  }
  if (!waiting) return absl::OkStatus();
  return WaitAndReport(*client, job, options.follow ? WatchOutput::kFollow : WatchOutput::kQuiet,
                       json, out, err);
}

absl::Status RunStatus(const RemoteOptions& remote, const std::string& id, std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, JobClient::Create(remote));
  ASSIGN_OR_RETURN(Job job, client->Get(id));
  if (remote.output == "json") return PrintJson(job, out);
  out << FormatJobTable(job);
  out.flush();
  return absl::OkStatus();
}

absl::Status RunList(const RemoteOptions& remote, int32_t limit, std::ostream& out) {
  if (limit < 0) return absl::InvalidArgumentError("--limit: must be >= 0");
  ASSIGN_OR_RETURN(auto client, JobClient::Create(remote));
  // The coordinator answers a page at a time (each well under the default
  // receive limit, whatever the jobs hold): follow the pages until `limit`
  // jobs or the last page.
  v1::ListJobsResponse jobs;
  std::string page_token;
  do {
    const int32_t want = limit == 0 ? 0 : limit - jobs.jobs_size();
    ASSIGN_OR_RETURN(v1::ListJobsResponse page, client->List(want, page_token));
    if (page.jobs().empty() && !page.next_page_token().empty()) {
      return absl::InternalError("list: the coordinator sent an empty page that is not the last");
    }
    for (Job& job : *page.mutable_jobs()) *jobs.add_jobs() = std::move(job);
    page_token = page.next_page_token();
  } while (!page_token.empty() && (limit == 0 || jobs.jobs_size() < limit));
  // A coordinator that ignores the limit does not make us print more.
  if (limit > 0 && jobs.jobs_size() > limit) {
    jobs.mutable_jobs()->DeleteSubrange(limit, jobs.jobs_size() - limit);
  }
  // The coordinator lists newest first; sort anyway so the order is ours.
  std::stable_sort(
      jobs.mutable_jobs()->begin(), jobs.mutable_jobs()->end(),
      [](const Job& a, const Job& b) { return a.created_unix_ms() > b.created_unix_ms(); });
  if (remote.output == "json") return PrintJson(jobs, out);
  out << FormatJobList(jobs, absl::ToUnixMillis(Now()));
  out.flush();
  return absl::OkStatus();
}

absl::Status RunLogs(const RemoteOptions& remote, const std::string& id, bool follow,
                     std::ostream& out, std::ostream& err) {
  ASSIGN_OR_RETURN(auto client, JobClient::Create(remote));
  const bool json = remote.output == "json";
  EventPrinter printer(WatchOutput::kLogs, json, out, err);
  if (follow) {
    // Get first: an unknown id or an unreachable coordinator fails fast
    // rather than being retried.
    ASSIGN_OR_RETURN(Job job, client->Get(id));
    return WatchUntilTerminal(*client, job, printer, err).status();
  }
  grpc::ClientContext context;
  client->Prepare(context, client->RpcDeadline());
  v1::WatchJobRequest request;
  request.set_id(id);
  request.set_follow(false);
  auto reader = client->stub().Watch(&context, request);
  JobEvent event;
  while (reader->Read(&event)) RETURN_IF_ERROR(printer.Handle(event));
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError(status, "logs " + id, client->address());
  return absl::OkStatus();
}

absl::Status RunStop(const RemoteOptions& remote, const std::string& id, const std::string& reason,
                     std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, JobClient::Create(remote));
  ASSIGN_OR_RETURN(Job job, client->Stop(id, reason));
  if (remote.output == "json") return PrintJson(job, out);
  out << StateLine(job.id(), job.state(), 0, job.reason()) << "\n";
  out.flush();
  return absl::OkStatus();
}

absl::Status RunWait(const RemoteOptions& remote, const std::string& id, std::ostream& out,
                     std::ostream& err) {
  ASSIGN_OR_RETURN(auto client, JobClient::Create(remote));
  // Fails fast on an unknown id or an unreachable coordinator.
  ASSIGN_OR_RETURN(Job job, client->Get(id));
  return WaitAndReport(*client, job, WatchOutput::kQuiet, remote.output == "json", out, err);
}

}  // namespace specstream::services
