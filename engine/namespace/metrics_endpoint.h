// engine/namespace/metrics_endpoint.h
//
// The daemon's optional Prometheus endpoint (`ckptfs mount --prometheus PORT`, -o
// prometheus=PORT; off by default): an HTTP server on 127.0.0.1 only, answering
// `GET /metrics` (and `GET /`) with the statistics of `ckptfs stats` (admin.h, request
// "stats") in Prometheus' text format, generated at each scrape. Nothing else is served; one
// connection at a time, each closed after its answer (a scrape every few seconds is the load
// it is made for; a client that sends nothing is dropped after 2 s).
//
//   auto endpoint = MetricsEndpoint::Start(9464, [&] { return RunAdmin(store, fs, stats); });
//
// Thread-safe; the destructor stops accepting and joins.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/util/file.h"
#include "engine/util/status.h"

namespace ckptfs {

// The stats document in Prometheus' text exposition format (version 0.0.4): store figures as
// gauges, counters as *_total, the daemon's latency percentiles as a summary per op
// (ckptfs_latency_seconds{op,quantile}), CPU as ckptfs_cpu_seconds_total{role}. Fields that
// are null or absent (an offline document has no daemon) are left out.
std::string PrometheusText(const nlohmann::json& stats);

class MetricsEndpoint {
 public:
  using StatsFn = std::function<Result<nlohmann::json>()>;
  // Listens on 127.0.0.1:port (0: a free port, see port()). IOError naming the port when it
  // cannot (in use, or not allowed).
  static Result<std::unique_ptr<MetricsEndpoint>> Start(uint16_t port, StatsFn stats);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  uint16_t port() const { return port_; }

 private:
  MetricsEndpoint(FileDescriptor fd, uint16_t port, StatsFn stats)
      : listen_fd_(std::move(fd)), port_(port), stats_(std::move(stats)) {}
  void AcceptLoop();
  void Serve(int fd);

  FileDescriptor listen_fd_;
  const uint16_t port_;
  const StatsFn stats_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
};

}  // namespace ckptfs
