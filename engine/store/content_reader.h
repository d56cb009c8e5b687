// engine/store/content_reader.h
//
// Reads one content for one reader (a file handle), prefetching ahead when access is
// sequential: after a read that continues the previous one, the next `readahead_bytes` are
// loaded into the store's chunk cache on the worker pool, so the following reads hit memory.
//
//   ContentReader reader(store, content, 8 << 20);
//   CKPTFS_ASSIGN_OR_RETURN(size_t n, reader.Read(offset, out));
//
// Prefetched chunks live in the bounded cache like any other; nothing else is held. With
// WorkerPool::Priority::kLow the prefetch waits behind writes and every other prefetch (the
// FUSE layer gives optimizer-state files that priority, so parameters load first on restore).
// ReadaheadWindow is the sequential-access detector alone, for readers of other byte streams
// (the views). Thread-safe. REQUIRES: the store outlives the reader.
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>

#include "engine/store/store.h"

namespace ckptfs {

class ReadaheadWindow {
 public:
  explicit ReadaheadWindow(uint64_t readahead_bytes) : readahead_(readahead_bytes) {}
  // Records a read of n bytes at offset; returns the range {from, length} to prefetch now
  // (length 0: nothing), which is never handed out twice.
  std::pair<uint64_t, uint64_t> Advance(uint64_t offset, uint64_t n);

 private:
  const uint64_t readahead_;
  std::mutex mu_;
  uint64_t next_ = 0;              // GUARDED_BY(mu_): where a sequential read would start
  uint64_t prefetched_until_ = 0;  // GUARDED_BY(mu_)
};

class ContentReader {
 public:
  ContentReader(const Store* store, ContentId id, uint64_t readahead_bytes,
                WorkerPool::Priority priority = WorkerPool::Priority::kNormal)
      : store_(store), id_(id), window_(readahead_bytes), priority_(priority) {}

  Result<size_t> Read(uint64_t offset, MutableBytes out);
  ContentId id() const { return id_; }

 private:
  const Store* const store_;
  const ContentId id_;
  ReadaheadWindow window_;
  const WorkerPool::Priority priority_;
};

}  // namespace ckptfs
