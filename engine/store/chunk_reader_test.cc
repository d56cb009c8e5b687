// Unit tests of the store's read side (chunk_reader.h), without FUSE: chunks written through a
// Store are read back by a ChunkReader of their own over the same packs and catalog, with its
// own cache, so every test sees exactly the pack reads it causes.
#include "engine/store/chunk_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "engine/store/content_writer.h"
#include "engine/store/store.h"
#include "engine/util/test_buffers.h"

namespace ckptfs {
namespace {

class ChunkReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_chunk_reader_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto s = Store::Open(dir_, StoreOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  ContentId Write(Bytes data) {
    auto w = store_->NewWriter();
    EXPECT_TRUE(w->Append(data).ok());
    auto id = w->Finish();
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    store_->WaitReencoded();  // its records as the store keeps them (compressed behind)
    return *id;
  }
  std::vector<std::pair<ChunkRef, ChunkRow>> Chunks(ContentId content) {
    std::vector<std::pair<ChunkRef, ChunkRow>> out;
    auto txn = store_->catalog().BeginRead();
    EXPECT_TRUE(txn.ok());
    EXPECT_TRUE(txn->ForEachChunkRef(content, 0,
                                     [&](const ChunkRef& ref) {
                                       auto row = txn->GetChunk(ref.id);
                                       EXPECT_TRUE(row.ok() && row->has_value());
                                       out.emplace_back(ref, **row);
                                       return true;
                                     })
                    .ok());
    return out;
  }
  std::unique_ptr<ChunkReader> NewReader(
      ChunkCache* cache,
      ChunkReader::DirectReads direct = ChunkReader::DirectReads::kWhereUncached) {
    return std::make_unique<ChunkReader>(dir_ / "packs", &store_->catalog(), cache, nullptr,
                                         direct);
  }
  // Flips one byte of a pack file.
  void Flip(uint32_t pack_id, uint64_t offset) {
    auto fd = OpenFile(dir_ / "packs" / PackFileName(pack_id), O_RDWR);
    ASSERT_TRUE(fd.ok());
    std::byte b;
    ASSERT_EQ(::pread(fd->get(), &b, 1, static_cast<off_t>(offset)), 1);
    b ^= std::byte{0x40};
    ASSERT_EQ(::pwrite(fd->get(), &b, 1, static_cast<off_t>(offset)), 1);
  }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(ChunkReaderTest, RawAndCompressedChunksReadBackAsWritten) {
  Buffer random = RandomBuffer(3 << 20, 1);  // incompressible: stored raw
  Buffer text(2 << 20);                      // compressible: stored lz4
  for (size_t i = 0; i < text.size(); ++i) text.data()[i] = std::byte("ckptfs "[i % 7]);
  for (const Buffer* data : {&random, &text}) {
    const ContentId content = Write(data->bytes());
    ChunkCache cache(64 << 20);
    auto reader = NewReader(&cache);
    bool saw_codec[3] = {};
    for (const auto& [ref, row] : Chunks(content)) {
      saw_codec[static_cast<size_t>(row.codec)] = true;
      auto decoded = reader->Decode(ref.id, row);
      ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
      ASSERT_EQ(decoded->size(), ref.length);
      EXPECT_EQ(std::memcmp(decoded->data(), data->data() + ref.offset, ref.length), 0);
      auto loaded = reader->Load(ref.id, row);
      ASSERT_TRUE(loaded.ok());
      EXPECT_EQ(ChunkId::Of((*loaded)->bytes()), ref.id);
    }
    EXPECT_TRUE(data == &random ? saw_codec[0] : saw_codec[1]);
  }
}

// Pages of [offset, offset + length) of a file that are in the page cache.
size_t ResidentPages(int fd, uint64_t offset, uint64_t length) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t from = offset / page * page;
  const uint64_t len = offset + length - from;
  void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(from));
  if (map == MAP_FAILED) return 0;
  std::vector<unsigned char> vec((len + page - 1) / page);
  size_t n = 0;
  if (::mincore(map, len, vec.data()) == 0) {
    for (unsigned char v : vec) n += v & 1;
  }
  ::munmap(map, len);
  return n;
}

// WillNeed starts reading the records' bytes into the page cache (what a restore's prefetch
// asks for before its loads), without reading anything itself. 24 MiB of adjacent records: the
// kernel reads at most max(read_ahead_kb, max_sectors_kb) of the device per posix_fadvise call
// (8 MiB on this VM's disk, 128 KiB on many) and drops the rest of the range, so one call for
// the whole run left two thirds of it unread.
TEST_F(ChunkReaderTest, WillNeedReadsTheRecordsIntoThePageCache) {
  Buffer data = RandomBuffer(24 << 20, 7);
  const ContentId content = Write(data.bytes());
  auto chunks = Chunks(content);
  ASSERT_GT(chunks.size(), 2u);
  const uint32_t pack = chunks.front().second.pack_id;
  uint64_t begin = UINT64_MAX, end = 0;
  std::vector<ChunkRow> rows;
  for (const auto& [ref, row] : chunks) {
    if (row.pack_id != pack) continue;
    begin = std::min(begin, row.offset);
    end = std::max(end, row.offset + row.length);
    rows.push_back(row);
  }
  auto fd = OpenFile(dir_ / "packs" / PackFileName(pack), O_RDONLY);
  ASSERT_TRUE(fd.ok());
  ASSERT_EQ(::fdatasync(fd->get()), 0);
  ASSERT_EQ(::posix_fadvise(fd->get(), 0, 0, POSIX_FADV_DONTNEED), 0);
  if (ResidentPages(fd->get(), begin, end - begin) > 0) {
    GTEST_SKIP() << "this filesystem keeps the pack in memory (tmpfs?): nothing to read ahead";
  }
  ChunkCache cache(64 << 20);
  auto reader = NewReader(&cache, ChunkReader::DirectReads::kOff);
  reader->WillNeed(rows);
  const size_t pages = (end - begin + 4095) / 4096;
  size_t resident = 0;
  // The kernel reads asynchronously and read-ahead is best effort (its page allocations give
  // up rather than reclaim, and this VM's DAMON reclaim works beside it): on the shared VM a
  // few pages of 2049 were missing in some runs, so the check is that nearly all arrive
  // (without the advice none do).
  for (int i = 0; i < 1000 && resident * 10 < pages * 9; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    resident = ResidentPages(fd->get(), begin, end - begin);
  }
  EXPECT_GE(resident * 10, pages * 9) << resident << " of " << pages;
  EXPECT_EQ(reader->reads(), 0u);  // advice, not reads
}

// Records that are not in the page cache are read with O_DIRECT: the right bytes, no page of
// the pack cached afterwards (nothing allocated, copied or evicted for them), and a damaged one
// is Corruption as before; records that are cached are read from the page cache.
TEST_F(ChunkReaderTest, UncachedRecordsAreReadDirectlyAndLeaveNoPagesBehind) {
  Buffer data = RandomBuffer(6 << 20, 9);
  const ContentId content = Write(data.bytes());
  const auto chunks = Chunks(content);
  ASSERT_GT(chunks.size(), 2u);
  std::set<uint32_t> packs;
  for (const auto& [ref, row] : chunks) packs.insert(row.pack_id);
  std::vector<FileDescriptor> fds;
  auto drop_cache = [&] {
    for (const auto& fd : fds) {
      ASSERT_EQ(::fdatasync(fd.get()), 0);
      ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
    }
  };
  auto resident = [&] {
    size_t n = 0;
    for (const auto& fd : fds) {
      auto size = FileSize(fd.get(), "pack");
      if (size.ok() && *size > 0) n += ResidentPages(fd.get(), 0, *size);
    }
    return n;
  };
  for (uint32_t pack : packs) {
    auto fd = OpenFile(dir_ / "packs" / PackFileName(pack), O_RDONLY);
    ASSERT_TRUE(fd.ok());
    fds.push_back(std::move(*fd));
  }
  drop_cache();
  if (resident() > 0) GTEST_SKIP() << "this filesystem keeps the packs in memory (tmpfs?)";
  if (!PageCacheBytes(fds[0].get(), 0, 1).ok() ||
      !OpenFile(dir_ / "packs" / PackFileName(*packs.begin()), O_RDONLY | O_DIRECT).ok()) {
    GTEST_SKIP() << "no direct reads here (kernel without cachestat, or no O_DIRECT)";
  }

  ChunkCache cache(64 << 20);
  auto reader = NewReader(&cache);
  for (const auto& [ref, row] : chunks) {
    auto decoded = reader->Decode(ref.id, row);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    ASSERT_EQ(decoded->size(), ref.length);
    EXPECT_EQ(std::memcmp(decoded->data(), data.data() + ref.offset, ref.length), 0);
  }
  EXPECT_EQ(reader->direct_reads(), chunks.size());
  EXPECT_EQ(resident(), 0u);

  // Cached now (read through the page cache by someone else): read from there.
  for (const auto& fd : fds) {
    auto size = FileSize(fd.get(), "pack");
    ASSERT_TRUE(size.ok());
    Buffer all(*size);
    ASSERT_TRUE(PReadFull(fd.get(), 0, all.mutable_bytes(), "pack").ok());
  }
  const uint64_t direct_before = reader->direct_reads();
  for (const auto& [ref, row] : chunks) {
    auto decoded = reader->Decode(ref.id, row);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(std::memcmp(decoded->data(), data.data() + ref.offset, ref.length), 0);
  }
  EXPECT_EQ(reader->direct_reads(), direct_before);

  // A flipped byte in the middle of a record, read directly: Corruption, never wrong bytes.
  const auto& [ref, row] = chunks[1];
  Flip(row.pack_id, row.offset + row.length / 2);
  drop_cache();
  auto damaged = reader->Decode(ref.id, row);
  EXPECT_TRUE(damaged.status().IsCorruption()) << damaged.status().ToString();
  EXPECT_EQ(reader->direct_reads(), direct_before + 1);
}

TEST_F(ChunkReaderTest, ConcurrentLoadsOfAChunkReadItsRecordOnce) {
  const ContentId content = Write(RandomBuffer(1 << 20, 2).bytes());
  const auto chunks = Chunks(content);
  ASSERT_FALSE(chunks.empty());
  ChunkCache cache(64 << 20);
  auto reader = NewReader(&cache);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (const auto& [ref, row] : chunks) {
        auto loaded = reader->Load(ref.id, row);
        if (!loaded.ok() || (*loaded)->size() != ref.length) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // Each record once: a caller either waited for the load in progress or hit the cache.
  EXPECT_EQ(reader->reads(), chunks.size());
  uint64_t bytes = 0;
  for (const auto& [ref, row] : chunks) bytes += row.length;
  EXPECT_EQ(reader->read_bytes(), bytes);
}

TEST_F(ChunkReaderTest, DamagedRecordsAndMismatchedRowsAreCorruption) {
  const ContentId content = Write(RandomBuffer(1 << 20, 3).bytes());
  const auto chunks = Chunks(content);
  ASSERT_GE(chunks.size(), 2u);
  ChunkCache cache(0);  // nothing cached: every call reads its record
  auto reader = NewReader(&cache);

  // A row that disagrees with its record.
  ChunkRow wrong_len = chunks[0].second;
  wrong_len.raw_len += 1;
  auto r = reader->Decode(chunks[0].first.id, wrong_len);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  ChunkRow wrong_sum = chunks[0].second;
  wrong_sum.checksum ^= 1;
  r = reader->Decode(chunks[0].first.id, wrong_sum);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  r = reader->Decode(chunks[1].first.id, chunks[0].second);  // another chunk's record
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  ChunkRow past_end = chunks[0].second;
  past_end.offset += 1 << 30;
  r = reader->Decode(chunks[0].first.id, past_end);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();

  // A flipped payload byte, then a flipped header byte, of two different records.
  const ChunkRow& a = chunks[0].second;
  Flip(a.pack_id, a.offset + kRecordHeaderBytes + a.length / 2);
  r = reader->Decode(chunks[0].first.id, a);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("pack " + PackFileName(a.pack_id)), std::string::npos);
  auto loaded = reader->Load(chunks[0].first.id, a);
  EXPECT_TRUE(loaded.status().IsCorruption());
  const ChunkRow& b = chunks[1].second;
  Flip(b.pack_id, b.offset + 9);  // the raw length field
  auto rec = reader->ReadRecord(chunks[1].first.id, b);
  EXPECT_TRUE(rec.status().IsCorruption()) << rec.status().ToString();
}

TEST_F(ChunkReaderTest, ADeltaDecodesThroughItsBaseAndAMissingBaseIsCorruption) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<float> a(4096), b(4096);
  for (float& x : a) x = normal(rng);
  for (size_t i = 0; i < a.size(); ++i) b[i] = a[i] * 1.0001f;
  const Bytes ba{reinterpret_cast<const std::byte*>(a.data()), a.size() * 4};
  const Bytes bb{reinterpret_cast<const std::byte*>(b.data()), b.size() * 4};
  Write(ba);
  const ChunkId ida = ChunkId::Of(ba), idb = ChunkId::Of(bb);

  // b as a sub-delta on a, in an adopted pack (as the snapshot engine writes them).
  auto pack = store_->CreateExternalPack(::getuid(), ::getgid());
  ASSERT_TRUE(pack.ok());
  const Buffer base(ba);
  const CodecSpec spec;
  Buffer encoded = EncodePieceAs(spec, bb, Transform::kSub, 4, &base);
  Buffer payload = JoinDeltaPayload(ida, encoded.bytes());
  const RecordHeader h =
      RecordHeader::For(idb, static_cast<uint32_t>(bb.size()),
                        PieceEncoding{Transform::kSub, 4, spec.codec}, payload.bytes());
  std::byte header[kRecordHeaderBytes];
  h.EncodeTo(header);
  {
    auto fd = OpenFile(pack->second, O_WRONLY);
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(PWriteFull(fd->get(), kPackHeaderBytes, {header, kRecordHeaderBytes}, "p").ok());
    ASSERT_TRUE(
        PWriteFull(fd->get(), kPackHeaderBytes + kRecordHeaderBytes, payload.bytes(), "p").ok());
  }
  const uint32_t length = static_cast<uint32_t>(kRecordHeaderBytes + payload.size());
  std::vector<Store::AdoptedChunk> adopted = {{idb,
                                               static_cast<uint32_t>(bb.size()),
                                               PackLocation{pack->first, kPackHeaderBytes, length},
                                               {}}};
  ASSERT_TRUE(store_->CheckExternalPack(pack->first, kPackHeaderBytes + length, &adopted).ok());
  {
    auto txn = store_->catalog().BeginWrite();
    ASSERT_TRUE(txn.ok());
    auto cb =
        store_->AdoptContentInTxn(*txn, adopted, bb.size(), pack->first, kPackHeaderBytes + length);
    ASSERT_TRUE(cb.ok()) << cb.status().ToString();
    ASSERT_TRUE(txn->Commit().ok());
  }
  ChunkRow row_b;
  {
    auto txn = store_->catalog().BeginRead();
    ASSERT_TRUE(txn.ok());
    row_b = **txn->GetChunk(idb);
  }
  ASSERT_EQ(row_b.base, ida);

  ChunkCache cache(64 << 20);
  auto reader = NewReader(&cache);
  auto decoded = reader->Load(idb, row_b);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ((*decoded)->size(), bb.size());
  EXPECT_EQ(std::memcmp((*decoded)->data(), bb.data(), bb.size()), 0);
  EXPECT_EQ(reader->reads(), 2u);  // the delta and its base

  // A row whose base is not the one its record names.
  ChunkRow wrong_base = row_b;
  wrong_base.base = idb;
  auto r = reader->Decode(idb, wrong_base);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  // The base's row gone from the catalog.
  {
    auto txn = store_->catalog().BeginWrite();
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(txn->DeleteChunk(ida).ok());
    ASSERT_TRUE(txn->Commit().ok());
  }
  ChunkCache empty(0);
  auto fresh = NewReader(&empty);
  r = fresh->Decode(idb, row_b);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("missing"), std::string::npos);
}

}  // namespace
}  // namespace ckptfs
