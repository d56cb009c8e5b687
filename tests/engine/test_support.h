// tests/engine/test_support.h
//
// What the engine acceptance tests share: a temporary store directory that removes itself,
// reproducible content (any range of a seeded byte stream can be regenerated without keeping
// it), writing a content through ContentWriter in odd-sized pieces, reading it back, and
// running the ckptfs binary as a subprocess.
//
//   TempDir dir("gc");
//   auto store = OpenStore(dir.path());
//   std::vector<std::byte> data = PatternBytes(/*seed=*/7, 0, 5 << 20);
//   ContentId id = *WriteContent(*store, data);
//   EXPECT_TRUE(ContentEquals(*store, id, data));
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/store/content_writer.h"
#include "engine/store/store.h"

namespace ckptfs::testing {

// A fresh directory under the system temp directory; removed (recursively) on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Options for tests: a small decoded-chunk cache, so that reads go to the pack files.
StoreOptions TestOptions();

// Opens (creating) the store in dir. Returns null, with a test failure that says why, when it
// cannot: auto store = OpenStore(dir); ASSERT_TRUE(store);
std::unique_ptr<Store> OpenStore(const std::filesystem::path& dir,
                                 const StoreOptions& options = TestOptions());

// Bytes [offset, offset + out.size()) of the pseudo-random stream named by seed.
void FillPattern(uint64_t seed, uint64_t offset, MutableBytes out);
std::vector<std::byte> PatternBytes(uint64_t seed, uint64_t offset, size_t size);

// Streams data into a new content, in pieces of pseudo-random odd sizes (1 byte to ~3 MiB)
// chosen by piece_seed, and commits it (running hook inside the commit transaction).
Result<ContentId> WriteContent(Store& store, Bytes data, uint64_t piece_seed = 1,
                               const ContentWriter::CommitHook& hook = nullptr);
inline Result<ContentId> WriteContent(Store& store, const std::vector<std::byte>& data,
                                      uint64_t piece_seed = 1,
                                      const ContentWriter::CommitHook& hook = nullptr) {
  return WriteContent(store, Bytes(data), piece_seed, hook);
}

// Reads a whole content (in reads of a size that crosses chunk boundaries).
Result<std::vector<std::byte>> ReadContent(const Store& store, ContentId id);

// Success when `actual` equals `expected`; otherwise names the first differing offset (and
// never prints megabytes of bytes).
::testing::AssertionResult BytesEqual(Bytes expected, Bytes actual);
// Success when content id has exactly expected's size and bytes.
::testing::AssertionResult ContentEquals(const Store& store, ContentId id, Bytes expected);
// Success when `reads` reads at pseudo-random offsets and lengths (including past the end)
// return exactly the matching bytes of expected.
::testing::AssertionResult RandomReadsMatch(const Store& store, ContentId id, Bytes expected,
                                            uint64_t seed, int reads = 200);

// Success when Verify() runs and reports no problem (else lists them).
::testing::AssertionResult VerifyClean(const Store& store);

// The pack file that holds the record of chunk `index` (in offset order) of content id.
struct RecordPlace {
  ChunkRef ref;  // where the chunk lies in the content
  ChunkRow row;  // where its record lies in the packs
};
Result<RecordPlace> PlaceOfChunk(Store& store, ContentId id, size_t index);

// A finished subprocess: exit code (or 128 + signal) and what it wrote.
struct ProcessResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs argv[0] with the given arguments; stdin comes from stdin_path (or /dev/null), stdout
// goes to stdout_path when given (else it is captured into `out`).
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::filesystem::path& stdin_path = "/dev/null",
                         const std::filesystem::path& stdout_path = {});

std::string ReadFileToString(const std::filesystem::path& path);
std::vector<std::byte> ReadFileBytes(const std::filesystem::path& path);
void WriteFileBytes(const std::filesystem::path& path, Bytes data);

// Fails the calling test (fatally) with the status's message unless it is OK.
#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::ckptfs::Status _s = (expr);                     \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                     \
  do {                                                      \
    const ::ckptfs::Status _s = (expr);                     \
    EXPECT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)
// Declares lhs from a Result, or fails the calling test (fatally) with its status.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(CKPTFS_CONCAT(_result_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)                    \
  auto tmp = (expr);                                                 \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.status().ToString(); \
  lhs = std::move(*tmp)

}  // namespace ckptfs::testing
