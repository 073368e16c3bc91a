#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

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

struct HttpReply {
  std::string head;  // status line and headers, without the blank line
  std::string body;
  int status = 0;
};

// Sends `request` raw to 127.0.0.1:port and reads until the server closes.
HttpReply RawRequest(int port, const std::string& request) {
  HttpReply reply;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  if (fd < 0) return reply;
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ADD_FAILURE() << "connect failed: " << std::strerror(errno);
    close(fd);
    return reply;
  }
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string data;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) data.append(buffer, n);
  EXPECT_EQ(n, 0) << "read error or timeout: " << std::strerror(errno);
  close(fd);
  size_t split = data.find("\r\n\r\n");
  if (split == std::string::npos) {
    ADD_FAILURE() << "no header end in: " << data;
    return reply;
  }
  reply.head = data.substr(0, split);
  reply.body = data.substr(split + 4);
  if (reply.head.rfind("HTTP/1.1 ", 0) == 0) reply.status = std::stoi(reply.head.substr(9, 3));
  return reply;
}

std::string Get(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
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

TEST_F(MetricsHttpServerTest, DestructorReturnsPromptlyWithAnIdleClientConnected) {
  // A client that connects and never sends anything holds the (single)
  // serving thread inside its read timeout; shutdown must not wait it out.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server_->port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let it be accepted

  auto start = std::chrono::steady_clock::now();
  server_.reset();
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  close(fd);
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
}

}  // namespace
}  // namespace specstream
