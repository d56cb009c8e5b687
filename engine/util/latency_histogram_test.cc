#include "engine/util/latency_histogram.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace ckptfs {
namespace {

TEST(LatencyHistogram, EmptyHasNoPercentile) {
  LatencyHistogram h;
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.Percentile(0.5), 0u);
}

TEST(LatencyHistogram, BucketsCoverEveryDurationInOrder) {
  // Every duration falls into a bucket whose bound is at least it and at most 25% above it.
  for (uint64_t ns : {1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 8ull, 100ull, 1000ull, 1023ull, 1024ull,
                      1025ull, 123456789ull, (1ull << 40) + 12345}) {
    const int b = LatencyHistogram::BucketOf(ns);
    EXPECT_GE(LatencyHistogram::UpperBound(b), ns) << ns;
    EXPECT_LE(static_cast<double>(LatencyHistogram::UpperBound(b)), 1.25 * ns + 1) << ns;
    if (b > 0) {
      EXPECT_LT(LatencyHistogram::UpperBound(b - 1), ns) << ns;
    }
  }
  for (int b = 1; b < LatencyHistogram::kBuckets; ++b) {
    EXPECT_GE(LatencyHistogram::UpperBound(b), LatencyHistogram::UpperBound(b - 1)) << b;
  }
  EXPECT_EQ(LatencyHistogram::BucketOf(~0ull), LatencyHistogram::kBuckets - 1);
}

TEST(LatencyHistogram, PercentilesOfAKnownSpread) {
  LatencyHistogram h;
  // 1..1000 microseconds, once each: p50 ~ 500 us, p99 ~ 990 us.
  for (int us = 1; us <= 1000; ++us) h.Record(std::chrono::microseconds(us));
  EXPECT_EQ(h.count(), 1000u);
  const double p50 = static_cast<double>(h.Percentile(0.5)), p99 = h.Percentile(0.99);
  EXPECT_GE(p50, 500e3);
  EXPECT_LE(p50, 500e3 * 1.25);
  EXPECT_GE(p99, 990e3);
  EXPECT_LE(p99, 990e3 * 1.25);
  EXPECT_GE(h.Percentile(1.0), 1000e3);
}

TEST(LatencyHistogram, ConcurrentRecordsAreAllCounted) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 10000; ++i) h.Record(std::chrono::nanoseconds(100 * (t + 1) + i));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.count(), 40000u);
}

}  // namespace
}  // namespace ckptfs
