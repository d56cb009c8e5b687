#include "engine/util/worker_pool.h"

#include <gtest/gtest.h>

#include <future>
#include <string>

namespace ckptfs {
namespace {

TEST(WorkerPoolTest, HigherPrioritiesRunFirstFifoWithin) {
  std::string order;
  std::mutex mu;
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  {
    WorkerPool pool(1);
    std::promise<void> running;
    pool.Submit([&] {
      running.set_value();
      started.wait();  // holds the only thread while the rest is queued
    });
    running.get_future().wait();
    using P = WorkerPool::Priority;
    for (auto [c, p] : {std::pair{'a', P::kLow},
                        {'b', P::kNormal},
                        {'c', P::kHigh},
                        {'d', P::kLow},
                        {'e', P::kNormal}}) {
      pool.Submit(
          [&, c = c] {
            std::lock_guard lock(mu);
            order += c;
          },
          p);
    }
    go.set_value();
  }  // the destructor runs every queued task
  EXPECT_EQ(order, "cbead");
}

}  // namespace
}  // namespace ckptfs
