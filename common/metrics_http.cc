#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace specstream {
namespace {

enum class MetricType { kGauge, kCounter };

absl::string_view TypeName(MetricType type) {
  return type == MetricType::kGauge ? "gauge" : "counter";
}

bool IsNameStart(char c, bool allow_colon) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         (allow_colon && c == ':');
}

// Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*. Label names: the same without
// colons, and names starting "__" are reserved for Prometheus itself.
bool IsValidName(absl::string_view name, bool is_label) {
  if (name.empty() || !IsNameStart(name[0], !is_label)) return false;
  if (is_label && absl::StartsWith(name, "__")) return false;
  for (char c : name.substr(1)) {
    if (!IsNameStart(c, !is_label) && !absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

// HELP text escapes backslash and newline; label values also escape the
// double quote (exposition format 0.0.4).
std::string Escape(absl::string_view text, bool escape_quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && escape_quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// The shortest text that reads back as the same double (so 2 is "2", 0.1 is
// "0.1"), with Prometheus's spellings of the non-finite values.
std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

}  // namespace

// ---------------------------------------------------------------------------
// MetricsRegistry

struct MetricsRegistry::State {
  struct Family {
    MetricType type;
    std::string help;
    // Keyed by label pairs sorted by label name, so {a,b} and {b,a} are one
    // series and series render sorted by labels.
    std::map<MetricLabels, double> series;
  };

  // Serializes scrapes: a collector's ClearGauge + SetGauge pair never
  // interleaves with another Render. Taken before `mu`, never inside it.
  absl::Mutex render_mu;
  absl::Mutex mu ABSL_ACQUIRED_AFTER(render_mu);
  std::map<std::string, Family, std::less<>> families ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<std::function<void(MetricsRegistry&)>>> collectors
      ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<std::string> warned ABSL_GUARDED_BY(mu);

  // Logs `message` the first time `key` is seen.
  void WarnOnce(const std::string& key, absl::string_view message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (warned.insert(key).second) SS_LOG_WARN("metrics: {}", std::string(message));
  }

  // Validates the name and labels and returns the series to update, creating
  // the family and series; nullptr (logged once) when the call is invalid or
  // the family already has the other type.
  double* Series(absl::string_view name, absl::string_view help, const MetricLabels& labels,
                 MetricType type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!IsValidName(name, /*is_label=*/false)) {
      WarnOnce(absl::StrCat("name:", name),
               absl::StrCat("ignoring metric with invalid name \"", absl::CEscape(name), "\""));
      return nullptr;
    }
    MetricLabels sorted = labels;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      const std::string& label = sorted[i].first;
      if (!IsValidName(label, /*is_label=*/true)) {
        WarnOnce(absl::StrCat("label:", name, ":", label),
                 absl::StrCat("ignoring ", name, " with invalid label name \"",
                              absl::CEscape(label), "\""));
        return nullptr;
      }
      if (i > 0 && sorted[i - 1].first == label) {
        WarnOnce(absl::StrCat("dup:", name, ":", label),
                 absl::StrCat("ignoring ", name, " with duplicate label ", label));
        return nullptr;
      }
    }
    auto it = families.find(name);
    if (it == families.end()) {
      it = families.emplace(std::string(name), Family{type, std::string(help), {}}).first;
    } else if (it->second.type != type) {
      WarnOnce(absl::StrCat("type:", name),
               absl::StrCat("ignoring ", TypeName(type), " update of ", name, ", already a ",
                            TypeName(it->second.type)));
      return nullptr;
    }
    return &it->second.series[std::move(sorted)];
  }
};

MetricsRegistry::MetricsRegistry() : state_(std::make_unique<State>()) {}
MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::SetGauge(absl::string_view name, absl::string_view help,
                               const MetricLabels& labels, double value) {
  absl::MutexLock lock(&state_->mu);
  if (double* series = state_->Series(name, help, labels, MetricType::kGauge)) *series = value;
}

void MetricsRegistry::AddCounter(absl::string_view name, absl::string_view help,
                                 const MetricLabels& labels, double delta) {
  absl::MutexLock lock(&state_->mu);
  // Counters only go up; a negative or NaN delta would break rate().
  if (!(delta >= 0)) {
    state_->WarnOnce(absl::StrCat("delta:", name),
                     absl::StrCat("ignoring negative or NaN increment of counter ", name));
    return;
  }
  if (double* series = state_->Series(name, help, labels, MetricType::kCounter)) {
    *series += delta;
  }
}

void MetricsRegistry::ClearGauge(absl::string_view name) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->families.find(name);
  if (it != state_->families.end() && it->second.type == MetricType::kGauge) {
    it->second.series.clear();
  }
}

