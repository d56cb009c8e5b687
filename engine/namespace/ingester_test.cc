// Ingester: a target is queued once however often it is scheduled, and is called again while
// it reports more work.
#include "engine/namespace/ingester.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace ckptfs {
namespace {

class CountingTarget : public IngestTarget {
 public:
  explicit CountingTarget(int work) : left(work) {}
  bool IngestSome(MutableBytes scratch) override {
    EXPECT_EQ(scratch.size(), 1024u);
    std::lock_guard lock(mu);
    ++calls;
    if (left > 0) --left;
    return left > 0;
  }
  std::mutex mu;
  int left;
  int calls = 0;
};

TEST(IngesterTest, RunsATargetUntilItHasNoMoreWork) {
  auto target = std::make_shared<CountingTarget>(50);
  {
    Ingester ingester(2, 1024);
    ingester.Schedule(target);
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard lock(target->mu);
        if (target->left == 0) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::lock_guard lock(target->mu);
  EXPECT_EQ(target->left, 0);
  EXPECT_GE(target->calls, 50);
}

// The first call blocks until released; schedules meanwhile queue the target once.
class GatedTarget : public IngestTarget {
 public:
  bool IngestSome(MutableBytes) override {
    std::unique_lock lock(mu);
    ++calls;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
    return false;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int calls = 0;
};

TEST(IngesterTest, SchedulingAQueuedTargetQueuesItOnce) {
  auto target = std::make_shared<GatedTarget>();
  {
    Ingester ingester(1, 1024);
    ingester.Schedule(target);
    {
      std::unique_lock lock(target->mu);
      target->cv.wait(lock, [&] { return target->calls == 1; });
    }
    for (int i = 0; i < 100; ++i) ingester.Schedule(target);  // while the first call runs
    {
      std::lock_guard lock(target->mu);
      target->open = true;
    }
    target->cv.notify_all();
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard lock(target->mu);
        if (target->calls == 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // no third call comes
  }
  std::lock_guard lock(target->mu);
  EXPECT_EQ(target->calls, 2);
}

}  // namespace
}  // namespace ckptfs
