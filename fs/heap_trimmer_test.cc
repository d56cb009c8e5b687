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
  explicit Ticks(size_t limit, bool huge_pages = true) : policy_(limit, huge_pages) {}
  HeapTrimPolicy::Action Next(double busy, size_t free_heap, size_t anon = 100 * kMiB) {
    now_ += HeapTrimPolicy::kTick;
    cpu_ += std::chrono::duration_cast<std::chrono::nanoseconds>(HeapTrimPolicy::kTick * busy);
    return policy_.Decide({now_, cpu_, anon}, [this, free_heap] {
      ++free_heap_asked_;
      return free_heap;
    });
  }
  bool Tick(double busy, size_t free_heap, size_t anon = 100 * kMiB) {
    HeapTrimPolicy::Action a = Next(busy, free_heap, anon);
    return a == HeapTrimPolicy::Action::kTrim || a == HeapTrimPolicy::Action::kTrimAndRest;
  }
  const HeapTrimPolicy& policy() const { return policy_; }
  int free_heap_asked() const { return free_heap_asked_; }
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
  int free_heap_asked_ = 0;
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

TEST(HeapTrimPolicy, TheHeapRestsAfterAQuietTrimUntilTheDaemonWorksAgain) {
  Ticks t(512 * kMiB);
  for (int i = 0; i < 20; ++i) t.Tick(1.0, 200 * kMiB);
  EXPECT_FALSE(t.policy().resting());
  EXPECT_EQ(t.TickIdleFor(2 * HeapTrimPolicy::kIdleWindow, 200 * kMiB), 1);
  EXPECT_TRUE(t.policy().resting());
  // Background work below the idle share does not wake it; the first busier tick does, once.
  EXPECT_EQ(t.Next(HeapTrimPolicy::kIdleCpuShare / 2, 200 * kMiB), HeapTrimPolicy::Action::kNone);
  EXPECT_EQ(t.Next(0.5, 200 * kMiB), HeapTrimPolicy::Action::kWake);
  EXPECT_FALSE(t.policy().resting());
  EXPECT_EQ(t.Next(0.5, 200 * kMiB), HeapTrimPolicy::Action::kNone);
}

TEST(HeapTrimPolicy, AQuietDaemonRestsEvenWithLittleToTrim) {
  // The holes that earlier trims (over the limit) left are what khugepaged would fill: the heap
  // rests once per quiet period, trimmed or not (tests/fs/test_daemon_heap.py failed under load,
  // where the free heap at the quiet moment was under the minimum now and then).
  Ticks t(512 * kMiB);
  for (int i = 0; i < 20; ++i) t.Tick(1.0, HeapTrimPolicy::kMinFreeBytes);
  HeapTrimPolicy::Action first = HeapTrimPolicy::Action::kNone;
  for (int i = 0; i < 80 && first == HeapTrimPolicy::Action::kNone; ++i) {
    first = t.Next(0, HeapTrimPolicy::kMinFreeBytes);
  }
  EXPECT_EQ(first, HeapTrimPolicy::Action::kRest);
  EXPECT_TRUE(t.policy().resting());
  EXPECT_EQ(t.TickIdleFor(2 * HeapTrimPolicy::kIdleWindow, 200 * kMiB), 0) << "once per period";
  EXPECT_EQ(t.Next(0.5, 200 * kMiB), HeapTrimPolicy::Action::kWake);
}

TEST(HeapTrimPolicy, AfterWakingTheNextQuietPeriodRestsAgain) {
  Ticks t(512 * kMiB);
  EXPECT_EQ(t.TickIdleFor(2 * HeapTrimPolicy::kIdleWindow, 200 * kMiB), 1);
  EXPECT_EQ(t.Next(0.5, 200 * kMiB), HeapTrimPolicy::Action::kWake);
  // A whole quiet window counted from the wake, then one more trim, and the heap rests.
  EXPECT_EQ(t.TickIdleFor(HeapTrimPolicy::kIdleWindow * 9 / 10, 200 * kMiB), 0);
  EXPECT_EQ(t.TickIdleFor(HeapTrimPolicy::kIdleWindow, 200 * kMiB), 1);
  EXPECT_TRUE(t.policy().resting());
}

TEST(HeapTrimPolicy, TheFreeHeapIsMeasuredOnlyWhereATrimIsPossible) {
  Ticks t(512 * kMiB);
  for (int i = 0; i < 100; ++i) t.Tick(0.8, 200 * kMiB);
  EXPECT_EQ(t.free_heap_asked(), 0);  // busy, under the limit
  t.Tick(0.8, 200 * kMiB, /*anon=*/600 * kMiB);
  EXPECT_EQ(t.free_heap_asked(), 1);  // over the limit
  t.TickIdleFor(3 * HeapTrimPolicy::kIdleWindow, 200 * kMiB);
  EXPECT_EQ(t.free_heap_asked(), 2);  // the quiet trim, once; resting ticks ask nothing
}

TEST(HeapTrimPolicy, AHeapWithoutHugePagesNeverRests) {
  Ticks t(512 * kMiB, /*huge_pages=*/false);
  EXPECT_EQ(t.TickIdleFor(2 * HeapTrimPolicy::kIdleWindow, 200 * kMiB), 1);  // trimmed, once
  EXPECT_FALSE(t.policy().resting());
  EXPECT_EQ(t.Next(0.5, 200 * kMiB), HeapTrimPolicy::Action::kNone);  // nothing to wake
}

TEST(HeapTrimPolicy, ATrimOverTheResidentLimitDoesNotRest) {
  Ticks t(512 * kMiB);
  EXPECT_EQ(t.Next(0.9, 100 * kMiB, /*anon=*/600 * kMiB), HeapTrimPolicy::Action::kTrim);
  EXPECT_FALSE(t.policy().resting());
}

}  // namespace
}  // namespace ckptfs
