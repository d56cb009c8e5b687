#include "engine/util/worker_pool.h"

#include <algorithm>

namespace ckptfs {

WorkerPool::WorkerPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task, Priority priority) {
  {
    std::lock_guard lock(mu_);
    queues_[static_cast<int>(priority)].push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkerPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      auto next = [&]() -> std::deque<std::function<void()>>* {
        for (auto& q : queues_) {
          if (!q.empty()) return &q;
        }
        return nullptr;
      };
      cv_.wait(lock, [&] { return stopping_ || next() != nullptr; });
      std::deque<std::function<void()>>* q = next();
      if (q == nullptr) return;  // stopping and drained
      task = std::move(q->front());
      q->pop_front();
    }
    task();
  }
}

void ByteBudget::Acquire(size_t n) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return used_ == 0 || used_ + n <= capacity_; });
  used_ += n;
  peak_ = std::max(peak_, used_);
}

void ByteBudget::Release(size_t n) {
  {
    std::lock_guard lock(mu_);
    used_ -= n;
  }
  cv_.notify_all();
}

size_t ByteBudget::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

size_t ByteBudget::peak() const {
  std::lock_guard lock(mu_);
  return peak_;
}

}  // namespace ckptfs
