// engine/store/content_reader.h
//
// Reads one content for one reader (a file handle), prefetching ahead when access is
// sequential: after a read that continues the previous one, the next `readahead_bytes` are
// loaded into the store's chunk cache on the worker pool, so the following reads hit memory.
//
//   ContentReader reader(store, content, 8 << 20);
//   CKPTFS_ASSIGN_OR_RETURN(size_t n, reader.Read(offset, out));
//
// A sequential reader's chunks past the first kStreamAfter bytes of its run (the ones it
// prefetches and the ones it loads itself) are streamed cache entries, decoded without
// caching their delta bases, and dropped again once the reader is kStreamSlack bytes past
// their end: a file read once from start to end holds about readahead_bytes + kStreamAfter
// of the cache, never evicts it and never fills it. Prefetch that a worker reaches only after
// the reader has passed it is skipped. Random reads cache as usual. With
// WorkerPool::Priority::kLow the prefetch waits behind writes and every other prefetch (the
// FUSE layer gives optimizer-state files that priority, so parameters load first on restore).
// ReadaheadWindow is the sequential-access detector alone, for readers of other byte streams
// (the views). Thread-safe. REQUIRES: the store outlives the reader.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "engine/store/store.h"
#include "engine/util/mutex.h"

namespace ckptfs {

class ReadaheadWindow {
 public:
  explicit ReadaheadWindow(uint64_t readahead_bytes) : readahead_(readahead_bytes) {}
  // Records a read of n bytes at offset; returns the range {from, length} to prefetch now
  // (length 0: nothing), which is never handed out twice. *sequential (when given) tells
  // whether the read continues the previous one.
  std::pair<uint64_t, uint64_t> Advance(uint64_t offset, uint64_t n, bool* sequential = nullptr);

 private:
  const uint64_t readahead_;
  Mutex mu_;
  uint64_t next_ GUARDED_BY(mu_) = 0;  // where a sequential read would start
  uint64_t prefetched_until_ GUARDED_BY(mu_) = 0;
};

class ContentReader {
 public:
  ContentReader(const Store* store, ContentId id, uint64_t readahead_bytes,
                WorkerPool::Priority priority = WorkerPool::Priority::kNormal)
      : store_(store), id_(id), window_(readahead_bytes), priority_(priority) {}
  ~ContentReader();
  ContentReader(const ContentReader&) = delete;
  ContentReader& operator=(const ContentReader&) = delete;

  Result<size_t> Read(uint64_t offset, MutableBytes out);
  // The same without a copy (Store::ReadSlices): the slices keep their chunks alive.
  Result<size_t> ReadSlices(uint64_t offset, size_t length, std::vector<ChunkSlice>* out);
  ContentId id() const { return id_; }

  // How far behind the furthest read a streamed chunk is kept: concurrent requests of one
  // stream may arrive a little out of order.
  static constexpr uint64_t kStreamSlack = 2 << 20;
  // A run of sequential reads streams once it is this long (a few nearby reads are not a scan).
  static constexpr uint64_t kStreamAfter = 4 << 20;

 private:
  const Store* const store_;
  const ContentId id_;
  ReadaheadWindow window_;
  const WorkerPool::Priority priority_;
  Mutex mu_;
  // Streamed chunks this reader has read to their end, not yet dropped: {end, id}.
  std::deque<std::pair<uint64_t, ChunkId>> streamed_ GUARDED_BY(mu_);
  uint64_t run_start_ GUARDED_BY(mu_) = 0;  // where the current sequential run started
  uint64_t furthest_ GUARDED_BY(mu_) = 0;
  // Chunks ending at or before this are behind the reader: prefetch skips them.
  const std::shared_ptr<std::atomic<uint64_t>> consumed_ =
      std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace ckptfs
