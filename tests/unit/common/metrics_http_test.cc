#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

// --- MetricsRegistry -------------------------------------------------------

TEST(MetricsRegistryTest, RendersSortedFamiliesAndSeries) {
  MetricsRegistry registry;
  registry.SetGauge("specstream_jobs", "Jobs by state", {{"state", "running"}}, 2);
  registry.SetGauge("specstream_jobs", "later help is ignored", {{"state", "queued"}}, 0.5);
  registry.AddCounter("specstream_samples_served_total", "Samples sent", {}, 3);
  // Label order does not matter: one series, rendered with names sorted.
  registry.SetGauge("a_gauge", "First", {{"z", "1"}, {"a", "2"}}, 7);
  registry.SetGauge("a_gauge", "First", {{"a", "2"}, {"z", "1"}}, -1.25);
  registry.SetGauge("a_gauge", "First", {{"a", "10"}, {"z", "1"}}, 1e21);

  EXPECT_EQ(registry.Render(),
            "# HELP a_gauge First\n"
            "# TYPE a_gauge gauge\n"
            "a_gauge{a=\"10\",z=\"1\"} 1e+21\n"
            "a_gauge{a=\"2\",z=\"1\"} -1.25\n"
            "# HELP specstream_jobs Jobs by state\n"
            "# TYPE specstream_jobs gauge\n"
            "specstream_jobs{state=\"queued\"} 0.5\n"
            "specstream_jobs{state=\"running\"} 2\n"
            "# HELP specstream_samples_served_total Samples sent\n"
            "# TYPE specstream_samples_served_total counter\n"
            "specstream_samples_served_total 3\n");
}

TEST(MetricsRegistryTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  registry.SetGauge("m", "line one\nback\\slash \"quoted\"", {{"path", "C:\\dir\n\"x\""}}, 1);
  EXPECT_EQ(registry.Render(),
            "# HELP m line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE m gauge\n"
            "m{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1\n");
}

TEST(MetricsRegistryTest, NonFiniteValues) {
  MetricsRegistry registry;
  registry.SetGauge("g", "h", {{"k", "inf"}}, std::numeric_limits<double>::infinity());
  registry.SetGauge("g", "h", {{"k", "nan"}}, std::nan(""));
  registry.SetGauge("g", "h", {{"k", "ninf"}}, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(registry.Render(),
            "# HELP g h\n# TYPE g gauge\n"
            "g{k=\"inf\"} +Inf\ng{k=\"nan\"} NaN\ng{k=\"ninf\"} -Inf\n");
}

TEST(MetricsRegistryTest, CountersAccumulate) {
  MetricsRegistry registry;
  registry.AddCounter("c_total", "Count", {{"kind", "a"}}, 1);
  registry.AddCounter("c_total", "Count", {{"kind", "a"}}, 2.5);
  registry.AddCounter("c_total", "Count", {{"kind", "b"}}, 0);
  registry.AddCounter("c_total", "Count", {{"kind", "a"}}, -10);  // ignored: counters only rise
  EXPECT_EQ(registry.Render(),
            "# HELP c_total Count\n# TYPE c_total counter\n"
            "c_total{kind=\"a\"} 3.5\nc_total{kind=\"b\"} 0\n");
}

TEST(MetricsRegistryTest, CountersAreThreadSafe) {
  MetricsRegistry registry;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&registry] {
      for (int i = 0; i < 1000; ++i) registry.AddCounter("n_total", "N", {}, 1);
    });
  }
  std::string during = registry.Render();  // concurrently with the writers
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(registry.Render(), "# HELP n_total N\n# TYPE n_total counter\nn_total 4000\n");
  EXPECT_TRUE(during.empty() || during.find("n_total ") != std::string::npos) << during;
}

TEST(MetricsRegistryTest, InvalidNamesAndTypeClashesAreIgnored) {
  MetricsRegistry registry;
  registry.SetGauge("bad-name", "h", {}, 1);
  registry.SetGauge("9starts_with_digit", "h", {}, 1);
  registry.SetGauge("", "h", {}, 1);
  registry.SetGauge("ok", "h", {{"bad-label", "v"}}, 1);
  registry.SetGauge("ok", "h", {{"__reserved", "v"}}, 1);
  registry.SetGauge("ok", "h", {{"no:colons", "v"}}, 1);
  registry.SetGauge("ok", "h", {{"dup", "1"}, {"dup", "2"}}, 1);
  registry.SetGauge("bad-name", "h", {}, 2);  // warned about only once
  EXPECT_EQ(registry.Render(), "");

  registry.SetGauge("name:with_colon", "h", {}, 1);
  registry.AddCounter("name:with_colon", "h", {}, 5);  // keeps its first type
  EXPECT_EQ(registry.Render(),
            "# HELP name:with_colon h\n# TYPE name:with_colon gauge\nname:with_colon 1\n");
}

