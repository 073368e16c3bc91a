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
#include <limits>
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
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/status.h"

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

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestHeadBytes = size_t{16} << 10;
// Timeouts beyond this are surely a mistake (and keep deadline sums far from
// overflow).
constexpr absl::Duration kMaxTimeout = absl::Hours(1);
// Connections accepted per wake-up before the open ones get their turn, so a
// burst of connects cannot starve them.
constexpr int kMaxAcceptsPerWake = 64;
// Reads per wake-up while discarding what a client sends after its answer,
// so one client streaming bytes cannot hold the loop.
constexpr int kMaxDrainReadsPerWake = 16;
// When accept fails for want of descriptors or memory the listening socket
// stays readable; it is left out of poll this long rather than spun on.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

std::string ErrnoMessage(int err) { return std::strerror(err); }

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

struct HttpResponse {
  int code;
  absl::string_view reason;
  std::string content_type;
  std::string body;
  std::string extra_headers;
};

std::string Serialize(const HttpResponse& response) {
  return absl::StrCat("HTTP/1.1 ", response.code, " ", response.reason,
                      "\r\nContent-Type: ", response.content_type,
                      "\r\nContent-Length: ", response.body.size(), "\r\nConnection: close\r\n",
                      response.extra_headers, "\r\n", response.body);
}

// The offset just past the blank line that ends the request head ("\r\n\r\n",
// or "\n\n" from bare-LF clients), or npos. Bytes before `from` were searched
// already; the search backs up over them far enough to find a terminator
// split across reads.
size_t HeadEnd(absl::string_view data, size_t from) {
  from = from < 3 ? 0 : from - 3;
  size_t end = absl::string_view::npos;
  if (size_t crlf = data.find("\r\n\r\n", from); crlf != absl::string_view::npos) end = crlf + 4;
  if (size_t lf = data.find("\n\n", from); lf != absl::string_view::npos) {
    end = std::min(end, lf + 2);
  }
  return end;
}

// Milliseconds for poll() to wait until `wake_at`, rounded up so the loop
// never wakes just short of a deadline and spins; -1 for no deadline.
int PollTimeoutMs(Clock::time_point now, Clock::time_point wake_at) {
  if (wake_at == Clock::time_point::max()) return -1;
  if (wake_at <= now) return 0;
  int64_t ms = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
  return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
}

// One client connection; it lives on the serving thread only.
struct Connection {
  enum class Phase {
    kReading,   // collecting the request head until read_timeout
    kWriting,   // sending `data` until write_timeout
    kDraining,  // answered and half-closed; discarding input until the client closes
  };
  int fd = -1;  // -1 once closed; the entry is dropped at the end of the loop turn
  Phase phase = Phase::kReading;
  Clock::time_point accepted;
  Clock::time_point deadline;
  std::string data;  // the request head so far, then the response
  size_t sent = 0;   // bytes of the response sent
};

void CloseConnection(Connection& connection) {
  close(connection.fd);
  connection.fd = -1;
}

// Resets instead of closing gracefully, so the kernel drops the unsent rest
// of a response at once rather than keep trying to deliver it.
void AbortConnection(Connection& connection) {
  linger reset{1, 0};
  setsockopt(connection.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  CloseConnection(connection);
}

}  // namespace

struct MetricsHttpServer::Impl {
  // Set by Start before the serving thread starts, read-only after; the
  // connections themselves live on the serving thread's stack.
  MetricsRegistry* registry = nullptr;
  size_t max_connections = 0;
  Clock::duration read_timeout{};
  Clock::duration write_timeout{};
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

