// Unit tests of the decoded-chunk cache (chunk_cache.h): LRU by bytes, and streamed entries.
#include "engine/store/chunk_cache.h"

#include <gtest/gtest.h>

namespace ckptfs {
namespace {

ChunkId IdOf(int i) {
  Buffer b(sizeof(i));
  std::memcpy(b.data(), &i, sizeof(i));
  return ChunkId::Of(b.bytes());
}

std::shared_ptr<const Buffer> Chunk(size_t n) { return std::make_shared<const Buffer>(n); }

TEST(ChunkCacheTest, StreamedEntriesAreDroppedOrdinaryOnesStay) {
  ChunkCache cache(16 << 20);
  cache.Insert(IdOf(1), Chunk(1000));                     // ordinary
  cache.Insert(IdOf(2), Chunk(1000), /*streamed=*/true);  // a sequential reader's
  cache.Insert(IdOf(3), Chunk(1000), /*streamed=*/true);
  EXPECT_EQ(cache.size_bytes(), 3000u);
  // The streaming reader's own hit leaves 2 streamed; anyone else's makes 3 ordinary.
  EXPECT_NE(cache.Lookup(IdOf(2), /*streamed=*/true), nullptr);
  EXPECT_NE(cache.Lookup(IdOf(3)), nullptr);
  cache.DropStreamed(IdOf(1));
  cache.DropStreamed(IdOf(2));
  cache.DropStreamed(IdOf(3));
  EXPECT_NE(cache.Lookup(IdOf(1)), nullptr);
  EXPECT_EQ(cache.Lookup(IdOf(2)), nullptr);
  EXPECT_NE(cache.Lookup(IdOf(3)), nullptr);
  EXPECT_EQ(cache.size_bytes(), 2000u);
  // An ordinary insert of a streamed entry makes it ordinary too.
  cache.Insert(IdOf(4), Chunk(10), true);
  cache.Insert(IdOf(4), Chunk(10));
  cache.DropStreamed(IdOf(4));
  EXPECT_NE(cache.Lookup(IdOf(4)), nullptr);
  // Lookups above: 5 found their chunk, 1 (of the dropped streamed entry) did not.
  EXPECT_EQ(cache.hits(), 5u);
  EXPECT_EQ(cache.misses(), 1u);
}

TEST(ChunkCacheTest, EvictsLeastRecentlyUsedWithinItsCapacity) {
  ChunkCache cache(16 * 4096);  // 4096 bytes a shard
  for (int i = 0; i < 2000; ++i) cache.Insert(IdOf(i), Chunk(1000));
  EXPECT_LE(cache.size_bytes(), 16u * 4096);
  EXPECT_GT(cache.size_bytes(), 0u);
  EXPECT_NE(cache.Lookup(IdOf(1999)), nullptr);  // the newest of its shard stays
  ChunkCache off(0);
  off.Insert(IdOf(1), Chunk(10));
  EXPECT_EQ(off.Lookup(IdOf(1)), nullptr);
}

}  // namespace
}  // namespace ckptfs
