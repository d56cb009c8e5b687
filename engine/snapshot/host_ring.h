// engine/snapshot/host_ring.h
//
// The staging ring: a fixed region of host memory (pinned by the CUDA backend, cudaHostAlloc)
// that staged blocks are copied into and that the persist workers drain. Regions are handed
// out in FIFO order and may be released in any order; the space of a released region is
// reused once every region allocated before it is released too.
//
//   HostRing ring(memory, 256 << 20);
//   auto at = ring.Allocate(n);        // blocks while the ring is full (backpressure)
//   std::memcpy(ring.at(*at), src, n);
//   ring.Release(*at);                 // by a persist worker, once the bytes are stored
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs::snapshot {

class HostRing {
 public:
  // `memory` (capacity bytes) must outlive the ring.
  HostRing(std::byte* memory, size_t capacity) : memory_(memory), capacity_(capacity) {}
  HostRing(const HostRing&) = delete;
  HostRing& operator=(const HostRing&) = delete;

  // The offset of n contiguous bytes, once they are free. InvalidArgument if n is 0 or more
  // than the capacity.
  Result<size_t> Allocate(size_t n);
  // REQUIRES: `offset` came from Allocate and was not released yet.
  void Release(size_t offset);
  std::byte* at(size_t offset) const { return memory_ + offset; }
  size_t capacity() const { return capacity_; }
  size_t used() const;
  // The most bytes allocated at once.
  size_t peak() const;

 private:
  struct Region {
    size_t offset;
    size_t size;
    bool released;
  };
  // The offset where n bytes fit now, or SIZE_MAX.
  size_t FitLocked(size_t n) const REQUIRES(mu_);

  std::byte* const memory_;
  const size_t capacity_;
  mutable Mutex mu_;
  CondVar freed_;
  std::deque<Region> regions_ GUARDED_BY(mu_);  // in allocation order
  size_t head_ GUARDED_BY(mu_) = 0;             // where the next region starts
  size_t used_ GUARDED_BY(mu_) = 0;
  size_t peak_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckptfs::snapshot
