// engine/util/worker_pool.h
//
// A fixed set of threads running submitted tasks, FIFO within each of three priorities (a
// task runs only when no task of a higher priority is queued), and ByteBudget, the counting
// semaphore in bytes that bounds what the write pipeline holds in memory:
//
//   budget.Acquire(chunk.size());                  // blocks while the pipeline is full
//   pool.Submit([&, n = chunk.size()] { Work(); budget.Release(n); });
//
// The pool's queue is unbounded by itself: callers bound it through a ByteBudget. The
// destructor runs every queued task, then joins. Tasks must not throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "engine/util/mutex.h"

namespace ckptfs {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // kHigh: nothing uses it yet; kNormal: writes and most prefetch; kLow: prefetch that must
  // not delay the rest (optimizer state on restore).
  enum class Priority : uint8_t { kHigh = 0, kNormal = 1, kLow = 2 };
  void Submit(std::function<void()> task, Priority priority = Priority::kNormal);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Run() EXCLUDES(mu_);
  // The first non-empty queue by priority, or nullptr.
  std::deque<std::function<void()>>* NextQueue() REQUIRES(mu_);
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queues_[3] GUARDED_BY(mu_);  // by Priority
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

class ByteBudget {
 public:
  explicit ByteBudget(size_t capacity) : capacity_(capacity) {}
  // Blocks until n bytes fit. A request larger than the whole budget waits for the budget to
  // be empty, then proceeds alone, so progress is always possible.
  void Acquire(size_t n);
  void Release(size_t n);
  size_t used() const;
  // The most bytes held at once since construction.
  size_t peak() const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  CondVar cv_;
  size_t used_ GUARDED_BY(mu_) = 0;
  size_t peak_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckptfs
