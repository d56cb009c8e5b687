// engine/store/chunk_cache.h
//
// A bounded cache of decoded chunks, LRU by bytes, sharded to keep lock hold times short.
// Entries are shared: a reader keeps its chunk alive while it copies from it, even if the
// cache evicts it meanwhile, so memory is bounded by capacity + chunks being copied out.
//
//   if (auto hit = cache.Lookup(id)) return Copy(*hit);
//   cache.Insert(id, std::make_shared<const Buffer>(std::move(decoded)));
//
// Scan resistance: a sequential reader inserts its chunks as *streamed* entries and drops them
// (DropStreamed) once it has read past them, so a file read once from start to end never
// evicts the cache nor fills it (the kernel's page cache keeps what it read anyway). Any
// other lookup of a streamed entry makes it an ordinary one, which DropStreamed leaves alone.
//
// Thread-safe. A capacity of 0 disables caching.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/hash/chunk_id.h"
#include "engine/util/buffer.h"

namespace ckptfs {

class ChunkCache {
 public:
  explicit ChunkCache(size_t capacity_bytes);

  // streamed: the caller is a sequential reader, whose hit does not make the entry ordinary.
  std::shared_ptr<const Buffer> Lookup(const ChunkId& id, bool streamed = false);
  // Whether the chunk is cached now; counts as neither hit nor miss and changes no order.
  bool Contains(const ChunkId& id) const;
  void Insert(const ChunkId& id, std::shared_ptr<const Buffer> chunk, bool streamed = false);
  // Removes the entry if it is still a streamed one.
  void DropStreamed(const ChunkId& id);
  size_t size_bytes() const;
  // Lookups since construction that found their chunk / did not (every caller's: readers,
  // the prefetcher's "is it there yet" probes, a writer's delta base).
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t misses() const { return misses_.load(std::memory_order_relaxed); }

 private:
  static constexpr size_t kShards = 16;
  struct Shard {
    struct Entry {
      ChunkId id;
      std::shared_ptr<const Buffer> chunk;
      bool streamed;
    };
    mutable std::mutex mu;
    std::list<Entry> lru;  // front: most recent
    std::unordered_map<ChunkId, std::list<Entry>::iterator> index;
    size_t bytes = 0;
  };
  Shard& ShardFor(const ChunkId& id) { return shards_[id.bytes[31] % kShards]; }
  const Shard& ShardFor(const ChunkId& id) const { return shards_[id.bytes[31] % kShards]; }

  const size_t capacity_;
  std::vector<Shard> shards_;
  std::atomic<uint64_t> hits_{0}, misses_{0};
};

}  // namespace ckptfs
