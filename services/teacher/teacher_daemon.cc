#include "services/teacher/teacher_daemon.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/net_address.h"
#include "common/status.h"
#include "services/daemon/registration.h"
#include "services/teacher/teacher_service.h"
#include "teacher/decode_target.h"
#include "teacher/hf_runtime.h"
#include "teacher/sample_tensors.h"
#include "teacher/target_runtime.h"
#if SPECSTREAM_WITH_NCCL
#include "common/transport/nccl_util.h"
#endif

namespace specstream::services {
namespace {

// --max-queued-mib's ceiling (1 TiB): far above any host, and its bytes fit
// an int64_t.
constexpr int64_t kMaxQueuedMib = int64_t{1} << 20;

// --nccl-device's own syntax: the device index, or -1 for "auto" and
// "none" (NcclDevice resolves "auto" on this machine).
absl::StatusOr<int> ParseNcclDeviceIndex(const std::string& value) {
  if (value == "auto" || value == "none") return -1;
  int device = -1;
  if (!absl::SimpleAtoi(value, &device) || device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nccl-device: \"", value, "\" is not auto, none or a device index"));
  }
  return device;
}

// The device TRANSPORT_NCCL payloads leave from (-1: NCCL not offered).
absl::StatusOr<int> NcclDevice(const TeacherDaemonOptions& options) {
  if (options.nccl_device == "auto") {
#if SPECSTREAM_WITH_NCCL
    const std::string leader = options.devices.substr(0, options.devices.find(','));
    int index = 0;
    if (absl::StartsWith(leader, "cuda:") && absl::SimpleAtoi(leader.substr(5), &index)) {
      return index;
    }
    return CudaDeviceCount() > 0 ? 0 : -1;
#else
    return -1;
#endif
  }
  return ParseNcclDeviceIndex(options.nccl_device);  // TeacherCore::Create checks that it exists
}

// Prometheus gauges and counters from the service's stats, refreshed at each
// scrape.
void ExportTeacherMetrics(const teacher::TeacherCore::Stats& stats,
                          teacher::TeacherCore::Stats& last, MetricsRegistry& registry) {
  registry.AddCounter("specstream_teacher_streams_total", "Sample streams accepted", {},
                      static_cast<double>(stats.streams - last.streams));
  registry.AddCounter("specstream_teacher_samples_sent_total", "Samples sent", {},
                      static_cast<double>(stats.samples_sent - last.samples_sent));
  registry.AddCounter("specstream_teacher_sample_errors_total", "SampleErrors sent", {},
                      static_cast<double>(stats.sample_errors - last.sample_errors));
  registry.AddCounter("specstream_teacher_forward_calls_total", "Target forward calls", {},
                      static_cast<double>(stats.forward_calls - last.forward_calls));
  registry.AddCounter("specstream_teacher_answers_total", "Answers decoded (rpc Answer)", {},
                      static_cast<double>(stats.answers_decoded - last.answers_decoded));
  registry.AddCounter("specstream_teacher_answers_reused_total",
                      "Answer requests served from a kept or in-progress answer", {},
                      static_cast<double>(stats.answers_reused - last.answers_reused));
  registry.AddCounter("specstream_teacher_answer_steps_total", "Batched decoding steps", {},
                      static_cast<double>(stats.answer_steps - last.answer_steps));
  registry.AddCounter("specstream_teacher_answer_step_rows_total",
                      "Answers advanced by those steps (rows / steps: the mean batch)", {},
                      static_cast<double>(stats.answer_step_rows - last.answer_step_rows));
  registry.SetGauge("specstream_teacher_queued_request_bytes",
                    "Bytes held by SampleRequests waiting for a credit (all streams)", {},
                    static_cast<double>(stats.queued_request_bytes));
  last = stats;
}

}  // namespace

