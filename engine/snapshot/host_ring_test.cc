#include "engine/snapshot/host_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ckptfs::snapshot {
namespace {

TEST(HostRing, AllocatesInOrderAndWrapsOnceTheOldestIsReleased) {
  std::vector<std::byte> mem(100);
  HostRing ring(mem.data(), mem.size());
  EXPECT_EQ(*ring.Allocate(40), 0u);
  EXPECT_EQ(*ring.Allocate(40), 40u);
  ring.Release(0);
  EXPECT_EQ(*ring.Allocate(30), 0u);  // does not fit at the end (20 left): wraps
  EXPECT_EQ(ring.used(), 70u);
  ring.Release(40);
  ring.Release(0);
  EXPECT_EQ(ring.used(), 0u);
  EXPECT_EQ(*ring.Allocate(100), 0u);
  EXPECT_FALSE(ring.Allocate(101).ok());
}

TEST(HostRing, OutOfOrderReleaseFreesOnlyFromTheOldest) {
  std::vector<std::byte> mem(100);
  HostRing ring(mem.data(), mem.size());
  size_t a = *ring.Allocate(50), b = *ring.Allocate(50);
  ring.Release(b);  // the oldest (a) still holds the front
  std::atomic<bool> got{false};
  std::thread t([&] {
    EXPECT_EQ(*ring.Allocate(60), 0u);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());  // backpressure
  ring.Release(a);
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(ring.peak(), 100u);
}

TEST(HostRing, ManyThreadsNeverOverlap) {
  std::vector<std::byte> mem(1 << 16);
  HostRing ring(mem.data(), mem.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        size_t n = 1 + (i * 7919 + t * 31) % 9000;
        size_t at = *ring.Allocate(n);
        for (size_t k = 0; k < n; ++k) mem[at + k] = std::byte(t);
        for (size_t k = 0; k < n; ++k) ASSERT_EQ(mem[at + k], std::byte(t));
        ring.Release(at);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ring.used(), 0u);
}

}  // namespace
}  // namespace ckptfs::snapshot
