// Criterion 2: identical chunks are stored once, so a second copy of a content costs almost
// nothing and a small change in a large content costs only the chunks around it.
#include <set>

#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

constexpr size_t kMiB = 1u << 20;
constexpr size_t kContentBytes = 100 * kMiB;

std::set<ChunkId> ChunksOf(Store& store, ContentId id) {
  std::set<ChunkId> ids;
  auto txn = store.catalog().BeginRead();
  EXPECT_TRUE(txn.ok()) << txn.status().ToString();
  if (!txn.ok()) return ids;
  EXPECT_OK(txn->ForEachChunkRef(id, 0, [&](const ChunkRef& ref) {
    ids.insert(ref.id);
    return true;
  }));
  return ids;
}

TEST(DedupTest, SameContentTwiceAddsAtMostOnePercent) {
  TempDir dir("dedup-twice");
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store);
  const std::vector<std::byte> data = PatternBytes(42, 0, kContentBytes);

  ASSERT_OK_AND_ASSIGN(ContentId first, WriteContent(*store, data, /*piece_seed=*/1));
  ASSERT_OK_AND_ASSIGN(StoreStats once, store->Stats());
  EXPECT_GE(once.pack_bytes, kContentBytes);  // random bytes do not compress
  // Other piece sizes: content-defined boundaries do not depend on how the bytes arrive.
  ASSERT_OK_AND_ASSIGN(ContentId second, WriteContent(*store, data, /*piece_seed=*/2));
  ASSERT_OK_AND_ASSIGN(StoreStats twice, store->Stats());

  EXPECT_NE(first, second);
  EXPECT_EQ(twice.contents, 2u);
  EXPECT_EQ(twice.logical_bytes, 2 * kContentBytes);
  EXPECT_EQ(twice.chunks, once.chunks);
  EXPECT_LE(twice.pack_bytes - once.pack_bytes, once.pack_bytes / 100)
      << "pack bytes " << once.pack_bytes << " -> " << twice.pack_bytes;
  EXPECT_EQ(ChunksOf(*store, first), ChunksOf(*store, second));
  EXPECT_TRUE(ContentEquals(*store, second, data));
}

TEST(DedupTest, OneMiBChangedInTheMiddleAddsOnlyAFewChunks) {
  TempDir dir("dedup-change");
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store);
  const std::vector<std::byte> base = PatternBytes(43, 0, kContentBytes);
  std::vector<std::byte> changed = base;
  FillPattern(99, 0, MutableBytes(changed).subspan(kContentBytes / 2, kMiB));

  ASSERT_OK_AND_ASSIGN(ContentId first, WriteContent(*store, base));
  ASSERT_OK_AND_ASSIGN(StoreStats before, store->Stats());
  ASSERT_OK_AND_ASSIGN(ContentId second, WriteContent(*store, changed));
  ASSERT_OK_AND_ASSIGN(StoreStats after, store->Stats());

  const FastCdc::Params p = store->options().chunking;
  const uint64_t added_bytes = after.pack_bytes - before.pack_bytes;
  const uint64_t added_chunks = after.chunks - before.chunks;
  std::set<ChunkId> old_chunks = ChunksOf(*store, first);
  std::set<ChunkId> new_chunks = ChunksOf(*store, second);
  size_t unshared = 0;
  for (const ChunkId& id : new_chunks) unshared += old_chunks.count(id) == 0;
  RecordProperty("added_chunks", static_cast<int>(added_chunks));
  RecordProperty("added_bytes", std::to_string(added_bytes));

  EXPECT_GE(added_chunks, 1u);
  // The chunks that overlap the changed MiB, plus one or two while the cuts fall back into
  // step with the original ones.
  EXPECT_LE(added_chunks, kMiB / p.min_size + 4) << added_bytes << " bytes added";
  EXPECT_EQ(unshared, added_chunks);
  EXPECT_GE(added_bytes, kMiB);
  EXPECT_LE(added_bytes, kMiB + 3 * p.max_size) << added_chunks << " chunks added";
  EXPECT_TRUE(ContentEquals(*store, first, base));
  EXPECT_TRUE(ContentEquals(*store, second, changed));
}

}  // namespace
}  // namespace ckptfs::testing
