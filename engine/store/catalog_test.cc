#include "engine/store/catalog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

namespace ckptfs {
namespace {

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_catalog_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    catalog_ = std::move(*Catalog::Open(dir_));
  }
  void TearDown() override {
    catalog_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Content `id` made of chunks of the given lengths.
  void PutContent(ContentId id, std::vector<uint32_t> lengths) {
    auto txn = *catalog_->BeginWrite();
    uint64_t off = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      ChunkRef ref{off, ChunkId::Of(AsBytes(std::to_string(id * 1000 + i))), lengths[i]};
      ASSERT_TRUE(txn.PutChunkRef(id, ref).ok());
      off += lengths[i];
    }
    ASSERT_TRUE(txn.PutContent(id, ContentRow{off, lengths.size(), 0}).ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  std::filesystem::path dir_;
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(CatalogTest, ChunkAtFindsTheCoveringChunk) {
  PutContent(1, {10, 20, 30});
  PutContent(2, {5});
  PutContent(3, {100, 1});
  auto txn = *catalog_->BeginRead();
  struct Case {
    ContentId content;
    uint64_t offset;
    std::optional<uint64_t> start;
  };
  for (const Case& c : std::vector<Case>{{1, 0, 0},
                                         {1, 9, 0},
                                         {1, 10, 10},
                                         {1, 29, 10},
                                         {1, 30, 30},
                                         {1, 59, 30},
                                         {1, 60, std::nullopt},
                                         {2, 0, 0},
                                         {2, 4, 0},
                                         {2, 5, std::nullopt},
                                         {3, 100, 100},
                                         {3, 101, std::nullopt},
                                         {4, 0, std::nullopt},
                                         {0, 0, std::nullopt}}) {
    auto ref = txn.ChunkAt(c.content, c.offset);
    ASSERT_TRUE(ref.ok());
    ASSERT_EQ(ref->has_value(), c.start.has_value()) << c.content << "@" << c.offset;
    if (c.start) {
      EXPECT_EQ((*ref)->offset, *c.start) << c.content << "@" << c.offset;
    }
  }
}

TEST_F(CatalogTest, ForEachChunkRefStaysInsideItsContent) {
  PutContent(1, {10, 20});
  PutContent(2, {7, 7, 7});
  auto txn = *catalog_->BeginRead();
  std::vector<uint64_t> starts;
  ASSERT_TRUE(txn.ForEachChunkRef(2, 8,
                                  [&](const ChunkRef& r) {
                                    starts.push_back(r.offset);
                                    return true;
                                  })
                  .ok());
  EXPECT_EQ(starts, (std::vector<uint64_t>{7, 14}));
}

TEST_F(CatalogTest, DeleteContentRemovesItsRefsOnly) {
  PutContent(1, {10, 20});
  PutContent(2, {7, 7, 7});
  {
    auto txn = *catalog_->BeginWrite();
    ASSERT_TRUE(txn.DeleteContent(1).ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  auto txn = *catalog_->BeginRead();
  EXPECT_FALSE(txn.GetContent(1)->has_value());
  EXPECT_FALSE(txn.ChunkAt(1, 0)->has_value());
  EXPECT_TRUE(txn.ChunkAt(2, 20)->has_value());
}

TEST_F(CatalogTest, UncommittedWriteIsInvisibleAndCommittedOneSurvivesReopen) {
  ChunkRow row{3, 4096, 100, 200, Codec::kLz4, 42, 1};
  ChunkId id = ChunkId::Of(AsBytes("x"));
  {
    auto txn = *catalog_->BeginWrite();
    ASSERT_TRUE(txn.PutChunk(id, row).ok());
  }  // aborted
  EXPECT_FALSE(catalog_->BeginRead()->GetChunk(id)->has_value());
  {
    auto txn = *catalog_->BeginWrite();
    ASSERT_TRUE(txn.PutChunk(id, row).ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  catalog_.reset();
  catalog_ = std::move(*Catalog::Open(dir_));
  auto got = *catalog_->BeginRead()->GetChunk(id);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->pack_id, 3u);
  EXPECT_EQ(got->offset, 4096u);
  EXPECT_EQ(got->codec, Codec::kLz4);
  EXPECT_EQ(got->refcount, 1u);
}

}  // namespace
}  // namespace ckptfs
