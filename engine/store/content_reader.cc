#include "engine/store/content_reader.h"

namespace ckptfs {

Result<size_t> ContentReader::Read(uint64_t offset, MutableBytes out) {
  CKPTFS_ASSIGN_OR_RETURN(size_t n, store_->Read(id_, offset, out));
  if (readahead_ == 0 || n == 0) return n;
  uint64_t from = 0, len = 0;
  {
    std::lock_guard lock(mu_);
    // The kernel may reorder a few requests of one sequential stream: allow some slack.
    bool sequential = offset <= next_ + (1 << 20) && offset + (1 << 20) >= next_;
    next_ = offset + n;
    if (sequential && prefetched_until_ < next_ + readahead_ / 2) {
      from = std::max(prefetched_until_, next_);
      len = next_ + readahead_ - from;
      prefetched_until_ = from + len;
    }
  }
  if (len > 0) store_->Prefetch(id_, from, len);
  return n;
}

}  // namespace ckptfs
