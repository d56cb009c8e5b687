#include "engine/namespace/committer.h"

#include "engine/util/thread_role.h"

namespace ckptfs {

Committer::Committer(ReleasedFn on_released)
    : on_released_(std::move(on_released)), thread_([this] {
        SetThreadRole("commit");
        Run();
      }) {}

Committer::~Committer() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

Status Committer::Commit(std::shared_ptr<OpenInode> file, bool release, bool wait) {
  return Enqueue(Request{std::move(file), release, false, nullptr}, wait);
}

Status Committer::Journal(std::shared_ptr<OpenInode> file) {
  return Enqueue(Request{std::move(file), false, /*journal=*/true, nullptr}, /*wait=*/true);
}

Status Committer::Barrier() {
  return Enqueue(Request{nullptr, false, false, nullptr}, /*wait=*/true);
}

Status Committer::Enqueue(Request request, bool wait) {
  std::future<Status> done;
  if (wait) {
    request.done = std::make_shared<std::promise<Status>>();
    done = request.done->get_future();
  }
  {
    MutexLock lock(mu_);
    if (request.file) depth_.fetch_add(1, std::memory_order_relaxed);
    queue_.push_back(std::move(request));
  }
  cv_.NotifyAll();
  return wait ? done.get() : Status::OK();
}

void Committer::Run() {
  Status failed_since_barrier;  // reported to the next barrier (Sync, Seal, unmount)
  for (;;) {
    Request req;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(lock);
      if (queue_.empty()) return;
      req = std::move(queue_.front());
      queue_.pop_front();
    }
    Status s;
    if (req.file) {
      if (req.journal) {
        Result<bool> journaled = req.file->Journal();
        s = !journaled.ok() ? journaled.status() : *journaled ? Status::OK() : req.file->Commit();
      } else {
        s = req.file->Commit();
      }
      if (req.release && on_released_) on_released_(req.file);
      depth_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (!s.ok() && failed_since_barrier.ok()) failed_since_barrier = s;
    if (!req.file) {
      s = failed_since_barrier;
      failed_since_barrier = Status::OK();
    }
    if (req.done) req.done->set_value(s);
  }
}

}  // namespace ckptfs
