#include "fs/heap_trimmer.h"

#include <gtest/gtest.h>

#include <chrono>

namespace ckptfs {
namespace {

using std::chrono::milliseconds;
constexpr size_t kMiB = 1 << 20;

// Drives a policy tick by tick: each tick advances the clock by kTick and the process CPU by
// `busy` of that tick.
class Ticks {
 public:
  explicit Ticks(size_t limit) : policy_(limit) {}
  bool Tick(double busy, size_t free_heap, size_t anon = 100 * kMiB) {
    now_ += HeapTrimPolicy::kTick;
    cpu_ += std::chrono::duration_cast<std::chrono::nanoseconds>(HeapTrimPolicy::kTick * busy);
    return policy_.ShouldTrim({now_, cpu_, free_heap, anon});
  }
  // Ticks until the policy has seen a whole idle window; returns how many said "trim".
  int TickIdleFor(milliseconds d, size_t free_heap) {
    int trims = 0;
    for (auto t = milliseconds(0); t < d; t += HeapTrimPolicy::kTick) trims += Tick(0, free_heap);
    return trims;
  }

 private:
  HeapTrimPolicy policy_;
  std::chrono::steady_clock::time_point now_{};
  std::chrono::nanoseconds cpu_{0};
};

TEST(HeapTrimPolicy, ABusyDaemonKeepsItsFreeHeap) {
  Ticks t(512 * kMiB);
  for (int i = 0; i < 40; ++i) EXPECT_FALSE(t.Tick(/*busy=*/0.8, /*free_heap=*/200 * kMiB)) << i;
}

TEST(HeapTrimPolicy, AQuietDaemonTrimsOncePerQuietPeriod) {
  Ticks t(512 * kMiB);
  for (int i = 0; i < 100; ++i) t.Tick(1.0, 200 * kMiB);
  // Not before (nearly) a whole window was quiet; then once, however long it stays quiet.
  EXPECT_EQ(t.TickIdleFor(HeapTrimPolicy::kIdleWindow * 9 / 10, 200 * kMiB), 0);
  EXPECT_EQ(t.TickIdleFor(3 * HeapTrimPolicy::kIdleWindow, 200 * kMiB), 1);
  // Busy again, then quiet again: one more trim.
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(t.Tick(0.5, 200 * kMiB));
  EXPECT_EQ(t.TickIdleFor(3 * HeapTrimPolicy::kIdleWindow, 200 * kMiB), 1);
}

TEST(HeapTrimPolicy, LittleFreeHeapIsNotWorthATrim) {
  Ticks t(512 * kMiB);
  EXPECT_EQ(t.TickIdleFor(2 * HeapTrimPolicy::kIdleWindow, HeapTrimPolicy::kMinFreeBytes), 0);
  EXPECT_FALSE(t.Tick(0.9, HeapTrimPolicy::kMinFreeBytes, /*anon=*/900 * kMiB));
}

TEST(HeapTrimPolicy, ABusyDaemonOverItsResidentLimitTrims) {
  Ticks t(512 * kMiB);
  EXPECT_FALSE(t.Tick(0.9, 100 * kMiB, /*anon=*/512 * kMiB));
  EXPECT_TRUE(t.Tick(0.9, 100 * kMiB, /*anon=*/513 * kMiB));
  EXPECT_TRUE(t.Tick(0.9, 100 * kMiB, /*anon=*/600 * kMiB));
}

TEST(HeapTrimPolicy, ALittleBackgroundWorkStillCountsAsQuiet) {
  Ticks t(512 * kMiB);
  int trims = 0;
  for (int i = 0; i < 200; ++i) trims += t.Tick(HeapTrimPolicy::kIdleCpuShare / 2, 64 * kMiB);
  EXPECT_EQ(trims, 1);
}

}  // namespace
}  // namespace ckptfs