TEST(MetricsRegistryTest, ClearGaugeDropsEverySeries) {
  MetricsRegistry registry;
  registry.SetGauge("jobs", "Jobs", {{"state", "running"}}, 2);
  registry.SetGauge("jobs", "Jobs", {{"state", "queued"}}, 1);
  registry.AddCounter("done_total", "Done", {}, 1);
  registry.ClearGauge("jobs");
  registry.ClearGauge("done_total");  // not a gauge: untouched
  registry.ClearGauge("never_seen");
  EXPECT_EQ(registry.Render(), "# HELP done_total Done\n# TYPE done_total counter\ndone_total 1\n");
  registry.SetGauge("jobs", "other help", {{"state", "failed"}}, 3);
  EXPECT_EQ(registry.Render(),
            "# HELP done_total Done\n# TYPE done_total counter\ndone_total 1\n"
            "# HELP jobs Jobs\n# TYPE jobs gauge\njobs{state=\"failed\"} 3\n");
}

TEST(MetricsRegistryTest, CollectorsRunBeforeEachRender) {
  MetricsRegistry registry;
  int runs = 0;
  registry.AddCollector([&runs](MetricsRegistry& r) {
    ++runs;
    // Re-fills per-state gauges from scratch, as a daemon would.
    r.ClearGauge("jobs");
    r.SetGauge("jobs", "Jobs", {{"state", runs % 2 == 1 ? "odd" : "even"}}, runs);
  });
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(registry.Render(), "# HELP jobs Jobs\n# TYPE jobs gauge\njobs{state=\"odd\"} 1\n");
  EXPECT_EQ(registry.Render(), "# HELP jobs Jobs\n# TYPE jobs gauge\njobs{state=\"even\"} 2\n");
  EXPECT_EQ(runs, 2);
}

// --- MetricsHttpServer -----------------------------------------------------

// A TCP connection to 127.0.0.1:port whose connect, send and recv each give
// up after 5 s; -1 (and a test failure) when it cannot connect. A nonzero
// `receive_buffer_bytes` shrinks the receive window (set before connecting).
int Connect(int port, int receive_buffer_bytes = 0) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  if (fd < 0) return -1;
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));  // also bounds connect()
  if (receive_buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(receive_buffer_bytes));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ADD_FAILURE() << "connect failed: " << std::strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

// Reads until the peer closes or the read times out. *error is 0 after a clean
// close (FIN), else the errno that ended it (EAGAIN: timed out, still open).
std::string ReadUntilClosed(int fd, int* error) {
  std::string data;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) data.append(buffer, n);
  *error = n == 0 ? 0 : errno;
  return data;
}

// Closes every socket it holds when the test ends, however it ends.
class HeldSockets final {
 public:
  HeldSockets() = default;
  HeldSockets(const HeldSockets&) = delete;
  HeldSockets& operator=(const HeldSockets&) = delete;
  ~HeldSockets() {
    for (int fd : fds_) close(fd);
  }
  int Add(int fd) {
    if (fd >= 0) fds_.push_back(fd);
    return fd;
  }
  size_t size() const { return fds_.size(); }

 private:
  std::vector<int> fds_;
};

struct HttpReply {
  std::string head;  // status line and headers, without the blank line
  std::string body;
  int status = 0;
};

HttpReply ParseReply(const std::string& data) {
  HttpReply reply;
  size_t split = data.find("\r\n\r\n");
  if (split == std::string::npos) return reply;
  reply.head = data.substr(0, split);
  reply.body = data.substr(split + 4);
  if (absl::StartsWith(reply.head, "HTTP/1.1 ")) reply.status = std::stoi(reply.head.substr(9, 3));
  return reply;
}

