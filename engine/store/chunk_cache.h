// engine/store/chunk_cache.h
//
// A bounded cache of decoded chunks, LRU by bytes, sharded to keep lock hold times short.
// Entries are shared: a reader keeps its chunk alive while it copies from it, even if the
// cache evicts it meanwhile, so memory is bounded by capacity + chunks being copied out.
//
//   if (auto hit = cache.Lookup(id)) return Copy(*hit);
//   cache.Insert(id, std::make_shared<const Buffer>(std::move(decoded)));
//
// Thread-safe. A capacity of 0 disables caching.
#pragma once

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

  std::shared_ptr<const Buffer> Lookup(const ChunkId& id);
  void Insert(const ChunkId& id, std::shared_ptr<const Buffer> chunk);
  size_t size_bytes() const;

 private:
  static constexpr size_t kShards = 16;
  struct Shard {
    using Entry = std::pair<ChunkId, std::shared_ptr<const Buffer>>;
    mutable std::mutex mu;
    std::list<Entry> lru;  // front: most recent
    std::unordered_map<ChunkId, std::list<Entry>::iterator> index;
    size_t bytes = 0;
  };
  Shard& ShardFor(const ChunkId& id) { return shards_[id.bytes[31] % kShards]; }

  const size_t capacity_;
  std::vector<Shard> shards_;
};

}  // namespace ckptfs