  // The event loop: every socket is non-blocking and nothing here waits
  // except poll(), so each connection advances as far as its own bytes allow
  // and no client can hold up another. Deadlines are checked on every turn.
  void Serve() {
    std::vector<Connection> connections;
    std::vector<pollfd> fds;
    Clock::time_point accept_paused_until;
    while (true) {
      Clock::time_point now = Clock::now();
      bool accepting = now >= accept_paused_until;
      Clock::time_point wake_at = accepting ? Clock::time_point::max() : accept_paused_until;
      fds.clear();
      fds.push_back({wake_read, POLLIN, 0});
      fds.push_back({accepting ? listen_fd : -1, POLLIN, 0});  // poll skips a negative fd
      for (const Connection& connection : connections) {
        short events = connection.phase == Connection::Phase::kWriting ? POLLOUT : POLLIN;
        fds.push_back({connection.fd, events, 0});
        wake_at = std::min(wake_at, connection.deadline);
      }
      if (poll(fds.data(), fds.size(), PollTimeoutMs(now, wake_at)) < 0) {
        if (errno == EINTR) continue;
        SS_LOG_ERROR("metrics: poll failed: {}", ErrnoMessage(errno));
        break;
      }
      if (fds[0].revents != 0) break;

      now = Clock::now();
      // fds[2 + i] is connections[i]; Accept only appends, after this.
      size_t polled = connections.size();
      for (size_t i = 0; i < polled; ++i) {
        if (fds[2 + i].revents != 0) Advance(connections[i], now);
      }
      if (fds[1].revents != 0 && !Accept(connections, now)) {
        accept_paused_until = now + kAcceptBackoff;
      }
      for (Connection& connection : connections) {
        if (connection.fd >= 0 && now >= connection.deadline) Expire(connection);
      }
      connections.erase(std::remove_if(connections.begin(), connections.end(),
                                       [](const Connection& c) { return c.fd < 0; }),
                        connections.end());
    }
    for (Connection& connection : connections) CloseConnection(connection);
  }

