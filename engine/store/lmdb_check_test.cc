#include "engine/store/lmdb_check.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/store/catalog.h"

namespace ckptfs {
namespace {

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Opens the catalog and reads every row of every table. Returns its status (a decoder's
// Corruption is fine; the point is that it returns).
Status ReadEverything(const std::filesystem::path& dir) {
  CKPTFS_ASSIGN_OR_RETURN(auto catalog, Catalog::Open(dir, 0));
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog->BeginRead());
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([](const ChunkId&, const ChunkRow&) { return true; }));
  CKPTFS_RETURN_IF_ERROR(txn.ForEachPack([](uint32_t, const PackRow&) { return true; }));
  std::vector<ContentId> contents;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachContent([&](ContentId id, const ContentRow&) {
    contents.push_back(id);
    return true;
  }));
  for (ContentId id : contents) {
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, 0, [](const ChunkRef&) { return true; }));
    CKPTFS_RETURN_IF_ERROR(txn.GetContent(id).status());
  }
  CKPTFS_RETURN_IF_ERROR(txn.ForEachName([](std::string_view, ContentId) { return true; }));
  for (Table t : {Table::kInodes, Table::kDirents, Table::kXattrs, Table::kContentMeta}) {
    CKPTFS_RETURN_IF_ERROR(
        txn.ForEach(t, "", "", [](std::string_view, std::string_view) { return true; }));
  }
  return Status::OK();
}

class LmdbCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_lmdb_check_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto catalog = std::move(*Catalog::Open(dir_, 0));
    // Enough rows for branch pages, values big enough for overflow pages, and deletions for
    // a free list.
    for (ContentId id = 1; id <= 400; ++id) {
      if (id % 10 != 1) continue;
      auto txn = *catalog->BeginWrite();
      for (ContentId id2 = id; id2 < id + 10; ++id2) {
      const ContentId id = id2;
      for (uint64_t i = 0; i < 4; ++i) {
        ChunkId chunk = ChunkId::Of(AsBytes(std::to_string(id * 10 + i)));
        ASSERT_TRUE(txn.PutChunkRef(id, ChunkRef{i * 100, chunk, 100}).ok());
        ASSERT_TRUE(txn.PutChunk(chunk, ChunkRow{1, id * 400 + i * 100, 100, 100}).ok());
      }
      ASSERT_TRUE(txn.PutContent(id, ContentRow{400, 4, 0}).ok());
      ASSERT_TRUE(txn.PutName("file" + std::to_string(id), id).ok());
      if (id % 50 == 0) {
        ASSERT_TRUE(txn.Put(Table::kContentMeta, std::to_string(id).append("L"),
                            std::string(9000, static_cast<char>(id)))
                        .ok());
      }
      if (id % 3 == 0) {
        ASSERT_TRUE(txn.DeleteName("file" + std::to_string(id - 1)).ok());
      }
      }
      ASSERT_TRUE(txn.Commit().ok());
    }
    catalog.reset();
    data_ = dir_ / "data.mdb";
    clean_ = ReadAll(data_);
    ASSERT_TRUE(CheckLmdbFile(data_).ok()) << CheckLmdbFile(data_).ToString();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_, data_;
  std::string clean_;
};

