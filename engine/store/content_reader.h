// engine/store/content_reader.h
//
// Reads one content for one reader (a file handle), prefetching ahead when access is
// sequential: after a read that continues the previous one, the next `readahead_bytes` are
// loaded into the store's chunk cache on the worker pool, so the following reads hit memory.
//
//   ContentReader reader(store, content, 8 << 20);
//   CKPTFS_ASSIGN_OR_RETURN(size_t n, reader.Read(offset, out));
//
// Every chunk the reader loads (itself or by prefetch) is a streamed cache entry, decoded
// without caching its delta bases, and dropped again once the reader has returned every byte
// of it: what a reader returned, its caller keeps (the kernel's page cache, for a FUSE file),
// so a chunk read to its end is of no further use here. A file read once, in any order (a
// torch.load jumps between record headers and data), therefore holds only the chunks it has
// partly read and the prefetch window, never evicts the cache by more and never fills it;
// a chunk read in parts by random reads stays until its last part is read (or the LRU evicts
// it). Another reader's ordinary lookup makes an entry ordinary, which dropping leaves alone.
// Prefetch that a worker reaches only after the reader has passed the chunk, or returned it
// whole, is skipped (read_progress.h). With WorkerPool::Priority::kLow the prefetch waits
// behind writes and every other prefetch (the FUSE layer gives optimizer-state files that
// priority, so parameters load first on restore).
// ReadaheadWindow is the sequential-access detector alone, for readers of other byte streams
// (the views). Thread-safe. REQUIRES: the store outlives the reader.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/store/read_progress.h"
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

  // How far behind the furthest sequential read prefetch stops loading chunks: concurrent
  // requests of one stream may arrive a little out of order.
  static constexpr uint64_t kStreamSlack = 2 << 20;
  // Partly returned chunks tracked at most; past it the oldest are forgotten (left to the LRU).
  static constexpr size_t kMaxPartial = 4096;

 private:
  const Store* const store_;
  const ContentId id_;
  ReadaheadWindow window_;
  const WorkerPool::Priority priority_;
  Mutex mu_;
  // Bytes returned so far of each chunk not yet returned whole, in first-read order.
  std::unordered_map<ChunkId, uint64_t> returned_ GUARDED_BY(mu_);
  std::deque<ChunkId> partial_order_ GUARDED_BY(mu_);
  uint64_t furthest_ GUARDED_BY(mu_) = 0;  // of the current sequential run
  // What the reader is past or has returned whole: the prefetch it queued skips those.
  const std::shared_ptr<ReadProgress> progress_ = std::make_shared<ReadProgress>();
};

}  // namespace ckptfs
