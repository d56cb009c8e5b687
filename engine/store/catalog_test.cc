#include "engine/store/catalog.h"

#include <gtest/gtest.h>
#include <lmdb.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

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

// Flips (xor 0x10) every copy of `needle` in the catalog file at its byte `at`; returns how many.
int FlipInFile(const std::filesystem::path& file, std::string_view needle, size_t at) {
  std::string data;
  {
    std::ifstream in(file, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  int flipped = 0;
  for (size_t pos = data.find(needle); pos != std::string::npos; pos = data.find(needle, pos + 1)) {
    data[pos + at] = static_cast<char>(data[pos + at] ^ 0x10);
    ++flipped;
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << data;
  return flipped;
}

// Seed 31 of the flip sweep: a flipped byte in a file name (a dirents key) listed the file
// under the changed name. Raw rows carry a checksum over key and value now.
TEST_F(CatalogTest, FlippedRawKeyOrValueIsCorruption) {
  const std::string key = std::string(8, '\1') + "model.pt";
  {
    auto txn = *catalog_->BeginWrite();
    ASSERT_TRUE(txn.Put(Table::kDirents, key, "value-of-the-entry").ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  {
    auto txn = *catalog_->BeginRead();
    auto got = txn.Get(Table::kDirents, key);
    ASSERT_TRUE(got.ok() && *got);
    EXPECT_EQ(**got, "value-of-the-entry");  // the trailer is invisible
    int problems = 0;
    ASSERT_TRUE(txn.CheckRows([&](const Status&) { ++problems; }).ok());
    EXPECT_EQ(problems, 0);
  }
  catalog_.reset();
  ASSERT_GT(FlipInFile(dir_ / "data.mdb", "model.pt", 6), 0);  // "model.pt" -> "model.`t"
  catalog_ = std::move(*Catalog::Open(dir_));
  auto txn = *catalog_->BeginRead();
  auto got = txn.Get(Table::kDirents, key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);  // the old name is gone ...
  Status listed = txn.ForEach(Table::kDirents, std::string(8, '\1'), "",
                              [](auto, auto) { return true; });
  EXPECT_TRUE(listed.IsCorruption()) << listed.ToString();  // ... and the new one is no name
  EXPECT_NE(listed.message().find("dirents row 72340172838076673/model.`t"), std::string::npos)
      << listed.message();
  std::vector<std::string> problems;
  ASSERT_TRUE(txn.CheckRows([&](const Status& s) { problems.push_back(s.message()); }).ok());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("checksum mismatch"), std::string::npos) << problems[0];
}

TEST_F(CatalogTest, FlippedRawValueIsCorruption) {
  {
    auto txn = *catalog_->BeginWrite();
    ASSERT_TRUE(txn.Put(Table::kInodes, "inode-key", "attributes-of-the-inode").ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  catalog_.reset();
  ASSERT_GT(FlipInFile(dir_ / "data.mdb", "attributes-of-the-inode", 3), 0);
  catalog_ = std::move(*Catalog::Open(dir_));
  auto txn = *catalog_->BeginRead();
  auto got = txn.Get(Table::kInodes, "inode-key");
  EXPECT_TRUE(got.status().IsCorruption()) << got.status().ToString();
}

// A catalog from before row checksums (no meta "row_checksums") still opens and reads its
// rows as they are, and keeps writing them so.
TEST_F(CatalogTest, CatalogWithoutRowChecksumsStillOpens) {
  catalog_.reset();
  {
    MDB_env* env = nullptr;
    ASSERT_EQ(mdb_env_create(&env), 0);
    ASSERT_EQ(mdb_env_set_maxdbs(env, 32), 0);
    ASSERT_EQ(mdb_env_open(env, dir_.c_str(), MDB_NOTLS, 0600), 0);
    MDB_txn* txn = nullptr;
    MDB_dbi meta, dirents;
    ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
    ASSERT_EQ(mdb_dbi_open(txn, "meta", 0, &meta), 0);
    ASSERT_EQ(mdb_dbi_open(txn, "dirents", 0, &dirents), 0);
    std::string k = "row_checksums", rk = "old-key", rv = "old-value";
    MDB_val key{k.size(), k.data()};
    ASSERT_EQ(mdb_del(txn, meta, &key, nullptr), 0);
    MDB_val rkey{rk.size(), rk.data()}, rval{rv.size(), rv.data()};
    ASSERT_EQ(mdb_put(txn, dirents, &rkey, &rval, 0), 0);  // as an old ckptfs wrote it
    ASSERT_EQ(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
  }
  auto reopened = Catalog::Open(dir_);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  catalog_ = std::move(*reopened);
  {
    auto txn = *catalog_->BeginWrite();
    ASSERT_TRUE(txn.Put(Table::kDirents, "new-key", "new-value").ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  auto txn = *catalog_->BeginRead();
  EXPECT_EQ(**txn.Get(Table::kDirents, "old-key"), "old-value");
  EXPECT_EQ(**txn.Get(Table::kDirents, "new-key"), "new-value");
  int problems = 0;
  ASSERT_TRUE(txn.CheckRows([&](const Status&) { ++problems; }).ok());
  EXPECT_EQ(problems, 0);
}

TEST_F(CatalogTest, MapIsTheFilesystemsSize) {
  struct statvfs fs;
  ASSERT_EQ(::statvfs(dir_.c_str(), &fs), 0);
  const uint64_t fs_bytes = uint64_t{fs.f_blocks} * fs.f_frsize;
  const uint64_t map = Catalog::MapBytesFor(dir_);
  EXPECT_EQ(catalog_->map_bytes(), map);
  EXPECT_EQ(map % (uint64_t{1} << 30), 0u);
  EXPECT_GE(map, std::min(fs_bytes, uint64_t{1} << 40));
  EXPECT_LT(map, std::max(fs_bytes, uint64_t{1} << 30) + (uint64_t{1} << 30));
  EXPECT_LE(map, uint64_t{1} << 40);
}

// A catalog opened with a 1 MiB map takes 8 MiB of rows: the change that finds the map full
// grows it to the filesystem's size and runs again, but only once no transaction is open.
TEST_F(CatalogTest, GrowsPastTheFirstMapSize) {
  catalog_.reset();
  std::filesystem::remove_all(dir_);
  constexpr uint64_t kFirstMap = uint64_t{1} << 20;
  catalog_ = std::move(*Catalog::Open(dir_, 0, kFirstMap));
  ASSERT_EQ(catalog_->map_bytes(), kFirstMap);
  auto value = [](int i) { return std::string(64 << 10, static_cast<char>('a' + i % 26)); };
  auto key = [](int i) { return "row" + std::to_string(i); };
  auto put = [&](int i) {
    return catalog_->Update(Catalog::SpaceUse::kNormal, [&](Catalog::WriteTxn& txn) {
      return txn.Put(Table::kContentMeta, key(i), value(i));
    });
  };
  int i = 0;
  {
    // While a reader is open the map cannot be remapped: the change that fills it fails.
    auto reader = *catalog_->BeginRead();
    Status st;
    for (; i < 128 && (st = put(i)).ok(); ++i) {
    }
    ASSERT_LT(i, 128) << "1 MiB of map took 8 MiB of rows";
    EXPECT_TRUE(st.IsNoSpace()) << st.ToString();
    EXPECT_EQ(catalog_->map_bytes(), kFirstMap);
    EXPECT_FALSE(reader.Get(Table::kContentMeta, key(i))->has_value());
  }
  for (; i < 128; ++i) ASSERT_TRUE(put(i).ok()) << "row " << i;
  EXPECT_EQ(catalog_->map_bytes(), Catalog::MapBytesFor(dir_));
  catalog_.reset();
  catalog_ = std::move(*Catalog::Open(dir_));
  auto txn = *catalog_->BeginRead();
  for (int j = 0; j < 128; ++j) {
    auto got = *txn.Get(Table::kContentMeta, key(j));
    ASSERT_TRUE(got.has_value()) << "row " << j;
    EXPECT_EQ(*got, value(j)) << "row " << j;
  }
}

}  // namespace
}  // namespace ckptfs
