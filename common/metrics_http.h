// Prometheus metrics: a registry of gauges and counters rendered in the text
// exposition format (version 0.0.4), served over HTTP at /metrics by a small
// HTTP/1.1 server (also /healthz -> "ok"). Every daemon runs one.
//
//   MetricsRegistry registry;
//   registry.SetGauge("specstream_jobs", "Jobs by state", {{"state", "running"}}, 2);
//   registry.AddCounter("specstream_samples_served_total", "Samples sent", {}, 1);
//   MetricsHttpOptions options;
//   options.registry = &registry;   // port 0: any free port
//   auto server = MetricsHttpServer::Start(options);
//
// MetricsRegistry is thread-safe. Collectors run on the server's serving
// thread at each scrape, outside the registry's lock, so they may call
// Set/Add. The server's threading contract is on MetricsHttpServer.
#ifndef SPECSTREAM_COMMON_METRICS_HTTP_H_
#define SPECSTREAM_COMMON_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace specstream {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsRegistry final {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // A metric family is created on first use with its help text; names must
  // match [a-zA-Z_:][a-zA-Z0-9_:]* and label names [a-zA-Z_][a-zA-Z0-9_]*
  // (not starting "__"); calls with other names, or a repeated label name,
  // are ignored and logged once. A name used as both a gauge and a counter
  // keeps its first type. Label order does not matter. Counter deltas must be
  // >= 0 (others are ignored and logged once).
  void SetGauge(absl::string_view name, absl::string_view help, const MetricLabels& labels,
                double value);
  void AddCounter(absl::string_view name, absl::string_view help, const MetricLabels& labels,
                  double delta);
  // Drops every series of a gauge family (e.g. before re-filling per-state
  // gauges in a collector).
  void ClearGauge(absl::string_view name);

  // Runs before each Render, in the order added. A collector may call the
  // setters above but not Render.
  void AddCollector(std::function<void(MetricsRegistry&)> collector);

  // The exposition text: families sorted by name, each with # HELP and
  // # TYPE lines, series sorted by labels, label values escaped. Families
  // with no series (e.g. a cleared gauge) are left out. Concurrent calls are
  // serialized, collectors included.
  std::string Render();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct MetricsHttpOptions {
  std::string host = "0.0.0.0";
  int port = 0;                         // 0: any free port (see port())
  MetricsRegistry* registry = nullptr;  // required; must outlive the server
  // Connections open at once, >= 1. A connection beyond it displaces the
  // oldest open one that is not mid-response (still sending its request, or
  // answered and lingering); only when every open connection is mid-response
  // is the newcomer answered 503 and closed. Nothing waits in line behind an
  // idle client.
  int max_connections = 64;
  // Time from accept to the end of the request head, counted once: a client
  // dripping a byte at a time is closed when it runs out, however recently
  // it sent. Positive, at most an hour.
  absl::Duration read_timeout = absl::Seconds(5);
  // Time from the end of the request head to the whole response sent, then
  // to the client's close (the server half-closes first and discards what
  // the client still sends). A response not sent by then is reset. Positive,
  // at most an hour.
  absl::Duration write_timeout = absl::Seconds(5);
};

// An HTTP/1.1 server for GET /metrics and GET /healthz. Each connection
// carries one request (Connection: close) whose head may be at most 16 KiB
// (431 beyond that).
//
// Threading: one serving thread owns the listening socket and every
// connection, all non-blocking, and multiplexes them with poll(): connections
// are served concurrently, so an idle or slow client delays no other one.
// Rendering runs on that thread too, so a slow collector delays every
// connection while it runs. Start, port() and the destructor may be called
// from any thread.
class MetricsHttpServer;

// A daemon's metrics endpoint (--metrics-port, --metrics-port-file): none
// (null) when `port` is -1, else a server on `host`:`port` (0: any free
// one) for `registry`, its bound port written to `port_file` when that is
// set (WritePortFile).
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartMetricsEndpoint(
    const std::string& host, int port, const std::string& port_file, MetricsRegistry* registry);

class MetricsHttpServer final {
 public:
  // Binds and starts the serving thread. A missing registry, a port out of
  // range or a bad limit is InvalidArgument; bind failures are Unavailable
  // naming host:port.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(MetricsHttpOptions options);
  // Wakes the serving thread, which closes every connection (answered or
  // not) and exits, and joins it; does not wait for clients.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const;

 private:
  struct Impl;
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_METRICS_HTTP_H_