absl::Status CheckTeacherDaemonOptions(const TeacherDaemonOptions& o) {
  RETURN_IF_ERROR(teacher::ParseHiddenDType("--payload-dtype", o.payload_dtype).status());
  RETURN_IF_ERROR(ParseNcclDeviceIndex(o.nccl_device).status());
  if (o.nccl_timeout_s <= 0) return absl::InvalidArgumentError("--nccl-timeout must be > 0");
  if (o.shutdown_timeout_s < 0) {
    return absl::InvalidArgumentError("--shutdown-timeout must be >= 0");
  }
  RETURN_IF_ERROR(CheckListenPorts(o.port, o.metrics_port));
  if (o.host.empty()) return absl::InvalidArgumentError("--host: empty");
  if (o.batch_tokens < 1) return absl::InvalidArgumentError("--batch-tokens must be >= 1");
  if (o.answer_batch < 1) return absl::InvalidArgumentError("--answer-batch must be >= 1");
  if (o.max_tokens < 0) return absl::InvalidArgumentError("--max-tokens must be >= 0");
  if (o.chunk_kib < 1) return absl::InvalidArgumentError("--chunk-kib must be >= 1");
  if (o.max_queued_mib < 1 || o.max_queued_mib > kMaxQueuedMib) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-queued-mib: ", o.max_queued_mib, " not in [1, ", kMaxQueuedMib, "]"));
  }
  if (o.max_queued_mib_per_stream < 1 || o.max_queued_mib_per_stream > kMaxQueuedMib) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-queued-mib-per-stream: ", o.max_queued_mib_per_stream, " not in [1, ",
                     kMaxQueuedMib, "]"));
  }
  if (o.max_streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-streams: ", o.max_streams, " must be >= 1"));
  }
  if (o.max_streams_per_peer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-streams-per-peer: ", o.max_streams_per_peer, " must be >= 1"));
  }
  if (!o.coordinator.empty()) {
    RETURN_IF_ERROR(SplitHostPort(o.coordinator, "--coordinator").status());
  }
  return CheckTlsServerFlags(o.tls);
}

// Members in the order they are built; Stop takes them down in its own
// order, and what is left is destroyed in reverse.
struct TeacherDaemon::Impl {
  TeacherDaemonOptions options;
  std::string token;
  int nccl_device = -1;
  JobTokenSet job_tokens;
  std::unique_ptr<TeacherServer> server;
  MetricsRegistry metrics;
  teacher::TeacherCore::Stats last_stats;
  std::unique_ptr<MetricsHttpServer> metrics_server;
  std::unique_ptr<Registration> registration;
  bool started = false;
  absl::Notification stopped;  // Stop() has run
};

TeacherDaemon::TeacherDaemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TeacherDaemon::~TeacherDaemon() { Stop(); }

absl::StatusOr<std::unique_ptr<TeacherDaemon>> TeacherDaemon::Create(TeacherDaemonOptions options) {
  RETURN_IF_ERROR(CheckTeacherDaemonOptions(options));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const TeacherDaemonOptions& o = impl->options;
  ASSIGN_OR_RETURN(impl->nccl_device, NcclDevice(o));
  ASSIGN_OR_RETURN(impl->token, LoadToken(o.token_file));
  if (!o.coordinator.empty() && impl->token.empty() && !o.insecure_no_auth) {
    return absl::InvalidArgumentError(
        "--token-file: required with --coordinator (this daemon's credential; or "
        "--insecure-no-auth for a coordinator without authentication)");
  }
  if (o.coordinator.empty() && impl->token.empty() && !o.insecure_no_auth &&
      !IsLoopbackHost(o.host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--token-file: required to serve on ", o.host,
        " (anyone who reaches the port could stream hidden states); or --insecure-no-auth"));
  }
  return std::unique_ptr<TeacherDaemon>(new TeacherDaemon(std::move(impl)));
}

