#include "engine/util/thread_role.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ckptfs {
namespace {

// Spins for `cpu` of this thread's CPU time.
void Burn(std::chrono::milliseconds cpu) {
  timespec start{}, now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  volatile uint64_t x = 0;
  do {
    for (int i = 0; i < 100000; ++i) x = x + i;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 <
           cpu.count());
}

TEST(ThreadRole, CpuOfANamedThreadCountsForItsRole) {
  std::atomic<bool> done{false}, stop{false};
  std::thread t([&] {
    SetThreadRole("testrole");
    Burn(std::chrono::milliseconds(300));
    done = true;
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto cpu = CpuByRole();
  stop = true;
  t.join();
  ASSERT_TRUE(cpu.count("testrole"));
  EXPECT_GE(cpu["testrole"], 0.25);                   // clock ticks: 10 ms granularity
  EXPECT_TRUE(cpu.count(std::string(kUnnamedRole)));  // this test's main thread
  EXPECT_TRUE(cpu.count(std::string(kExitedRole)));
}

TEST(ThreadRole, CpuOfExitedThreadsIsKept) {
  const double before = CpuByRole()[std::string(kExitedRole)];
  std::thread([] {
    SetThreadRole("gone");
    Burn(std::chrono::milliseconds(200));
  }).join();
  auto cpu = CpuByRole();
  EXPECT_FALSE(cpu.count("gone"));
  EXPECT_GE(cpu[std::string(kExitedRole)], before + 0.15);
}

}  // namespace
}  // namespace ckptfs