// Found by tests/fs/test_torch.py: a transaction that allocates pages past the file's end and
// frees them again before it commits (here: big values put and deleted) leaves its last page
// past the end of the file, because LMDB does not write such "loose" pages (they go to the
// free list). The check refused the healthy catalog ("last page N of a M-byte file"), and the
// store could not be mounted.
TEST_F(LmdbCheckTest, AFreedPagePastTheFilesEndIsHealthy) {
  {
    auto catalog = std::move(*Catalog::Open(dir_, 0));
    auto txn = *catalog->BeginWrite();
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(txn.Put(Table::kContentMeta, "big" + std::to_string(i),
                          std::string(9000, static_cast<char>(i)))
                      .ok());
    }
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(txn.Delete(Table::kContentMeta, "big" + std::to_string(i)).ok());
    }
    ASSERT_TRUE(txn.Commit().ok());
  }
  const std::string bytes = ReadAll(data_);
  uint64_t txn_ids[2], last_pages[2];
  for (int i = 0; i < 2; ++i) {  // the meta pages: 16-byte header, then the meta record
    std::memcpy(&last_pages[i], bytes.data() + i * 4096 + 16 + 24 + 2 * 48, 8);
    std::memcpy(&txn_ids[i], bytes.data() + i * 4096 + 16 + 24 + 2 * 48 + 8, 8);
  }
  const uint64_t last_page = last_pages[txn_ids[1] > txn_ids[0] ? 1 : 0];
  ASSERT_GE(last_page, bytes.size() / 4096) << "the case this test is about did not arise";
  EXPECT_TRUE(CheckLmdbFile(data_).ok()) << CheckLmdbFile(data_).ToString();
  EXPECT_TRUE(ReadEverything(dir_).ok());
  {  // and it goes on working: the free pages are reused
    auto catalog = Catalog::Open(dir_, 0);
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    auto txn = *(*catalog)->BeginWrite();
    ASSERT_TRUE(txn.Put(Table::kContentMeta, "after", std::string(9000, 'a')).ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  EXPECT_TRUE(CheckLmdbFile(data_).ok()) << CheckLmdbFile(data_).ToString();
  EXPECT_TRUE(ReadEverything(dir_).ok());
}

TEST_F(LmdbCheckTest, NoFileIsNotFound) {
  EXPECT_TRUE(CheckLmdbFile(dir_ / "nothing.mdb").IsNotFound());
}

// Found by tests/fs/test_flips.py (seed 6666): a flipped node pointer in a chunks-table page
// made `ckptfs verify` segfault inside mdb_cursor_get. Each flip of a page's header and first
// 16 node pointers, and of a fixed sample of the other bytes, is refused by the check or
// leaves a catalog that opens and reads without a signal (in a child process).
TEST_F(LmdbCheckTest, FlippedBytesAreRefusedOrReadSafely) {
  const size_t page = 4096;
  ASSERT_EQ(clean_.size() % page, 0u);
  std::vector<size_t> offsets;
  for (size_t p = 2 * page; p < clean_.size(); p += page) {
    uint64_t pgno;
    std::memcpy(&pgno, clean_.data() + p, 8);
    if (pgno != p / page) continue;  // not a page's head (unused, or inside an overflow run)
    uint16_t flags, lower;
    std::memcpy(&flags, clean_.data() + p + 10, 2);
    std::memcpy(&lower, clean_.data() + p + 12, 2);
    // Every branch page and every 6th other: the header (all but its 2 pad bytes) and the
    // first 16 node pointers.
    if (!(flags & 0x01) && pgno % 6 != 0) continue;
    for (size_t i = 0; i < std::min<size_t>(48, (flags & 0x04) ? 16 : lower); ++i) {
      if (i != 8 && i != 9) offsets.push_back(p + i);
    }
  }
  std::mt19937_64 rng(6666);
  for (int i = 0; i < 100; ++i) offsets.push_back(2 * page + rng() % (clean_.size() - 2 * page));
  size_t refused = 0, opened = 0;
  for (size_t at : offsets) {
    std::string bytes = clean_;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
    WriteAll(data_, bytes);
    Status check = CheckLmdbFile(data_);
    if (!check.ok()) {
      ASSERT_TRUE(check.IsCorruption()) << check.ToString();
      ++refused;
      // Refused before LMDB maps it, so opening the catalog fails the same way and writes
      // nothing.
      Status open = Catalog::Open(dir_, 0).status();
      EXPECT_TRUE(open.IsCorruption()) << "offset " << at << ": " << open.ToString();
      EXPECT_TRUE(ReadAll(data_) == bytes) << "offset " << at << ": the catalog was written";
      continue;
    }
    ++opened;
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(ReadEverything(dir_).ok() ? 0 : 1);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_FALSE(WIFSIGNALED(wstatus))
        << "offset " << at << ": reading the catalog died of signal " << WTERMSIG(wstatus);
  }
  WriteAll(data_, clean_);
  std::printf("%zu pages, %zu flips: %zu refused, %zu opened\n", clean_.size() / page,
              offsets.size(), refused, opened);
  EXPECT_GT(refused, offsets.size() / 4);
  EXPECT_GT(opened, 0u);
  EXPECT_TRUE(CheckLmdbFile(data_).ok());
}

// Found by tests/fs/test_flips.py: a flipped byte in a table's name made Catalog::Open create
// an empty table of that name and commit it, so that once the flip was undone every content
// read "chunks cover 0 bytes". A name that is no table of ours is Corruption, and opening an
// existing catalog writes nothing.
TEST_F(LmdbCheckTest, AFlippedTableNameIsRefusedAndNothingIsWritten) {
  size_t refused = 0;
  for (size_t at = clean_.find("content_chunks"); at != std::string::npos;
       at = clean_.find("content_chunks", at + 1)) {
    std::string bytes = clean_;
    bytes[at + 9] = static_cast<char>(bytes[at + 9] ^ 0x10);  // chunks -> chunKs
    WriteAll(data_, bytes);
    {
      auto catalog = Catalog::Open(dir_, 0);
      if (!catalog.ok()) {
        EXPECT_TRUE(catalog.status().IsCorruption()) << catalog.status().ToString();
        ++refused;
      }
    }
    EXPECT_TRUE(ReadAll(data_) == bytes) << "offset " << at << ": opening wrote the catalog";
  }
  EXPECT_GE(refused, 1u);  // the live main-table page (older copies sit in free pages)
  WriteAll(data_, clean_);
  ASSERT_TRUE(Catalog::Open(dir_, 0).ok());
  EXPECT_TRUE(ReadAll(data_) == clean_) << "opening an intact catalog wrote it";
}

}  // namespace
}  // namespace ckptfs
