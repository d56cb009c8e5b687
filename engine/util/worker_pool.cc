#include "engine/util/worker_pool.h"

#include <algorithm>

#include "engine/util/thread_role.h"

namespace ckptfs {

WorkerPool::WorkerPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] {
      SetThreadRole("worker");
      Run();
    });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task, Priority priority) {
  {
    MutexLock lock(mu_);
    queues_[static_cast<int>(priority)].push_back(std::move(task));
  }
  cv_.NotifyOne();
}

std::deque<std::function<void()>>* WorkerPool::NextQueue() {
  for (auto& q : queues_) {
    if (!q.empty()) return &q;
  }
  return nullptr;
}

void WorkerPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      while (!stopping_ && NextQueue() == nullptr) cv_.Wait(lock);
      std::deque<std::function<void()>>* q = NextQueue();
      if (q == nullptr) return;  // stopping and drained
      task = std::move(q->front());
      q->pop_front();
    }
    task();
  }
}

void ByteBudget::Acquire(size_t n) {
  MutexLock lock(mu_);
  while (used_ != 0 && used_ + n > capacity_) cv_.Wait(lock);
  used_ += n;
  peak_ = std::max(peak_, used_);
}

void ByteBudget::Release(size_t n) {
  {
    MutexLock lock(mu_);
    used_ -= n;
  }
  cv_.NotifyAll();
}

size_t ByteBudget::used() const {
  MutexLock lock(mu_);
  return used_;
}

size_t ByteBudget::peak() const {
  MutexLock lock(mu_);
  return peak_;
}

}  // namespace ckptfs
