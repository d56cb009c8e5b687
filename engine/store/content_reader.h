// engine/store/content_reader.h
//
// Reads one content for one reader (a file handle), prefetching ahead when access is
// sequential: after a read that continues the previous one, the next `readahead_bytes` are
// loaded into the store's chunk cache on the worker pool, so the following reads hit memory.
//
//   ContentReader reader(store, content, 8 << 20);
//   CKPTFS_ASSIGN_OR_RETURN(size_t n, reader.Read(offset, out));
//
// Prefetched chunks live in the bounded cache like any other; nothing else is held.
// Thread-safe. REQUIRES: the store outlives the reader.
#pragma once

#include <cstdint>
#include <mutex>

#include "engine/store/store.h"

namespace ckptfs {

class ContentReader {
 public:
  ContentReader(const Store* store, ContentId id, uint64_t readahead_bytes)
      : store_(store), id_(id), readahead_(readahead_bytes) {}

  Result<size_t> Read(uint64_t offset, MutableBytes out);
  ContentId id() const { return id_; }

 private:
  const Store* const store_;
  const ContentId id_;
  const uint64_t readahead_;
  std::mutex mu_;
  uint64_t next_ = 0;              // GUARDED_BY(mu_): where a sequential read would start
  uint64_t prefetched_until_ = 0;  // GUARDED_BY(mu_)
};

}  // namespace ckptfs
