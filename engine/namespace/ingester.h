// engine/namespace/ingester.h
//
// Threads that ingest spooled writes behind the writer (docs/fs.md, "Write path"): a write
// lands in a file's spool and returns; the Ingester later feeds the spooled bytes to the
// file's ContentWriter (cutting, and queueing chunks for hashing and encoding on the store's
// workers). Its threads are its own, not the store's worker pool: an ingest blocks while the
// store's in-flight budget is full, and only the pool's workers free that budget.
//
//   Ingester ingester(1, 4 << 20);
//   ingester.Schedule(file);   // after a write spooled new bytes; file is an IngestTarget
//
// A target scheduled while it is queued is queued once; a target is worked on by several
// threads only if it is scheduled again while one works on it, so IngestSome() must serialise
// itself. Thread-safe. The destructor finishes the call in progress, drops what is queued
// (targets must not depend on it: their owners wait for their own ingest), and joins.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "engine/util/buffer.h"
#include "engine/util/mutex.h"

namespace ckptfs {

class IngestTarget {
 public:
  virtual ~IngestTarget() = default;
  // Ingests some of what is pending, using `scratch` (the calling thread's buffer) to carry
  // bytes. Returns true when more is pending.
  virtual bool IngestSome(MutableBytes scratch) = 0;

 private:
  friend class Ingester;
  std::atomic<bool> queued_{false};
};

class Ingester {
 public:
  // scratch_bytes: each thread's buffer, allocated once (no page faults per write).
  Ingester(int threads, size_t scratch_bytes);
  ~Ingester();
  Ingester(const Ingester&) = delete;
  Ingester& operator=(const Ingester&) = delete;

  void Schedule(std::shared_ptr<IngestTarget> target);

 private:
  void Run();
  const size_t scratch_bytes_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<IngestTarget>> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptfs
