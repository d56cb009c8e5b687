// Unit tests of ContentReader (content_reader.h), without FUSE: a pass in any order does not
// keep the chunks it read whole, chunks read in parts stay cached until their last part, the
// bytes are right either way, prefetch runs ahead of a sequential reader and skips what the
// reader is done with.
#include "engine/store/content_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "engine/store/content_writer.h"

namespace ckptfs {
namespace {

class ContentReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_content_reader_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    StoreOptions options;
    options.cache_bytes = 64 << 20;
    auto s = Store::Open(dir_, options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    data_ = Buffer(24 << 20);
    std::mt19937_64 rng(7);
    for (size_t i = 0; i < data_.size(); i += 8) {
      uint64_t v = rng();
      std::memcpy(data_.data() + i, &v, 8);
    }
    auto w = store_->NewWriter();
    ASSERT_TRUE(w->Append(data_.bytes()).ok());
    auto id = w->Finish();
    ASSERT_TRUE(id.ok());
    id_ = *id;
    store_->WaitReencoded();  // no pack reads but the readers' from here on
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Reads the whole content in `piece`-byte reads at the offsets given, checking the bytes.
  void ReadAt(ContentReader& reader, const std::vector<uint64_t>& offsets, size_t piece,
              bool zero_copy) {
    Buffer out(piece);
    for (uint64_t off : offsets) {
      size_t n;
      if (zero_copy) {
        std::vector<ChunkSlice> slices;
        auto r = reader.ReadSlices(off, piece, &slices);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        n = 0;
        for (const auto& s : slices) {
          std::memcpy(out.data() + n, s.bytes().data(), s.length);
          n += s.length;
        }
        ASSERT_EQ(n, *r);
      } else {
        auto r = reader.Read(off, out.mutable_bytes());
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        n = *r;
      }
      ASSERT_EQ(n, std::min<size_t>(piece, data_.size() - off));
      ASSERT_EQ(std::memcmp(out.data(), data_.data() + off, n), 0) << "at " << off;
    }
  }
  std::vector<uint64_t> Sequential(size_t piece) {
    std::vector<uint64_t> offsets;
    for (uint64_t off = 0; off < data_.size(); off += piece) offsets.push_back(off);
    return offsets;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
  Buffer data_;
  ContentId id_ = 0;
};

TEST_F(ContentReaderTest, ASequentialPassDoesNotKeepWhatItStreamed) {
  const uint64_t before = store_->pack_reads();
  {
    ContentReader reader(store_.get(), id_, 4 << 20);
    ReadAt(reader, Sequential(128 << 10), 128 << 10, /*zero_copy=*/true);
  }
  const uint64_t first_pass = store_->pack_reads() - before;
  ASSERT_GT(first_pass, 0u);
  // Nothing of it was kept: a second pass reads every record again. (A pass with random
  // reads, below, is cached instead.)
  {
    ContentReader reader(store_.get(), id_, 4 << 20);
    ReadAt(reader, Sequential(1 << 20), 1 << 20, /*zero_copy=*/false);
  }
  // (Allowing for a prefetch the workers finish after the first reader has gone.)
  const uint64_t second_pass = store_->pack_reads() - before - first_pass;
  EXPECT_GE(second_pass, first_pass / 2);
}

TEST_F(ContentReaderTest, APassInAnyOrderDoesNotKeepWhatItRead) {
  // torch.load's order: record headers and data, jumping back and forth. Each chunk returned
  // whole is dropped, whatever the order, so a second pass reads the records again.
  std::vector<uint64_t> offsets = Sequential(256 << 10);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937(3));
  const uint64_t before = store_->pack_reads();
  {
    ContentReader reader(store_.get(), id_, 4 << 20);
    ReadAt(reader, offsets, 256 << 10, /*zero_copy=*/true);
    EXPECT_LT(store_->cache_bytes(), 8u << 20) << "what it read whole is not held";
  }
  const uint64_t first_pass = store_->pack_reads() - before;
  ASSERT_GT(first_pass, 0u);
  {
    ContentReader reader(store_.get(), id_, 4 << 20);
    ReadAt(reader, offsets, 256 << 10, /*zero_copy=*/false);
  }
  EXPECT_GE(store_->pack_reads() - before - first_pass, first_pass / 2);
}

TEST_F(ContentReaderTest, ChunksReadInPartsStayUntilTheirLastPart) {
  // Small random reads (an mmap's page faults): a chunk partly read stays cached, so the
  // other parts of it, read later (by another reader too), come from memory.
  std::vector<uint64_t> offsets = Sequential(256 << 10);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937(5));
  std::vector<std::pair<uint64_t, uint64_t>> touched;  // chunks partly read: [start, end)
  {
    ContentReader reader(store_.get(), id_, /*readahead_bytes=*/0);  // no prefetch: loads only
    for (uint64_t off : offsets) {
      std::vector<ChunkSlice> slices;
      ASSERT_TRUE(reader.ReadSlices(off, 4096, &slices).ok());
      for (const ChunkSlice& slice : slices) {
        touched.emplace_back(slice.content_end - slice.chunk->size(), slice.content_end);
      }
    }
  }
  const uint64_t after_first = store_->pack_reads();
  ContentReader reader(store_.get(), id_, /*readahead_bytes=*/0);  // no prefetch: loads only
  size_t rest_read = 0;
  for (const auto& [start, end] : touched) {
    if (end - start < 3 * 4096) continue;  // no part of it the first pass left unread for sure
    ReadAt(reader, {end - 4096}, 4096, /*zero_copy=*/false);
    ++rest_read;
  }
  ASSERT_GT(rest_read, 20u);
  EXPECT_EQ(store_->pack_reads(), after_first);  // all cached (24 MiB in a 64 MiB cache)
}

TEST_F(ContentReaderTest, PrefetchRunsAhead) {
  // One small read, then wait: the workers load what follows.
  ContentReader reader(store_.get(), id_, 4 << 20);
  const uint64_t before = store_->pack_read_bytes();  // the re-encoder's reads, in SetUp
  ReadAt(reader, {0}, 4096, true);
  for (int i = 0; i < 500 && store_->pack_read_bytes() - before < (3u << 20); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(store_->pack_read_bytes() - before, 3u << 20);  // ahead of the 4 KiB read
  // Served by what the workers loaded (or are loading: a read joins a load in flight). Not
  // pack_reads(): the reads move the window on, and the workers read what it newly covers.
  const uint64_t read_loads = store_->read_loads();
  ReadAt(reader, {4096, 1 << 20, 2 << 20}, 4096, true);
  EXPECT_EQ(store_->read_loads(), read_loads);
}

TEST_F(ContentReaderTest, PrefetchSkipsWhatItsReaderIsDoneWith) {
  // A worker that reaches a queued load only after the reader has returned the chunk whole (a
  // busy machine: the reader loaded it itself) must not decode it again. One worker, so the
  // pool runs the queue in order.
  store_.reset();
  StoreOptions options;
  options.cache_bytes = 64 << 20;
  options.worker_threads = 1;
  auto s = Store::Open(dir_, options);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  store_ = std::move(*s);
  store_->WaitReencoded();  // no pack reads but the ones counted below
  std::vector<ChunkSlice> slices;
  ASSERT_TRUE(store_->ReadSlices(id_, 0, 8 << 20, &slices, ChunkReader::CacheMode::kStream).ok());
  ASSERT_GE(slices.size(), 3u);
  const ChunkSlice sentinel = slices.back();  // one chunk the reader has not finished
  slices.pop_back();
  auto progress = std::make_shared<ReadProgress>();
  for (const ChunkSlice& slice : slices) progress->Finished(slice.id, slice.content_end);
  for (const ChunkSlice& slice : slices) store_->DropStreamed(slice.id);
  store_->DropStreamed(sentinel.id);
  const uint64_t before = store_->pack_reads();
  store_->Prefetch(id_, 0, slices.back().content_end, WorkerPool::Priority::kNormal,
                   ChunkReader::CacheMode::kStream, progress);
  // Queued behind them: when the sentinel is in, the queue before it has run.
  store_->Prefetch(id_, slices.back().content_end, 1);
  for (int i = 0; i < 1000 && !store_->Cached(sentinel.id); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(store_->Cached(sentinel.id));
  EXPECT_EQ(store_->pack_reads(), before + 1) << "the reader's finished chunks were loaded again";
}

}  // namespace
}  // namespace ckptfs
