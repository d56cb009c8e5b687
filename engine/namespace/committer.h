// engine/namespace/committer.h
//
// Commits open files one at a time, in the order they were queued, on one thread of its own.
// That order is the durability order the filesystem promises (docs/fs.md): a file closed
// after another never becomes durable before it.
//
//   Committer committer([](const std::shared_ptr<OpenInode>& f) { /* forget f */ });
//   committer.Commit(file, /*release=*/true, /*wait=*/false);  // close(): returns at once
//   CKPTFS_RETURN_IF_ERROR(committer.Commit(file, false, /*wait=*/true));  // fsync()
//   CKPTFS_RETURN_IF_ERROR(committer.Journal(file));  // fsync() of a passthrough file
//   CKPTFS_RETURN_IF_ERROR(committer.Barrier());  // sync(): everything queued before
//
// A commit that fails is logged by OpenInode::Commit and reported to whoever waits for it, and
// to the next Barrier(), which returns the first failure since the previous barrier.
// After a release commit (the file's last handle went) `on_released` runs on the committer
// thread, so that the owner can forget the file. Thread-safe. The destructor runs what is
// queued, then joins.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "engine/namespace/open_inode.h"
#include "engine/util/mutex.h"

namespace ckptfs {

class Committer {
 public:
  using ReleasedFn = std::function<void(const std::shared_ptr<OpenInode>&)>;
  explicit Committer(ReleasedFn on_released);
  ~Committer();
  Committer(const Committer&) = delete;
  Committer& operator=(const Committer&) = delete;

  // Queues a commit of `file`; with wait, returns its status once it ran.
  Status Commit(std::shared_ptr<OpenInode> file, bool release, bool wait);
  // fsync() of a passthrough file: in queue order, makes its bytes durable in its journal
  // (OpenInode::Journal), or commits it where that does not apply; waits.
  Status Journal(std::shared_ptr<OpenInode> file);
  // Returns once everything queued before it ran: the first failure since the last barrier.
  Status Barrier();
  // Commits queued or running now (barriers not counted).
  uint64_t depth() const { return depth_.load(std::memory_order_relaxed); }

 private:
  struct Request {
    std::shared_ptr<OpenInode> file;  // null: a barrier
    bool release = false;             // the last handle went: on_released afterwards
    bool journal = false;             // Journal() rather than Commit()
    std::shared_ptr<std::promise<Status>> done;
  };
  Status Enqueue(Request request, bool wait);
  void Run();

  const ReleasedFn on_released_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Request> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> depth_{0};
  std::thread thread_;
};

}  // namespace ckptfs
