#include "engine/namespace/ingester.h"

#include "engine/util/thread_role.h"

namespace ckptfs {

Ingester::Ingester(int threads, size_t scratch_bytes) : scratch_bytes_(scratch_bytes) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] {
      SetThreadRole("ingest");
      Run();
    });
}

Ingester::~Ingester() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.NotifyAll();
  for (auto& t : threads_) t.join();
}

void Ingester::Schedule(std::shared_ptr<IngestTarget> target) {
  if (target->queued_.exchange(true)) return;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    queue_.push_back(std::move(target));
  }
  cv_.NotifyOne();
}

void Ingester::Run() {
  Buffer scratch(scratch_bytes_);
  for (;;) {
    std::shared_ptr<IngestTarget> target;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(lock);
      if (stopping_) return;
      target = std::move(queue_.front());
      queue_.pop_front();
    }
    // Cleared before the work: a write that comes during it schedules the target again.
    target->queued_ = false;
    if (target->IngestSome(scratch.mutable_bytes())) Schedule(std::move(target));
  }
}

}  // namespace ckptfs