// Sends `request` raw to 127.0.0.1:port and reads until the server closes,
// which it must do cleanly within 5 s.
HttpReply RawRequest(int port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return {};
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  int error = 0;
  std::string data = ReadUntilClosed(fd, &error);
  EXPECT_EQ(error, 0) << "read error or timeout: " << std::strerror(error);
  close(fd);
  HttpReply reply = ParseReply(data);
  if (reply.status == 0) ADD_FAILURE() << "no HTTP reply in: " << data;
  return reply;
}

std::string Get(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
}

// The status of GET `path`, or 0 when no reply came back. Unlike RawRequest
// it tolerates a reset after the reply: a client refused with 503 may be
// reset, having sent a request the server never read.
int StatusOf(int port, const std::string& path) {
  int fd = Connect(port);
  if (fd < 0) return 0;
  std::string request = Get(path);
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  int error = 0;
  HttpReply reply = ParseReply(ReadUntilClosed(fd, &error));
  close(fd);
  return reply.status;
}

// GET `path` with a header padded so the whole request head is `head_bytes`.
std::string GetWithHeadOf(const std::string& path, size_t head_bytes) {
  std::string head = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nX-Pad: ";
  const std::string end = "\r\n\r\n";
  head.append(head_bytes - head.size() - end.size(), 'a');
  return head + end;
}

using Clock = std::chrono::steady_clock;

long long MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MetricsHttpOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.registry = &registry_;
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
  }

  MetricsRegistry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, ServesMetrics) {
  registry_.SetGauge("specstream_jobs", "Jobs by state", {{"state", "running"}}, 2);
  HttpReply reply = RawRequest(server_->port(), Get("/metrics"));
  EXPECT_EQ(reply.status, 200) << reply.head;
  EXPECT_NE(reply.head.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"),
            std::string::npos)
      << reply.head;
  EXPECT_NE(reply.head.find("\r\nConnection: close"), std::string::npos) << reply.head;
  EXPECT_NE(reply.head.find("\r\nContent-Length: " + std::to_string(reply.body.size())),
            std::string::npos)
      << reply.head;
  EXPECT_EQ(reply.body, registry_.Render());
  EXPECT_EQ(reply.body,
            "# HELP specstream_jobs Jobs by state\n# TYPE specstream_jobs gauge\n"
            "specstream_jobs{state=\"running\"} 2\n");

  // A query string and a bare-LF client are fine too.
  HttpReply query = RawRequest(server_->port(), "GET /metrics?x=1 HTTP/1.0\n\n");
  EXPECT_EQ(query.status, 200) << query.head;
  EXPECT_EQ(query.body, reply.body);
}

TEST_F(MetricsHttpServerTest, CollectorRunsPerScrape) {
  int scrapes = 0;
  registry_.AddCollector(
      [&scrapes](MetricsRegistry& r) { r.SetGauge("scrapes", "Scrapes", {}, ++scrapes); });
  EXPECT_EQ(RawRequest(server_->port(), Get("/metrics")).body,
            "# HELP scrapes Scrapes\n# TYPE scrapes gauge\nscrapes 1\n");
  EXPECT_EQ(RawRequest(server_->port(), Get("/metrics")).body,
            "# HELP scrapes Scrapes\n# TYPE scrapes gauge\nscrapes 2\n");
  // Other paths do not run collectors.
  RawRequest(server_->port(), Get("/healthz"));
  EXPECT_EQ(scrapes, 2);
}

TEST_F(MetricsHttpServerTest, HealthzNotFoundAndBadRequests) {
  HttpReply health = RawRequest(server_->port(), Get("/healthz"));
  EXPECT_EQ(health.status, 200) << health.head;
  EXPECT_EQ(health.body, "ok");

  HttpReply missing = RawRequest(server_->port(), Get("/nope"));
  EXPECT_EQ(missing.status, 404) << missing.head;

  HttpReply post =
      RawRequest(server_->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.status, 405) << post.head;
  EXPECT_NE(post.head.find("\r\nAllow: GET"), std::string::npos) << post.head;

  HttpReply garbage = RawRequest(server_->port(), "hello\r\n\r\n");
  EXPECT_EQ(garbage.status, 400) << garbage.head;

  // Still serving after all of that.
  EXPECT_EQ(RawRequest(server_->port(), Get("/healthz")).body, "ok");
}

// Adds to `held` `idle` connections that send nothing and one more that has
// sent `partial` (part of a request line), once the server had time to
// accept them.
void HoldIdleAndOneHalfSent(HeldSockets& held, int port, int idle, const std::string& partial) {
  for (int i = 0; i < idle; ++i) held.Add(Connect(port));
  const int slow = held.Add(Connect(port));
  ASSERT_EQ(held.size(), static_cast<size_t>(idle + 1));
  ASSERT_EQ(send(slow, partial.data(), partial.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(partial.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them be accepted
}

TEST_F(MetricsHttpServerTest, HealthzAnswersWhileIdleAndSlowClientsHoldConnections) {
  // The reproduction: six clients connect and send nothing, a seventh
  // has sent half a request line. None of them may delay a probe.
  HeldSockets held;
  ASSERT_NO_FATAL_FAILURE(HoldIdleAndOneHalfSent(held, server_->port(), 6, "GET /heal"));

  Clock::time_point start = Clock::now();
  HttpReply health = RawRequest(server_->port(), Get("/healthz"));
  long long elapsed_ms = MillisSince(start);
  EXPECT_EQ(health.status, 200) << health.head;
  EXPECT_EQ(health.body, "ok");
  EXPECT_LT(elapsed_ms, 1000) << "healthz took " << elapsed_ms << " ms";
  // A scrape is not held up either.
  EXPECT_EQ(RawRequest(server_->port(), Get("/metrics")).status, 200);
}

TEST_F(MetricsHttpServerTest, HealthzAnswersWithMoreIdleConnectionsThanTheCap) {
  // More silent clients than the server keeps open (64 by default): the
  // newest connection must still be answered, not queued behind them.
  // (A server that stops accepting leaves connects hanging: stop at the first.)
  HeldSockets held;
  for (int i = 0; i < 100; ++i) ASSERT_GE(held.Add(Connect(server_->port())), 0) << i;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  Clock::time_point start = Clock::now();
  HttpReply health = RawRequest(server_->port(), Get("/healthz"));
  long long elapsed_ms = MillisSince(start);
  EXPECT_EQ(health.status, 200) << health.head;
  EXPECT_EQ(health.body, "ok");
  EXPECT_LT(elapsed_ms, 1000) << "healthz took " << elapsed_ms << " ms";
}

TEST_F(MetricsHttpServerTest, AcceptsHeadsUpTo16KiBAndRefusesLargerOnes) {
  constexpr size_t kHeadLimit = size_t{16} << 10;
  HttpReply near_limit = RawRequest(server_->port(), GetWithHeadOf("/healthz", kHeadLimit));
  EXPECT_EQ(near_limit.status, 200) << near_limit.head;
  EXPECT_EQ(near_limit.body, "ok");

  // One byte over: refused, and the connection closed (RawRequest reads to
  // a clean close).
  HttpReply over = RawRequest(server_->port(), GetWithHeadOf("/healthz", kHeadLimit + 1));
  EXPECT_EQ(over.status, 431) << over.head;
  HttpReply far_over = RawRequest(server_->port(), GetWithHeadOf("/healthz", 4 * kHeadLimit));
  EXPECT_EQ(far_over.status, 431) << far_over.head;
  // A head that never ends is refused once it passes the bound, not read forever.
  int endless = Connect(server_->port());
  ASSERT_GE(endless, 0);
  std::string no_end = "GET /healthz HTTP/1.1\r\nX-Pad: " + std::string(kHeadLimit + 4096, 'a');
  EXPECT_EQ(send(endless, no_end.data(), no_end.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(no_end.size()));
  ASSERT_EQ(shutdown(endless, SHUT_WR), 0);
  int error = 0;
  HttpReply endless_reply = ParseReply(ReadUntilClosed(endless, &error));
  close(endless);
  EXPECT_EQ(endless_reply.status, 431) << endless_reply.head;
  EXPECT_EQ(error, 0) << std::strerror(error);

  EXPECT_EQ(RawRequest(server_->port(), Get("/healthz")).body, "ok");
}

TEST_F(MetricsHttpServerTest, DestructorReturnsPromptlyWithIdleClientsConnected) {
  // Clients that connect and never finish a request must not hold up
  // shutdown: not one, not many, not one mid-response.
  HeldSockets held;
  ASSERT_NO_FATAL_FAILURE(HoldIdleAndOneHalfSent(held, server_->port(), 20, "GET /metr"));

  Clock::time_point start = Clock::now();
  server_.reset();
  long long elapsed_ms = MillisSince(start);
  EXPECT_LT(elapsed_ms, 1000) << "shutdown took " << elapsed_ms << " ms";
}

// A server on 127.0.0.1, port 0, with the limits in `options`; nullptr (and
// a test failure) when it does not start.
std::unique_ptr<MetricsHttpServer> StartOnLoopback(MetricsRegistry* registry,
                                                   MetricsHttpOptions options) {
  options.host = "127.0.0.1";
  options.port = 0;
  options.registry = registry;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(MetricsHttpServerLimitsTest, ClosesIdleAndSlowDripClientsAfterTheReadTimeout) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.read_timeout = absl::Milliseconds(300);
  std::unique_ptr<MetricsHttpServer> server = StartOnLoopback(&registry, options);
  ASSERT_NE(server, nullptr);

  Clock::time_point start = Clock::now();
  HeldSockets held;
  int idle = held.Add(Connect(server->port()));
  int drip = held.Add(Connect(server->port()));
  ASSERT_EQ(held.size(), 2u);
  // The drip client sends a request line, then a header byte every 50 ms:
  // never quiet, never done. A timeout counted from its last byte would keep
  // it forever; the server must close it once 300 ms from accept are up.
  const std::string line = "GET /healthz HTTP/1.1\r\nX-Pad: ";
  ASSERT_EQ(send(drip, line.data(), line.size(), MSG_NOSIGNAL), static_cast<ssize_t>(line.size()));
  bool drip_closed = false;
  while (!drip_closed && MillisSince(start) < 5000) {
    pollfd readable{drip, POLLIN, 0};
    if (poll(&readable, 1, 50) > 0) {
      char byte;
      ssize_t n = recv(drip, &byte, 1, 0);
      ASSERT_LE(n, 0) << "the server answered a request that never ended";
      drip_closed = true;  // EOF, or a reset answering a byte sent after the close
    } else {
      drip_closed = send(drip, "a", 1, MSG_NOSIGNAL) != 1;
    }
  }
  long long drip_ms = MillisSince(start);
  EXPECT_TRUE(drip_closed) << "still open after " << drip_ms << " ms of dripping";
  EXPECT_GE(drip_ms, 300) << "closed before its read timeout";
  EXPECT_LT(drip_ms, 3000);

  // The silent client was closed too: a clean EOF, not our 5 s read timeout.
  int error = 0;
  EXPECT_EQ(ReadUntilClosed(idle, &error), "");
  EXPECT_EQ(error, 0) << std::strerror(error);
  EXPECT_LT(MillisSince(start), 3000);

  EXPECT_EQ(RawRequest(server->port(), Get("/healthz")).body, "ok");
}

TEST(MetricsHttpServerLimitsTest, AtTheCapTheOldestIdleConnectionsMakeRoom) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.max_connections = 4;
  std::unique_ptr<MetricsHttpServer> server = StartOnLoopback(&registry, options);
  ASSERT_NE(server, nullptr);

  HeldSockets held;
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) {
    idle.push_back(held.Add(Connect(server->port())));
    ASSERT_GE(idle.back(), 0) << i;
  }
  Clock::time_point start = Clock::now();
  HttpReply health = RawRequest(server->port(), Get("/healthz"));
  EXPECT_EQ(health.status, 200) << health.head;
  EXPECT_LT(MillisSince(start), 1000);

  // The first idle client was closed to make room (EOF at once, without
  // waiting for the 5 s read timeout); the newest is still open.
  pollfd first{idle.front(), POLLIN, 0};
  ASSERT_EQ(poll(&first, 1, 1000), 1);
  char byte;
  EXPECT_EQ(recv(idle.front(), &byte, 1, 0), 0);
  pollfd newest{idle.back(), POLLIN, 0};
  EXPECT_EQ(poll(&newest, 1, 0), 0) << "the newest idle connection was closed";
}

TEST(MetricsHttpServerLimitsTest, AnswersBusyWhenAllAreMidResponseAndResetsAStalledReader) {
  MetricsRegistry registry;
  // A 16 MiB response: far more than loopback socket buffers hold, so a
  // client that does not read keeps the server mid-response.
  const std::string wide(1 << 20, 'x');
  for (int i = 0; i < 16; ++i) {
    registry.SetGauge("wide", "Wide", {{"i", std::to_string(i)}, {"pad", wide}}, i);
  }
  MetricsHttpOptions options;
  options.max_connections = 1;
  options.write_timeout = absl::Milliseconds(500);
  std::unique_ptr<MetricsHttpServer> server = StartOnLoopback(&registry, options);
  ASSERT_NE(server, nullptr);

  HeldSockets held;
  int stalled = held.Add(Connect(server->port(), /*receive_buffer_bytes=*/4096));
  ASSERT_GE(stalled, 0);
  std::string request = Get("/metrics");
  ASSERT_EQ(send(stalled, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  pollfd response_started{stalled, POLLIN, 0};
  ASSERT_EQ(poll(&response_started, 1, 5000), 1);

  // The one slot holds a response in flight: a newcomer is told so at once.
  Clock::time_point start = Clock::now();
  int newcomer = held.Add(Connect(server->port()));
  ASSERT_GE(newcomer, 0);
  int error = 0;
  HttpReply busy = ParseReply(ReadUntilClosed(newcomer, &error));
  EXPECT_EQ(busy.status, 503) << busy.head;
  EXPECT_EQ(error, 0) << std::strerror(error);
  EXPECT_LT(MillisSince(start), 1000);

  // Past the write timeout the stalled response is given up, which frees
  // the slot.
  int status = 0;
  while (status != 200 && MillisSince(start) < 5000) {
    status = StatusOf(server->port(), "/healthz");
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200) << "the stalled response still holds the only slot";
  // The stalled client gets what was buffered, then the reset: a cut-off
  // response, not a hang.
  std::string got = ReadUntilClosed(stalled, &error);
  EXPECT_EQ(error, ECONNRESET) << std::strerror(error);
  EXPECT_LT(got.size(), size_t{16} << 20);
}

TEST(MetricsHttpServerStartTest, RejectsBadOptionsAndBusyPorts) {
  MetricsHttpOptions no_registry;
  EXPECT_EQ(MetricsHttpServer::Start(no_registry).status().code(),
            absl::StatusCode::kInvalidArgument);

  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  options.registry = &registry;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> first = MetricsHttpServer::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();

  options.port = (*first)->port();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second = MetricsHttpServer::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(options.port)),
            std::string::npos)
      << second.status();

  options.port = 70000;
  EXPECT_EQ(MetricsHttpServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);

  options.port = 0;
  MetricsHttpOptions no_connections = options;
  no_connections.max_connections = 0;
  EXPECT_EQ(MetricsHttpServer::Start(no_connections).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (absl::Duration bad :
       {absl::ZeroDuration(), absl::Seconds(-1), absl::Hours(2), absl::InfiniteDuration()}) {
    MetricsHttpOptions bad_read = options;
    bad_read.read_timeout = bad;
    absl::Status read_status = MetricsHttpServer::Start(bad_read).status();
    EXPECT_EQ(read_status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(read_status.message().find("read_timeout"), std::string::npos) << read_status;
    MetricsHttpOptions bad_write = options;
    bad_write.write_timeout = bad;
    absl::Status write_status = MetricsHttpServer::Start(bad_write).status();
    EXPECT_EQ(write_status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(write_status.message().find("write_timeout"), std::string::npos) << write_status;
  }
}

// --- StartMetricsEndpoint ---------------------------------------------------

// What each daemon's --metrics-port / --metrics-port-file do: -1 starts
// nothing and writes nothing; 0 binds a free port, serves the registry there
// and writes the port to the file.
TEST(MetricsEndpointTest, OffWritesNothingAndOnWritesItsBoundPort) {
  testing::TempDir dir;
  MetricsRegistry registry;
  registry.SetGauge("specstream_test_up", "Up.", {}, 1);
  auto off = StartMetricsEndpoint("127.0.0.1", -1, dir.Join("off.port"), &registry);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(*off, nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir.Join("off.port")));

  auto on = StartMetricsEndpoint("127.0.0.1", 0, dir.Join("on.port"), &registry);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_NE(*on, nullptr);
  EXPECT_EQ(testing::ReadFile(dir.Join("on.port")), absl::StrCat((*on)->port(), "\n"));
  EXPECT_TRUE(
      absl::StrContains(RawRequest((*on)->port(), Get("/metrics")).body, "specstream_test_up 1"));
}

}  // namespace
}  // namespace specstream
