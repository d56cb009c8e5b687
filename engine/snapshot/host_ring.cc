#include "engine/snapshot/host_ring.h"

#include <algorithm>

namespace ckptfs::snapshot {

size_t HostRing::FitLocked(size_t n) const {
  if (regions_.empty()) return 0;
  const size_t tail = regions_.front().offset;  // the oldest live region
  if (head_ > tail) {
    if (capacity_ - head_ >= n) return head_;
    if (tail >= n) return 0;  // wrap: the end of the ring is skipped
    return SIZE_MAX;
  }
  if (head_ < tail && tail - head_ >= n) return head_;
  return SIZE_MAX;  // head_ == tail with regions live: full
}

Result<size_t> HostRing::Allocate(size_t n) {
  if (n == 0 || n > capacity_) {
    return Status::InvalidArgument("a staging region of " + std::to_string(n) +
                                   " bytes does not fit a ring of " + std::to_string(capacity_));
  }
  MutexLock lock(mu_);
  size_t at;
  while ((at = FitLocked(n)) == SIZE_MAX) freed_.Wait(lock);
  regions_.push_back(Region{at, n, false});
  head_ = at + n;
  used_ += n;
  peak_ = std::max(peak_, used_);
  return at;
}

void HostRing::Release(size_t offset) {
  {
    MutexLock lock(mu_);
    for (Region& r : regions_) {
      if (r.offset == offset && !r.released) {
        r.released = true;
        used_ -= r.size;
        break;
      }
    }
    while (!regions_.empty() && regions_.front().released) regions_.pop_front();
    if (regions_.empty()) head_ = 0;
  }
  freed_.NotifyAll();
}

size_t HostRing::used() const {
  MutexLock lock(mu_);
  return used_;
}

size_t HostRing::peak() const {
  MutexLock lock(mu_);
  return peak_;
}

}  // namespace ckptfs::snapshot