void MetricsRegistry::AddCollector(std::function<void(MetricsRegistry&)> collector) {
  absl::MutexLock lock(&state_->mu);
  state_->collectors.push_back(
      std::make_shared<std::function<void(MetricsRegistry&)>>(std::move(collector)));
}

std::string MetricsRegistry::Render() {
  absl::MutexLock render_lock(&state_->render_mu);
  // Collectors run without `mu` held since they call SetGauge and friends.
  std::vector<std::shared_ptr<std::function<void(MetricsRegistry&)>>> collectors;
  {
    absl::MutexLock lock(&state_->mu);
    collectors = state_->collectors;
  }
  for (const auto& collector : collectors) (*collector)(*this);

  absl::MutexLock lock(&state_->mu);
  std::string out;
  for (const auto& [name, family] : state_->families) {
    // A cleared gauge with nothing re-filled has no samples to show.
    if (family.series.empty()) continue;
    absl::StrAppend(&out, "# HELP ", name, " ", Escape(family.help, /*escape_quote=*/false),
                    "\n# TYPE ", name, " ", TypeName(family.type), "\n");
    for (const auto& [labels, value] : family.series) {
      out += name;
      if (!labels.empty()) {
        out += '{';
        for (size_t i = 0; i < labels.size(); ++i) {
          if (i > 0) out += ',';
          absl::StrAppend(&out, labels[i].first, "=\"",
                          Escape(labels[i].second, /*escape_quote=*/true), "\"");
        }
        out += '}';
      }
      absl::StrAppend(&out, " ", FormatValue(value), "\n");
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// MetricsHttpServer

namespace {

constexpr size_t kMaxRequestHeaderBytes = 8192;
// A client gets this long to send its request and take the response; the
// server is single-threaded, so a stalled client delays the next scrape by at
// most this much.
constexpr auto kConnectionTimeout = std::chrono::seconds(5);

std::string ErrnoMessage(int err) { return std::strerror(err); }

struct HttpResponse {
  int code;
  absl::string_view reason;
  std::string content_type;
  std::string body;
  std::string extra_headers;
};

}  // namespace

struct MetricsHttpServer::Impl {
  MetricsRegistry* registry = nullptr;
  int listen_fd = -1;
  int wake_read = -1;  // readable once the destructor asks the thread to stop
  int wake_write = -1;
  int port = 0;
  std::thread thread;

  ~Impl() {
    if (wake_write >= 0) {
      char byte = 1;
      // The pipe is empty (only this ever writes to it), so this cannot block.
      while (write(wake_write, &byte, 1) < 0 && errno == EINTR) {
      }
    }
    if (thread.joinable()) thread.join();
    for (int fd : {listen_fd, wake_read, wake_write}) {
      if (fd >= 0) close(fd);
    }
  }

  void Serve() {
    while (true) {
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_read, POLLIN, 0}};
      int n = poll(fds, 2, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        SS_LOG_ERROR("metrics: poll failed: {}", ErrnoMessage(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) {
        // ECONNABORTED, EMFILE and the like: drop this one, keep serving.
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          SS_LOG_WARN("metrics: accept failed: {}", ErrnoMessage(errno));
        }
        continue;
      }
      HandleConnection(conn);
      close(conn);
    }
  }

  // Waits until `fd` is ready for `events` or the deadline passes; false on
  // timeout, shutdown, or error.
  bool WaitFor(int fd, short events, std::chrono::steady_clock::time_point deadline) const {
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd fds[2] = {{fd, events, 0}, {wake_read, POLLIN, 0}};
      int n = poll(fds, 2, static_cast<int>(left.count()));
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      if (fds[1].revents != 0) return false;
      if (fds[0].revents != 0) return true;
    }
  }

  void HandleConnection(int conn) {
    auto deadline = std::chrono::steady_clock::now() + kConnectionTimeout;
    std::string request;
    size_t header_end = std::string::npos;
    while (header_end == std::string::npos) {
      if (request.size() > kMaxRequestHeaderBytes) {
        Send(conn, {431, "Request Header Fields Too Large", "text/plain", "too large\n", ""},
             deadline);
        return;
      }
      if (!WaitFor(conn, POLLIN, deadline)) return;
      char buffer[2048];
      ssize_t n = recv(conn, buffer, sizeof(buffer), 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) return;  // closed before a whole request arrived
      request.append(buffer, static_cast<size_t>(n));
      header_end = request.find("\r\n\r\n");
      if (header_end == std::string::npos) header_end = request.find("\n\n");
    }
    Send(conn, Respond(request), deadline);
  }

  HttpResponse Respond(absl::string_view request) const {
    absl::string_view line = request.substr(0, request.find('\n'));
    line = absl::StripTrailingAsciiWhitespace(line);
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/")) {
      return {400, "Bad Request", "text/plain; charset=utf-8", "bad request\n", ""};
    }
    absl::string_view method = parts[0];
    absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    if (method != "GET") {
      return {405, "Method Not Allowed", "text/plain; charset=utf-8", "method not allowed\n",
              "Allow: GET\r\n"};
    }
    if (path == "/metrics") {
      return {200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry->Render(), ""};
    }
    if (path == "/healthz") return {200, "OK", "text/plain; charset=utf-8", "ok", ""};
    return {404, "Not Found", "text/plain; charset=utf-8", "not found\n", ""};
  }

  void Send(int conn, const HttpResponse& response,
            std::chrono::steady_clock::time_point deadline) const {
    std::string data = absl::StrCat(
        "HTTP/1.1 ", response.code, " ", response.reason,
        "\r\nContent-Type: ", response.content_type, "\r\nContent-Length: ", response.body.size(),
        "\r\nConnection: close\r\n", response.extra_headers, "\r\n", response.body);
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t n = send(conn, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (!WaitFor(conn, POLLOUT, deadline)) return;
      } else {
        return;
      }
    }
    // Half-close so the client sees EOF after the body even if it sent
    // bytes we did not read (closing with unread data would reset instead).
    shutdown(conn, SHUT_WR);
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsHttpServer::~MetricsHttpServer() = default;

int MetricsHttpServer::port() const { return impl_->port; }

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    MetricsHttpOptions options) {
  if (options.registry == nullptr) {
    return absl::InvalidArgumentError("metrics server: registry is required");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics server: port ", options.port, " out of range"));
  }
  std::string where = absl::StrCat(options.host, ":", options.port);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  std::string port_text = std::to_string(options.port);
  int rc = getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(), port_text.c_str(),
                       &hints, &addresses);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: cannot resolve ", where, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(addresses, &freeaddrinfo);

  auto impl = std::make_unique<Impl>();
  impl->registry = options.registry;
  std::string error = "no address";
  for (addrinfo* ai = addresses; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      error = ErrnoMessage(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      error = ErrnoMessage(errno);
      close(fd);
      continue;
    }
    impl->listen_fd = fd;
    break;
  }
  if (impl->listen_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: cannot listen on ", where, ": ", error));
  }

  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: getsockname on ", where, ": ", ErrnoMessage(errno)));
  }
  impl->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("metrics server: cannot create a pipe: ", ErrnoMessage(errno)));
  }
  impl->wake_read = pipe_fds[0];
  impl->wake_write = pipe_fds[1];

  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Serve(); });
  SS_LOG_INFO("metrics: serving http://{}:{}/metrics", options.host, impl->port);
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

}  // namespace specstream
