#include "engine/namespace/metrics_endpoint.h"

#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/util/thread_role.h"

namespace ckptfs {
namespace {

using nlohmann::json;

constexpr size_t kMaxRequestBytes = 8192;

std::string Number(const json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v.get<double>());
  return buf;
}

// One unlabelled metric: its name, Prometheus type and help, and the key of the stats
// document (admin.h "stats") that holds its value.
struct Metric {
  const char* name;
  const char* type;
  const char* help;
  const char* key;
};

// The store's figures (the top level of the document).
constexpr Metric kStoreMetrics[] = {
    {"ckptfs_contents", "gauge", "File contents in the store.", "contents"},
    {"ckptfs_logical_bytes", "gauge", "Bytes of every content, as files.", "logical_bytes"},
    {"ckptfs_chunks", "gauge", "Distinct chunks stored.", "chunks"},
    {"ckptfs_pack_bytes", "gauge", "Bytes of the pack files on disk.", "pack_bytes"},
    {"ckptfs_stored_over_logical", "gauge", "pack_bytes / logical_bytes.", "stored_over_logical"},
    {"ckptfs_pack_read_bytes_total", "counter", "Bytes read from pack files.", "pack_read_bytes"},
    {"ckptfs_pack_reads_total", "counter", "Record reads from pack files.", "pack_reads"},
    {"ckptfs_cache_hits_total", "counter", "Decoded-chunk cache lookups that hit.", "cache_hits"},
    {"ckptfs_cache_misses_total", "counter", "Decoded-chunk cache lookups that missed.",
     "cache_misses"},
    {"ckptfs_prefetch_loads_total", "counter", "Chunk loads queued by prefetch.", "prefetch_loads"},
    {"ckptfs_read_loads_total", "counter",
     "Chunks a read decoded itself, neither cached nor being prefetched.", "read_loads"},
};

// What the daemon counted (the document's "daemon" object).
constexpr Metric kDaemonMetrics[] = {
    {"ckptfs_uptime_seconds", "gauge", "Seconds since the daemon started.", "uptime_seconds"},
    {"ckptfs_bytes_written_total", "counter", "Bytes written through the mount.", "bytes_written"},
    {"ckptfs_bytes_read_total", "counter", "Bytes read through the mount.", "bytes_read"},
    {"ckptfs_queued_commits", "gauge", "File commits queued or running.", "queued_commits"},
    {"ckptfs_pending_bytes", "gauge", "Bytes accepted by write() not yet durable.",
     "pending_bytes"},
    {"ckptfs_journaled_bytes", "gauge",
     "Bytes an fsync made durable in the fsync journal, not yet in the store.", "journaled_bytes"},
    {"ckptfs_view_inodes", "gauge", "Inodes of views (FILE@bf16, @tensors, ...) the daemon holds.",
     "view_inodes"},
};

json Get(const json& doc, const char* key) {
  return doc.is_object() && doc.contains(key) ? doc[key] : json();
}

// The metrics of `table` whose keys `doc` holds as numbers, with their HELP and TYPE lines.
template <size_t N>
void AppendMetrics(std::string* out, const Metric (&table)[N], const json& doc) {
  for (const Metric& m : table) {
    const json value = Get(doc, m.key);
    if (!value.is_number()) continue;
    out->append("# HELP ").append(m.name).append(" ").append(m.help).append("\n");
    out->append("# TYPE ").append(m.name).append(" ").append(m.type).append("\n");
    out->append(m.name).append(" ").append(Number(value)).append("\n");
  }
}

bool SendAll(int fd, const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::string PrometheusText(const json& s) {
  std::string out;
  AppendMetrics(&out, kStoreMetrics, s);
  const json d = Get(s, "daemon");
  if (!d.is_object()) return out;
  AppendMetrics(&out, kDaemonMetrics, d);
  const json latency = Get(d, "latency");
  if (latency.is_object()) {
    out += "# HELP ckptfs_latency_seconds Latency of the engine's read/write/fsync calls.\n";
    out += "# TYPE ckptfs_latency_seconds summary\n";
    for (const auto& [op, l] : latency.items()) {
      const std::string labels = "{op=\"" + op + "\"";
      for (const auto& [q, key] : {std::pair{"0.5", "p50_us"}, std::pair{"0.99", "p99_us"}}) {
        const json us = Get(l, key);
        if (!us.is_number()) continue;
        out += "ckptfs_latency_seconds" + labels + ",quantile=\"" + q + "\"} " +
               Number(us.get<double>() / 1e6) + "\n";
      }
      const json count = Get(l, "count");
      if (count.is_number())
        out += "ckptfs_latency_seconds_count" + labels + "} " + Number(count) + "\n";
    }
  }
  const json cpu = Get(d, "cpu_seconds");
  if (cpu.is_object()) {
    out += "# HELP ckptfs_cpu_seconds_total CPU time of the daemon by thread role.\n";
    out += "# TYPE ckptfs_cpu_seconds_total counter\n";
    for (const auto& [role, seconds] : cpu.items()) {
      if (seconds.is_number()) {
        out += "ckptfs_cpu_seconds_total{role=\"" + role + "\"} " + Number(seconds) + "\n";
      }
    }
  }
  return out;
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(uint16_t port, StatsFn stats) {
  FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::FromErrno(errno, "socket for the Prometheus endpoint");
  int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string where = "127.0.0.1:" + std::to_string(port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::FromErrno(
        errno, "Prometheus endpoint: bind " + where + " (is the port in use? choose another)");
  }
  if (::listen(fd.get(), 16) != 0) return Status::FromErrno(errno, "listen on " + where);
  socklen_t len = sizeof(addr);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::FromErrno(errno, "getsockname of " + where);
  }
  std::unique_ptr<MetricsEndpoint> e(
      new MetricsEndpoint(std::move(fd), ntohs(addr.sin_port), std::move(stats)));
  e->acceptor_ = std::thread([p = e.get()] {
    SetThreadRole("metrics");
    p->AcceptLoop();
  });
  spdlog::info("Prometheus endpoint at http://127.0.0.1:{}/metrics", e->port_);
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  stopping_ = true;
  ::shutdown(listen_fd_.get(), SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
}

void MetricsEndpoint::AcceptLoop() {
  while (!stopping_) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (!stopping_) spdlog::error("Prometheus endpoint: accept: {}", std::strerror(errno));
      return;
    }
    FileDescriptor conn(fd);
    Serve(conn.get());
  }
}

void MetricsEndpoint::Serve(int fd) {
  timeval timeout{2, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed, or silent for 2 s
    request.append(buf, static_cast<size_t>(n));
  }
  std::string status = "200 OK", body;
  const std::string line = request.substr(0, request.find("\r\n"));
  if (line.starts_with("GET /metrics ") || line.starts_with("GET / ")) {
    auto stats = stats_();
    if (stats.ok()) {
      body = PrometheusText(*stats);
    } else {
      status = "500 Internal Server Error";
      body = stats.status().ToString() + "\n";
    }
  } else if (line.starts_with("GET ")) {
    status = "404 Not Found";
    body = "ckptfs serves /metrics only\n";
  } else {
    status = "405 Method Not Allowed";
    body = "GET /metrics\n";
  }
  (void)SendAll(fd, "HTTP/1.1 " + status +
                        "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                        "Content-Length: " +
                        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
}

}  // namespace ckptfs
