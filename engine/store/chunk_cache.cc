#include "engine/store/chunk_cache.h"

namespace ckptfs {

ChunkCache::ChunkCache(size_t capacity_bytes) : capacity_(capacity_bytes), shards_(kShards) {}

bool ChunkCache::Contains(const ChunkId& id) const {
  const Shard& shard = ShardFor(id);
  std::lock_guard lock(shard.mu);
  return shard.index.count(id) != 0;
}

std::shared_ptr<const Buffer> ChunkCache::Lookup(const ChunkId& id, bool streamed) {
  Shard& s = ShardFor(id);
  std::lock_guard lock(s.mu);
  auto it = s.index.find(id);
  if (it == s.index.end()) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  hits_.fetch_add(1, std::memory_order_relaxed);
  s.lru.splice(s.lru.begin(), s.lru, it->second);
  if (!streamed) it->second->streamed = false;
  return it->second->chunk;
}

void ChunkCache::Insert(const ChunkId& id, std::shared_ptr<const Buffer> chunk, bool streamed) {
  const size_t shard_capacity = capacity_ / kShards;
  if (chunk->size() > shard_capacity) return;
  Shard& s = ShardFor(id);
  std::lock_guard lock(s.mu);
  auto it = s.index.find(id);
  if (it != s.index.end()) {
    if (!streamed) it->second->streamed = false;
    return;
  }
  s.bytes += chunk->size();
  s.lru.push_front(Shard::Entry{id, std::move(chunk), streamed});
  s.index[id] = s.lru.begin();
  while (s.bytes > shard_capacity) {
    auto& victim = s.lru.back();
    s.bytes -= victim.chunk->size();
    s.index.erase(victim.id);
    s.lru.pop_back();
  }
}

void ChunkCache::DropStreamed(const ChunkId& id) {
  Shard& s = ShardFor(id);
  std::lock_guard lock(s.mu);
  auto it = s.index.find(id);
  if (it == s.index.end() || !it->second->streamed) return;
  s.bytes -= it->second->chunk->size();
  s.lru.erase(it->second);
  s.index.erase(it);
}

size_t ChunkCache::size_bytes() const {
  size_t total = 0;
  for (const auto& s : shards_) {
    std::lock_guard lock(s.mu);
    total += s.bytes;
  }
  return total;
}

}  // namespace ckptfs
