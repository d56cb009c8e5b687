#include "engine/util/latency_histogram.h"

#include <bit>

namespace ckptfs {

int LatencyHistogram::BucketOf(uint64_t ns) {
  const int octave = std::bit_width(ns) - 1;  // 2^octave <= ns < 2^(octave+1)
  if (octave >= kOctaves) return kBuckets - 1;
  // The two bits below the leading one pick the quarter of the octave.
  const int sub = octave >= 2 ? static_cast<int>((ns >> (octave - 2)) & 3)
                              : static_cast<int>((ns << (2 - octave)) & 3);
  return octave * kSubBuckets + sub;
}

uint64_t LatencyHistogram::UpperBound(int b) {
  const int octave = b / kSubBuckets, sub = b % kSubBuckets;
  // Bucket (octave, sub) holds [2^octave * (4 + sub) / 4, 2^octave * (5 + sub) / 4).
  const uint64_t base = uint64_t{1} << octave;
  const uint64_t end = octave >= 2 ? (base >> 2) * static_cast<uint64_t>(5 + sub)
                                   : (base * static_cast<uint64_t>(5 + sub) + 3) / 4;
  return end > 1 ? end - 1 : 1;
}

uint64_t LatencyHistogram::count() const {
  uint64_t n = 0;
  for (const auto& b : buckets_) n += b.load(std::memory_order_relaxed);
  return n;
}

uint64_t LatencyHistogram::Percentile(double q) const {
  std::array<uint64_t, kBuckets> snap;
  uint64_t total = 0;
  for (int i = 0; i < kBuckets; ++i) {
    snap[i] = buckets_[i].load(std::memory_order_relaxed);
    total += snap[i];
  }
  if (total == 0) return 0;
  if (q > 1) q = 1;
  // The rank of the record that q names (1-based), at least the first.
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(total) + 0.999999);
  if (rank < 1) rank = 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += snap[i];
    if (seen >= rank) return UpperBound(i);
  }
  return UpperBound(kBuckets - 1);
}

}  // namespace ckptfs
