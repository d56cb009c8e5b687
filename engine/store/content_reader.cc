#include "engine/store/content_reader.h"

#include <algorithm>
#include <cstring>

namespace ckptfs {

std::pair<uint64_t, uint64_t> ReadaheadWindow::Advance(uint64_t offset, uint64_t n,
                                                       bool* sequential_out) {
  if (sequential_out) *sequential_out = false;
  if (readahead_ == 0 || n == 0) return {0, 0};
  MutexLock lock(mu_);
  // The kernel may reorder a few requests of one sequential stream: allow some slack.
  const bool sequential = offset <= next_ + (1 << 20) && offset + (1 << 20) >= next_;
  if (sequential_out) *sequential_out = sequential;
  next_ = offset + n;
  if (!sequential || prefetched_until_ >= next_ + readahead_ / 2) return {0, 0};
  const uint64_t from = std::max(prefetched_until_, next_);
  const uint64_t len = next_ + readahead_ - from;
  prefetched_until_ = from + len;
  return {from, len};
}

// Chunks partly returned stay cached (streamed entries, left to the LRU): a reader that opens
// the file again, or another one, may want the rest.
ContentReader::~ContentReader() {
  progress_->Close();  // queued prefetch is moot now
}

Result<size_t> ContentReader::Read(uint64_t offset, MutableBytes out) {
  std::vector<ChunkSlice> slices;
  CKPTFS_ASSIGN_OR_RETURN(size_t n, ReadSlices(offset, out.size(), &slices));
  size_t done = 0;
  for (const ChunkSlice& slice : slices) {
    std::memcpy(out.data() + done, slice.chunk->data() + slice.offset, slice.length);
    done += slice.length;
  }
  return n;
}

Result<size_t> ContentReader::ReadSlices(uint64_t offset, size_t length,
                                         std::vector<ChunkSlice>* out) {
  bool sequential = false;
  const auto [from, len] = window_.Advance(offset, length, &sequential);
  constexpr auto kStream = ChunkReader::CacheMode::kStream;
  // Queued before this read loads its own chunks, so that the workers decode ahead while it
  // does.
  if (len > 0) store_->Prefetch(id_, from, len, priority_, kStream, progress_);
  const size_t first = out->size();
  CKPTFS_ASSIGN_OR_RETURN(size_t n, store_->ReadSlices(id_, offset, length, out, kStream));
  std::vector<std::pair<ChunkId, uint64_t>> drop;  // with their ends
  {
    MutexLock lock(mu_);
    for (size_t i = first; i < out->size(); ++i) {
      const ChunkSlice& slice = (*out)[i];
      auto [it, added] = returned_.try_emplace(slice.id, 0);
      it->second += slice.length;
      if (it->second >= slice.chunk->size()) {  // returned whole (or parts of it twice)
        drop.emplace_back(slice.id, slice.content_end);
        returned_.erase(it);
      } else if (added) {
        partial_order_.push_back(slice.id);
      }
    }
    // The queue holds ids already dropped too: trim it with the map.
    while (partial_order_.size() > 2 * kMaxPartial ||
           (returned_.size() > kMaxPartial && !partial_order_.empty())) {
      returned_.erase(partial_order_.front());
      partial_order_.pop_front();
    }
    if (sequential) {
      furthest_ = std::max(furthest_, offset + n);
    } else {
      furthest_ = offset + n;
    }
    const uint64_t behind = furthest_ > kStreamSlack ? furthest_ - kStreamSlack : 0;
    progress_->Passed(behind);
  }
  for (const auto& [chunk, end] : drop) {
    progress_->Finished(chunk, end);
    store_->DropStreamed(chunk);
  }
  return n;
}

}  // namespace ckptfs
