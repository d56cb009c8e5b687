#include "engine/store/content_reader.h"

#include <algorithm>

namespace ckptfs {

std::pair<uint64_t, uint64_t> ReadaheadWindow::Advance(uint64_t offset, uint64_t n) {
  if (readahead_ == 0 || n == 0) return {0, 0};
  std::lock_guard lock(mu_);
  // The kernel may reorder a few requests of one sequential stream: allow some slack.
  const bool sequential = offset <= next_ + (1 << 20) && offset + (1 << 20) >= next_;
  next_ = offset + n;
  if (!sequential || prefetched_until_ >= next_ + readahead_ / 2) return {0, 0};
  const uint64_t from = std::max(prefetched_until_, next_);
  const uint64_t len = next_ + readahead_ - from;
  prefetched_until_ = from + len;
  return {from, len};
}

Result<size_t> ContentReader::Read(uint64_t offset, MutableBytes out) {
  CKPTFS_ASSIGN_OR_RETURN(size_t n, store_->Read(id_, offset, out));
  const auto [from, len] = window_.Advance(offset, n);
  if (len > 0) store_->Prefetch(id_, from, len, priority_);
  return n;
}

}  // namespace ckptfs
