// engine/store/read_progress.h
//
// How far one sequential reader has got, shared with the prefetch it queued (Store::Prefetch),
// so that a worker reaching a queued chunk load the reader no longer needs skips it. Without
// it, a worker that fell behind the reader (a busy machine) decoded each chunk a second time
// after the reader had loaded, returned and dropped it, and the copy stayed in the cache.
//
//   auto progress = std::make_shared<ReadProgress>();
//   store->Prefetch(id, from, len, priority, kStream, progress);   // the workers ask Wants()
//   progress->Finished(chunk, chunk_end);   // the reader returned every byte of the chunk
//   progress->Passed(offset);               // ... and is past every chunk ending by offset
//   progress->Close();                      // the reader is gone: nothing queued is wanted
//
// A chunk is wanted unless it ends at or before the passed offset, or the reader finished it
// and has not jumped back since (Passed to a lower offset forgets what it finished: a reader
// that starts over wants its chunks again). Finished chunks beyond the passed offset are held
// at most kMaxFinished. Thread-safe.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/hash/chunk_id.h"
#include "engine/util/mutex.h"

namespace ckptfs {

class ReadProgress {
 public:
  static constexpr size_t kMaxFinished = 256;

  void Passed(uint64_t offset);
  void Finished(const ChunkId& id, uint64_t end);
  void Close() { Passed(UINT64_MAX); }
  // Whether a load of chunk `id`, which ends at content offset `end`, is still of use.
  bool Wants(const ChunkId& id, uint64_t end) const;

 private:
  mutable Mutex mu_;
  uint64_t passed_ GUARDED_BY(mu_) = 0;
  std::vector<std::pair<ChunkId, uint64_t>> finished_ GUARDED_BY(mu_);  // with their ends
};

}  // namespace ckptfs