  // Accepts what is waiting (up to kMaxAcceptsPerWake). False when accept
  // ran out of descriptors or memory and should pause.
  bool Accept(std::vector<Connection>& connections, Clock::time_point now) {
    size_t open = std::count_if(connections.begin(), connections.end(),
                                [](const Connection& c) { return c.fd >= 0; });
    for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        int err = errno;
        if (WouldBlock(err)) return true;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          SS_LOG_WARN("metrics: accept failed, pausing: {}", ErrnoMessage(err));
          return false;
        }
        // EINTR, ECONNABORTED and the like: that one is gone, try the next.
        if (err != EINTR && err != ECONNABORTED) {
          SS_LOG_WARN("metrics: accept failed: {}", ErrnoMessage(err));
        }
        continue;
      }
      if (open >= max_connections) {
        if (!MakeRoom(connections)) {
          RefuseBusy(fd);
          continue;
        }
        --open;
      }
      Connection connection;
      connection.fd = fd;
      connection.accepted = now;
      connection.deadline = now + read_timeout;
      connections.push_back(std::move(connection));
      ++open;
    }
    return true;
  }

  // At the cap, closes the oldest connection that is not mid-response so a
  // new client can take its slot: a prober's request arrives with its
  // connect, so it is the idle, the slow and the answered-but-lingering that
  // make room. False when every connection is mid-response.
  static bool MakeRoom(std::vector<Connection>& connections) {
    Connection* oldest = nullptr;
    for (Connection& connection : connections) {
      if (connection.fd < 0 || connection.phase == Connection::Phase::kWriting) continue;
      if (oldest == nullptr || connection.accepted < oldest->accepted) oldest = &connection;
    }
    if (oldest == nullptr) return false;
    SS_LOG_DEBUG("metrics: connection limit reached, closing the oldest idle connection");
    CloseConnection(*oldest);
    return true;
  }

  // Answers 503 to a client there is no room for, as far as one non-blocking
  // send gets (a fresh socket's buffer takes it all), and closes.
  static void RefuseBusy(int fd) {
    SS_LOG_DEBUG("metrics: connection limit reached, every connection mid-response: 503");
    std::string response = Serialize(
        {503, "Service Unavailable", "text/plain; charset=utf-8", "busy\n", "Retry-After: 1\r\n"});
    send(fd, response.data(), response.size(), MSG_NOSIGNAL);  // best effort
    shutdown(fd, SHUT_WR);
    close(fd);
  }

  void Advance(Connection& connection, Clock::time_point now) {
    switch (connection.phase) {
      case Connection::Phase::kReading:
        ReadHead(connection, now);
        return;
      case Connection::Phase::kWriting:
        Write(connection);
        return;
      case Connection::Phase::kDraining:
        Drain(connection);
        return;
    }
  }

  void ReadHead(Connection& connection, Clock::time_point now) {
    char buffer[4096];
    while (true) {
      ssize_t n = recv(connection.fd, buffer, sizeof(buffer), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && WouldBlock(errno)) return;
      if (n <= 0) {  // closed or failed before a whole head arrived
        CloseConnection(connection);
        return;
      }
      size_t searched = connection.data.size();
      connection.data.append(buffer, static_cast<size_t>(n));
      size_t head_end = HeadEnd(connection.data, searched);
      if (head_end != absl::string_view::npos && head_end <= kMaxRequestHeadBytes) {
        StartResponse(connection, Respond(connection.data), now);
        return;
      }
      // Over the bound, ended or not (a head that has not ended by now
      // cannot end within it).
      if (head_end != absl::string_view::npos || connection.data.size() >= kMaxRequestHeadBytes) {
        StartResponse(connection,
                      {431, "Request Header Fields Too Large", "text/plain; charset=utf-8",
                       "request head too large\n", ""},
                      now);
        return;
      }
    }
  }

  void StartResponse(Connection& connection, const HttpResponse& response, Clock::time_point now) {
    connection.phase = Connection::Phase::kWriting;
    connection.deadline = now + write_timeout;
    connection.data = Serialize(response);
    connection.sent = 0;
    Write(connection);
  }

  void Write(Connection& connection) {
    while (connection.sent < connection.data.size()) {
      ssize_t n = send(connection.fd, connection.data.data() + connection.sent,
                       connection.data.size() - connection.sent, MSG_NOSIGNAL);
      if (n > 0) {
        connection.sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && WouldBlock(errno)) {
        return;
      } else {
        CloseConnection(connection);  // the client went away
        return;
      }
    }
    // Half-close so the client sees EOF after the body, then read until it
    // closes: closing with unread input would reset the connection, and a
    // reset can destroy the response before the client reads it (a 431 sent
    // while the client is still sending, say).
    shutdown(connection.fd, SHUT_WR);
    connection.phase = Connection::Phase::kDraining;
    std::string().swap(connection.data);
    Drain(connection);
  }

  static void Drain(Connection& connection) {
    char buffer[4096];
    for (int i = 0; i < kMaxDrainReadsPerWake; ++i) {
      ssize_t n = recv(connection.fd, buffer, sizeof(buffer), 0);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      if (n < 0 && WouldBlock(errno)) return;
      CloseConnection(connection);  // the client closed (or failed): done
      return;
    }
  }

  static void Expire(Connection& connection) {
    switch (connection.phase) {
      case Connection::Phase::kReading:
        SS_LOG_DEBUG("metrics: closing a connection that sent no whole request in time");
        CloseConnection(connection);
        return;
      case Connection::Phase::kWriting:
        SS_LOG_DEBUG("metrics: resetting a connection that did not take its response in time");
        AbortConnection(connection);
        return;
      case Connection::Phase::kDraining:
        CloseConnection(connection);
        return;
    }
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
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsHttpServer::~MetricsHttpServer() = default;

int MetricsHttpServer::port() const { return impl_->port; }

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartMetricsEndpoint(
    const std::string& host, int port, const std::string& port_file, MetricsRegistry* registry) {
  if (port < 0) return std::unique_ptr<MetricsHttpServer>();
  MetricsHttpOptions options;
  options.host = host;
  options.port = port;
  options.registry = registry;
  ASSIGN_OR_RETURN(std::unique_ptr<MetricsHttpServer> server, MetricsHttpServer::Start(options));
  RETURN_IF_ERROR(WritePortFile(port_file, server->port()));
  return server;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    MetricsHttpOptions options) {
  if (options.registry == nullptr) {
    return absl::InvalidArgumentError("metrics server: registry is required");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics server: port ", options.port, " out of range"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics server: max_connections ", options.max_connections, " must be >= 1"));
  }
  for (auto [name, timeout] : {std::pair{"read_timeout", options.read_timeout},
                               std::pair{"write_timeout", options.write_timeout}}) {
    if (timeout <= absl::ZeroDuration() || timeout > kMaxTimeout) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics server: ", name, " ", absl::FormatDuration(timeout),
                       " must be positive and at most ", absl::FormatDuration(kMaxTimeout)));
    }
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
  impl->max_connections = static_cast<size_t>(options.max_connections);
  impl->read_timeout = absl::ToChronoNanoseconds(options.read_timeout);
  impl->write_timeout = absl::ToChronoNanoseconds(options.write_timeout);
  std::string error = "no address";
  for (addrinfo* ai = addresses; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      error = ErrnoMessage(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // A deep backlog: the loop accepts as fast as clients connect, so the
    // queue only absorbs bursts that arrive while the thread is descheduled
    // (a full queue drops SYNs, costing a client a 1 s retransmit).
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
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
