#include "engine/namespace/metrics_endpoint.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ckptfs {
namespace {

using nlohmann::json;

json OfflineStats() {
  return {{"contents", 3},     {"logical_bytes", 1000},
          {"pack_bytes", 400}, {"stored_over_logical", 0.4},
          {"cache_hits", 7},   {"daemon", nullptr}};
}

TEST(PrometheusText, StoreFiguresWithoutADaemon) {
  const std::string text = PrometheusText(OfflineStats());
  EXPECT_NE(text.find("# TYPE ckptfs_logical_bytes gauge\nckptfs_logical_bytes 1000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ckptfs_cache_hits_total 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ckptfs_stored_over_logical 0.4\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("ckptfs_bytes_written_total"), std::string::npos);  // no daemon
  EXPECT_EQ(text.find("ckptfs_pack_reads_total"), std::string::npos);     // absent field
}

TEST(PrometheusText, DaemonLatencyAndCpu) {
  json s = OfflineStats();
  s["daemon"] = {{"bytes_written", 4096},
                 {"latency", {{"write", {{"count", 2}, {"p50_us", 5.0}, {"p99_us", 250.0}}}}},
                 {"cpu_seconds", {{"worker", 1.5}, {"fuse", 0.25}}},
                 {"pending_bytes", 0}};
  const std::string text = PrometheusText(s);
  for (const char* line :
       {"ckptfs_bytes_written_total 4096\n",
        "ckptfs_latency_seconds{op=\"write\",quantile=\"0.5\"} 5e-06\n",
        "ckptfs_latency_seconds{op=\"write\",quantile=\"0.99\"} 0.00025\n",
        "ckptfs_latency_seconds_count{op=\"write\"} 2\n",
        "ckptfs_cpu_seconds_total{role=\"worker\"} 1.5\n", "ckptfs_pending_bytes 0\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " in\n" << text;
  }
}

// `request` sent to 127.0.0.1:port; the whole answer.
std::string Ask(uint16_t port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)!::write(fd, request.data(), request.size());
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, n);
  ::close(fd);
  return answer;
}

TEST(MetricsEndpoint, ServesMetricsOnLoopbackUntilDestroyed) {
  int scrapes = 0;
  auto e = MetricsEndpoint::Start(0, [&]() -> Result<json> {
    ++scrapes;
    return OfflineStats();
  });
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const uint16_t port = (*e)->port();
  ASSERT_NE(port, 0);
  std::string ok = Ask(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_NE(ok.find("ckptfs_logical_bytes 1000\n"), std::string::npos) << ok;
  EXPECT_EQ(scrapes, 1);
  EXPECT_TRUE(Ask(port, "GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
  EXPECT_TRUE(Ask(port, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
  EXPECT_EQ(scrapes, 1);
  // A second endpoint cannot take the same port: the error names it.
  auto twice = MetricsEndpoint::Start(port, [] { return Result<json>(json::object()); });
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().ToString().find(std::to_string(port)), std::string::npos);
  e->reset();
  EXPECT_EQ(Ask(port, "GET /metrics HTTP/1.1\r\n\r\n"), "connect failed");
}

TEST(MetricsEndpoint, AFailedScrapeIsA500) {
  auto e = MetricsEndpoint::Start(
      0, []() -> Result<json> { return Status::IOError("catalog unreadable"); });
  ASSERT_TRUE(e.ok());
  std::string answer = Ask((*e)->port(), "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 500")) << answer;
  EXPECT_NE(answer.find("catalog unreadable"), std::string::npos);
}

}  // namespace
}  // namespace ckptfs