absl::Status TeacherDaemon::Start(teacher::TargetRuntime& runtime) {
  Impl& s = *impl_;
  const TeacherDaemonOptions& o = s.options;
  if (s.started) return absl::FailedPreconditionError("teacher daemon: Start called twice");
  s.started = true;
  TeacherServerOptions options;
  options.host = o.host;
  options.port = o.port;
  options.service.payload_dtype = o.payload_dtype;
  options.service.keep_target_ids = o.keep_target_ids;
  options.service.max_tokens = o.max_tokens;
  options.service.max_batch_tokens = o.batch_tokens;
  options.service.answer_batch = o.answer_batch;
  options.service.chunk_bytes = static_cast<uint64_t>(std::max<int64_t>(o.chunk_kib, 0)) << 10;
  options.service.max_queued_request_bytes = o.max_queued_mib << 20;
  options.service.max_queued_request_bytes_per_stream = o.max_queued_mib_per_stream << 20;
  options.service.max_streams = o.max_streams;
  options.service.max_streams_per_peer = o.max_streams_per_peer;
  options.service.nccl_device = s.nccl_device;
  options.service.nccl_timeout = absl::Seconds(o.nccl_timeout_s);
  options.tls = o.tls;
  // Answers (rpc Answer) stop where `specstream-eval generate` stops.
  if (const auto* hf = dynamic_cast<const teacher::HfRuntime*>(&runtime); hf != nullptr) {
    ASSIGN_OR_RETURN(options.service.answer_stop_ids,
                     teacher::AnswerStopIds(hf->config(), o.model));
  }
  if (!o.coordinator.empty()) {
    JobTokenSet* job_tokens = &s.job_tokens;
    options.service.authorize = [job_tokens](const std::string& presented,
                                             std::function<void(absl::Status)> done) {
      job_tokens->Admit(presented, absl::Seconds(3), std::move(done));
    };
  } else if (!s.token.empty()) {
    options.service.authorize = TokenAuthorizer(s.token);
  } else {
    SS_LOG_WARN("serve: NO AUTHENTICATION: any client that reaches {} can stream hidden states{}",
                o.host,
                o.insecure_no_auth ? " (--insecure-no-auth)" : " (loopback: local processes)");
  }
  ASSIGN_OR_RETURN(s.server, TeacherServer::Start(runtime, options));
  if (o.on_listening) o.on_listening(s.server->address());
  RETURN_IF_ERROR(WritePortFile(o.port_file, s.server->port()));

  TeacherServer* server = s.server.get();
  teacher::TeacherCore::Stats* last = &s.last_stats;
  s.metrics.AddCollector([server, last](MetricsRegistry& r) {
    ExportTeacherMetrics(server->core().stats(), *last, r);
  });
  ASSIGN_OR_RETURN(s.metrics_server,
                   StartMetricsEndpoint(o.host, o.metrics_port, o.metrics_port_file, &s.metrics));

  if (!o.coordinator.empty()) {
    RegistrationOptions reg;
    reg.coordinator = o.coordinator;
    reg.token = s.token;
    reg.tls.ca = o.tls_ca;
    std::string host = o.advertise;
    if (host.empty()) host = o.host == "0.0.0.0" ? LocalHostname() : o.host;
    const std::string address = absl::StrCat(host, ":", s.server->port());
    reg.info.set_name(o.name.empty() ? address : o.name);
    reg.info.set_kind(v1::DAEMON_KIND_TEACHER);
    reg.info.set_address(address);
    reg.info.set_host(host);
    for (absl::string_view device : absl::StrSplit(o.devices, ',', absl::SkipEmpty())) {
      reg.info.add_devices(std::string(device));
    }
    if (!o.model.empty()) {
      reg.info.set_model(std::filesystem::absolute(o.model).lexically_normal().string());
    }
    reg.info.set_model_name(o.model_name);
    JobTokenSet* job_tokens = &s.job_tokens;
    reg.on_reply = [job_tokens](const v1::HeartbeatResponse& reply) { job_tokens->Replace(reply); };
    ASSIGN_OR_RETURN(s.registration, Registration::Start(std::move(reg)));
    s.job_tokens.SetPoke([raw = s.registration.get()] { raw->Poke(); });
  }
  return absl::OkStatus();
}

void TeacherDaemon::Wait() { impl_->stopped.WaitForNotification(); }

void TeacherDaemon::Stop() {
  Impl& s = *impl_;
  if (s.stopped.HasBeenNotified()) return;
  s.job_tokens.SetPoke({});
  s.registration.reset();
  s.job_tokens.Close();      // refuses streams still waiting for a verdict
  s.metrics_server.reset();  // its collector reads the server
  if (s.server != nullptr) {
    s.server->Shutdown(absl::Seconds(s.options.shutdown_timeout_s));
    s.server.reset();
  }
  s.stopped.Notify();
}

int TeacherDaemon::port() const { return impl_->server != nullptr ? impl_->server->port() : 0; }

std::string TeacherDaemon::address() const {
  return impl_->server != nullptr ? impl_->server->address() : std::string();
}

int TeacherDaemon::metrics_port() const {
  return impl_->metrics_server != nullptr ? impl_->metrics_server->port() : -1;
}

}  // namespace specstream::services
