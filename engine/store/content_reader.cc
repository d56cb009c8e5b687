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

ContentReader::~ContentReader() {
  consumed_->store(UINT64_MAX, std::memory_order_relaxed);  // queued prefetch is moot now
  for (const auto& [end, chunk] : streamed_) store_->DropStreamed(chunk);
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
  std::vector<ChunkId> drop;
  bool stream, stream_ahead;
  {
    MutexLock lock(mu_);
    if (!sequential) {
      // A jump: the stream (if any) ended; what it left behind is of no use to it.
      for (const auto& [end, chunk] : streamed_) drop.push_back(chunk);
      streamed_.clear();
      run_start_ = offset;
      furthest_ = offset;
    }
    stream = sequential && offset >= run_start_ + kStreamAfter;
    stream_ahead = sequential && from >= run_start_ + kStreamAfter;
  }
  for (const ChunkId& chunk : drop) store_->DropStreamed(chunk);
  drop.clear();
  const auto mode = stream ? ChunkReader::CacheMode::kStream : ChunkReader::CacheMode::kKeep;
  // Queued before this read loads its own chunks, so that the workers decode ahead while it
  // does.
  if (len > 0) {
    store_->Prefetch(id_, from, len, priority_,
                     stream_ahead ? ChunkReader::CacheMode::kStream : ChunkReader::CacheMode::kKeep,
                     consumed_);
  }
  const size_t first = out->size();
  CKPTFS_ASSIGN_OR_RETURN(size_t n, store_->ReadSlices(id_, offset, length, out, mode));
  if (!stream) return n;
  {
    MutexLock lock(mu_);
    for (size_t i = first; i < out->size(); ++i) {
      const ChunkSlice& slice = (*out)[i];
      if (slice.reaches_chunk_end()) streamed_.emplace_back(slice.content_end, slice.id);
    }
    furthest_ = std::max(furthest_, offset + n);
    const uint64_t behind = furthest_ > kStreamSlack ? furthest_ - kStreamSlack : 0;
    consumed_->store(behind, std::memory_order_relaxed);
    // Mostly in order; an entry out of order waits for the ones before it.
    while (!streamed_.empty() && streamed_.front().first <= behind) {
      drop.push_back(streamed_.front().second);
      streamed_.pop_front();
    }
  }
  for (const ChunkId& chunk : drop) store_->DropStreamed(chunk);
  return n;
}

}  // namespace ckptfs
