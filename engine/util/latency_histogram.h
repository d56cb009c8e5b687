// engine/util/latency_histogram.h
//
// A fixed-size histogram of durations for the daemon's live statistics (docs/cli.md "stats"):
// Record() is one relaxed atomic increment, no allocation and no lock, so it may sit on the
// hot path of every read and write. Buckets are logarithmic, four per power of two from 1 ns
// to 2^48 ns (~3 days): a percentile is at most 25% above the true one (a bucket's width) and is
// reported as the bucket's upper bound, so it never understates.
//
//   LatencyHistogram h;
//   h.Record(std::chrono::nanoseconds(1500));
//   double p99_us = h.Percentile(0.99) / 1e3;
//
// Thread-safe. A Percentile() racing with Record() sees some consistent prefix of the records.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace ckptfs {

class LatencyHistogram {
 public:
  static constexpr int kSubBuckets = 4;  // per power of two
  static constexpr int kOctaves = 48;
  static constexpr int kBuckets = kOctaves * kSubBuckets;

  LatencyHistogram() = default;
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  void Record(std::chrono::nanoseconds d) {
    buckets_[BucketOf(d.count() < 1 ? 1 : static_cast<uint64_t>(d.count()))].fetch_add(
        1, std::memory_order_relaxed);
  }
  // How many durations were recorded.
  uint64_t count() const;
  // The duration (ns) at or below which a fraction q (0 < q <= 1) of the records lie, as the
  // upper bound of its bucket; 0 when nothing was recorded.
  uint64_t Percentile(double q) const;

  // REQUIRES: ns >= 1. The bucket `ns` falls into.
  static int BucketOf(uint64_t ns);
  // The largest duration (ns) bucket `b` holds.
  static uint64_t UpperBound(int b);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
};

// Records the time from construction to destruction into a histogram.
class ScopedLatency {
 public:
  explicit ScopedLatency(LatencyHistogram& h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~ScopedLatency() { h_.Record(std::chrono::steady_clock::now() - start_); }
  ScopedLatency(const ScopedLatency&) = delete;
  ScopedLatency& operator=(const ScopedLatency&) = delete;

 private:
  LatencyHistogram& h_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace ckptfs
