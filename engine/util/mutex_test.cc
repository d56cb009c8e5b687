#include "engine/util/mutex.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace ckptfs {
namespace {

struct Counter {
  Mutex mu;
  CondVar cv;
  int n GUARDED_BY(mu) = 0;
};

TEST(MutexTest, MutexLockExcludesOtherThreads) {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        MutexLock lock(c.mu);
        ++c.n;
      }
    });
  }
  for (auto& t : threads) t.join();
  MutexLock lock(c.mu);
  EXPECT_EQ(c.n, 400000);
}

TEST(MutexTest, CondVarWakesAWaiterAndUnlockLetsOthersIn) {
  Counter c;
  std::thread waiter([&] {
    MutexLock lock(c.mu);
    while (c.n == 0) c.cv.Wait(lock);
    c.n = 2;
    c.cv.NotifyAll();
  });
  {
    MutexLock lock(c.mu);
    c.n = 1;
    c.cv.NotifyAll();
    while (c.n != 2) c.cv.Wait(lock);
    lock.Unlock();  // another thread may take the mutex now
    std::thread([&] {
      MutexLock inner(c.mu);
      c.n = 3;
    }).join();
    lock.Lock();
    EXPECT_EQ(c.n, 3);
  }
  waiter.join();
}

}  // namespace
}  // namespace ckptfs
