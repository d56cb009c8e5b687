// Unit tests of the pack writer (pack_writer.h): records land where Append says, byte for
// byte, on the io_uring path and the pwrite path, with direct (O_DIRECT segment) writes and
// through the page cache, a delta's base id is written from the header's buffer, a queue far
// smaller than the records still makes progress, and a direct pack's flushed tail, its
// segment boundaries and a resumed pack keep every byte.
#include "engine/store/pack_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/util/file.h"
#include "engine/util/test_buffers.h"

namespace ckptfs {
namespace {

// (io_uring, direct writes)
class PackWriterTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_pack_writer_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<PackWriter> Open(size_t queue_bytes,
                                   std::optional<PackExtent> resume = std::nullopt,
                                   uint32_t next_id = 1) {
    PackWriter::Options options;
    options.use_io_uring = std::get<0>(GetParam());
    options.direct_io = std::get<1>(GetParam());
    options.queue_bytes = queue_bytes;
    std::vector<PackExtent> packs;
    if (resume) packs.push_back(*resume);
    auto w = PackWriter::Open(dir_, options, packs, next_id);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    // This test's directory is on a filesystem that takes O_DIRECT (ext4, xfs, tmpfs >= 6.6).
    EXPECT_EQ((*w)->using_direct_io(), options.direct_io && resume.has_value())
        << "before its first pack, a writer reports its last pack's mode (none yet: false)";
    return std::move(*w);
  }
  // Appends a record of `n` pseudo-random bytes; remembers it for CheckAll.
  PackLocation Add(PackWriter& w, size_t n, uint32_t seed, PackLane lane = PackLane::kMain) {
    Buffer payload = RandomBuffer(n, seed);
    const RecordHeader header =
        RecordHeader::For(ChunkId::Of(payload.bytes()), static_cast<uint32_t>(payload.size()),
                          PieceEncoding{}, payload.bytes());
    auto loc = w.Append(header, Buffer(payload.bytes()), std::nullopt, lane);
    EXPECT_TRUE(loc.ok()) << loc.status().ToString();
    written_.emplace_back(*loc, std::move(payload));
    return *loc;
  }
  void CheckAll(const PackWriter& w) {
    for (const auto& [loc, payload] : written_) {
      EXPECT_TRUE(w.IsDurable(loc));
      Buffer on_disk = ReadAt(loc);
      ASSERT_EQ(on_disk.size(), kRecordHeaderBytes + payload.size());
      auto header = RecordHeader::Decode(on_disk.bytes());
      ASSERT_TRUE(header.ok()) << "record at " << loc.offset;
      EXPECT_EQ(header->id, ChunkId::Of(payload.bytes()));
      EXPECT_EQ(std::memcmp(on_disk.data() + kRecordHeaderBytes, payload.data(), payload.size()), 0)
          << "record at " << loc.offset;
    }
  }
  uint64_t FileSize(uint32_t pack_id) {
    return std::filesystem::file_size(dir_ / PackFileName(pack_id));
  }
  std::vector<std::pair<PackLocation, Buffer>> written_;
  Buffer ReadAt(const PackLocation& loc) {
    auto fd = OpenFile(dir_ / PackFileName(loc.pack_id), O_RDONLY);
    EXPECT_TRUE(fd.ok());
    Buffer out(loc.length);
    EXPECT_EQ(::pread(fd->get(), out.data(), out.size(), static_cast<off_t>(loc.offset)),
              static_cast<ssize_t>(out.size()));
    return out;
  }
  std::filesystem::path dir_;
};

TEST_P(PackWriterTest, DeltaRecordEqualsTheJoinedPayloadsRecord) {
  auto w = Open(16u << 20);
  const ChunkId id = ChunkId::Of(AsBytes("the chunk"));
  const ChunkId base = ChunkId::Of(AsBytes("its base"));
  const Buffer encoded = RandomBuffer(300000, 1);
  const PieceEncoding encoding{Transform::kXor, 4, Codec::kLz4};
  const RecordHeader header = RecordHeader::ForDelta(id, 1 << 20, encoding, base, encoded.bytes());
  const Buffer joined = JoinDeltaPayload(base, encoded.bytes());
  const RecordHeader expected = RecordHeader::For(id, 1 << 20, encoding, joined.bytes());
  EXPECT_EQ(header.stored_len, expected.stored_len);
  EXPECT_EQ(header.payload_checksum, expected.payload_checksum);

  auto loc = w->Append(header, Buffer(encoded.bytes()), base);
  ASSERT_TRUE(loc.ok()) << loc.status().ToString();
  EXPECT_EQ(loc->length, kRecordHeaderBytes + joined.size());
  ASSERT_TRUE(w->Sync().ok());
  EXPECT_TRUE(w->IsDurable(*loc));
  Buffer on_disk = ReadAt(*loc);
  std::byte want_header[kRecordHeaderBytes];
  expected.EncodeTo(want_header);
  EXPECT_EQ(std::memcmp(on_disk.data(), want_header, kRecordHeaderBytes), 0);
  EXPECT_EQ(std::memcmp(on_disk.data() + kRecordHeaderBytes, joined.data(), joined.size()), 0);

  // A header whose stored length does not count the base id is refused.
  const RecordHeader without_id = RecordHeader::For(id, 1 << 20, encoding, encoded.bytes());
  EXPECT_FALSE(w->Append(without_id, Buffer(encoded.bytes()), base).ok());
}

TEST_P(PackWriterTest, AQueueSmallerThanOneRecordStillWritesEveryRecord) {
  auto w = Open(64u << 10);  // each record alone is larger than the queue
  std::vector<std::pair<PackLocation, Buffer>> written;
  for (uint32_t i = 0; i < 24; ++i) {
    Buffer payload = RandomBuffer((1 << 20) - i * 1000, i);
    const RecordHeader header =
        RecordHeader::For(ChunkId::Of(payload.bytes()), static_cast<uint32_t>(payload.size()),
                          PieceEncoding{}, payload.bytes());
    auto loc = w->Append(header, Buffer(payload.bytes()));
    ASSERT_TRUE(loc.ok()) << loc.status().ToString();
    written.emplace_back(*loc, std::move(payload));
  }
  ASSERT_TRUE(w->Sync().ok());
  for (const auto& [loc, payload] : written) {
    EXPECT_TRUE(w->IsDurable(loc));
    Buffer on_disk = ReadAt(loc);
    ASSERT_EQ(on_disk.size(), kRecordHeaderBytes + payload.size());
    auto header = RecordHeader::Decode(on_disk.bytes());
    ASSERT_TRUE(header.ok());
    EXPECT_EQ(header->id, ChunkId::Of(payload.bytes()));
    EXPECT_EQ(std::memcmp(on_disk.data() + kRecordHeaderBytes, payload.data(), payload.size()), 0);
  }
}

TEST_P(PackWriterTest, ASharedPayloadIsWrittenAndLeftAsItWas) {
  // The store shares a raw piece between the chunk cache and the record's write: both see the
  // same bytes, and the writer drops its reference once written.
  auto w = Open(16u << 20);
  auto payload = std::make_shared<const Buffer>(RandomBuffer(700000, 9));
  const Buffer copy(payload->bytes());
  const RecordHeader header =
      RecordHeader::For(ChunkId::Of(payload->bytes()), static_cast<uint32_t>(payload->size()),
                        PieceEncoding{}, payload->bytes());
  auto loc = w->Append(header, payload);
  ASSERT_TRUE(loc.ok()) << loc.status().ToString();
  ASSERT_TRUE(w->Sync().ok());
  EXPECT_EQ(payload.use_count(), 1) << "the writer keeps no reference once written";
  Buffer on_disk = ReadAt(*loc);
  ASSERT_EQ(on_disk.size(), kRecordHeaderBytes + copy.size());
  EXPECT_EQ(std::memcmp(on_disk.data() + kRecordHeaderBytes, copy.data(), copy.size()), 0);
  EXPECT_EQ(std::memcmp(payload->data(), copy.data(), copy.size()), 0);
  EXPECT_FALSE(w->Append(header, std::shared_ptr<const Buffer>()).ok()) << "no payload buffer";
}

TEST_P(PackWriterTest, RecordsAcrossSegmentsAndFlushedTailsKeepEveryByte) {
  auto w = Open(8u << 20);
  EXPECT_EQ(w->using_direct_io(), false);
  // Small records, one spanning several segments, and tails made durable in between: each
  // Sync writes a partial last block that the next records write again.
  Add(*w, 100, 1);
  ASSERT_TRUE(w->Sync().ok());
  EXPECT_EQ(w->using_direct_io(), std::get<1>(GetParam()));
  Add(*w, 5000, 2);
  ASSERT_TRUE(w->WaitWritten().ok());
  Add(*w, 3 * PackWriter::kSegmentBytes + 17, 3);
  for (uint32_t i = 0; i < 40; ++i) Add(*w, 37 * 1024 + i * 13, 10 + i);
  ASSERT_TRUE(w->Sync().ok());
  Add(*w, PackWriter::kSegmentBytes - 64, 4);
  ASSERT_TRUE(w->Sync().ok());
  CheckAll(*w);
  // Rotation leaves the pack exactly as long as its records (no block padding).
  ASSERT_EQ(w->active_extents().size(), 1u);
  const uint32_t pack = w->active_extents()[0].pack_id;
  ASSERT_TRUE(w->Rotate().ok());
  const PackLocation& last = written_.back().first;
  EXPECT_EQ(FileSize(pack), last.offset + last.length);
  Add(*w, 1000, 5);
  EXPECT_NE(written_.back().first.pack_id, pack);
  ASSERT_TRUE(w->Sync().ok());
  CheckAll(*w);
}

TEST_P(PackWriterTest, AResumedPackKeepsItsRecordsAndTakesMore) {
  PackExtent extent;
  {
    auto w = Open(8u << 20);
    Add(*w, 12345, 1);
    Add(*w, PackWriter::kSegmentBytes + 999, 2);
    ASSERT_TRUE(w->Sync().ok());
    const PackLocation& last = written_.back().first;
    extent = PackExtent{last.pack_id, last.offset + last.length};
  }
  // As the store does at open: the pack cut to its committed length (an unaligned one).
  ASSERT_EQ(
      ::truncate((dir_ / PackFileName(extent.pack_id)).c_str(), static_cast<off_t>(extent.length)),
      0);
  auto w = Open(8u << 20, extent, extent.pack_id + 1);
  EXPECT_EQ(Add(*w, 777, 3).pack_id, extent.pack_id);
  Add(*w, 3 * PackWriter::kSegmentBytes, 4);
  ASSERT_TRUE(w->Sync().ok());
  CheckAll(*w);
}

TEST_P(PackWriterTest, EachLaneAppendsToAPackOfItsOwnThatItsHeaderNames) {
  std::vector<PackExtent> ends;
  {
    auto w = Open(8u << 20);
    const uint32_t main = Add(*w, 70000, 1).pack_id;
    const uint32_t lasting = Add(*w, 300, 2, PackLane::kLasting).pack_id;
    EXPECT_NE(main, lasting);
    // Records of one lane lie one after the other, whatever the other lane appended between.
    const PackLocation a = Add(*w, 5000, 3);
    Add(*w, 200, 4, PackLane::kLasting);
    const PackLocation b = Add(*w, PackWriter::kSegmentBytes + 5, 5);
    EXPECT_EQ(a.pack_id, main);
    EXPECT_EQ(b.pack_id, main);
    EXPECT_EQ(b.offset, a.offset + a.length);
    ASSERT_TRUE(w->Sync().ok());
    CheckAll(*w);
    ends = w->active_extents();
    ASSERT_EQ(ends.size(), 2u);
    for (const PackExtent& e : ends) {
      std::byte header[kPackHeaderBytes];
      auto fd = OpenFile(dir_ / PackFileName(e.pack_id), O_RDONLY);
      ASSERT_TRUE(fd.ok());
      ASSERT_TRUE(PReadFull(fd->get(), 0, {header, kPackHeaderBytes}, "pack").ok());
      ASSERT_TRUE(CheckPackHeader({header, kPackHeaderBytes}, e.pack_id).ok());
      EXPECT_EQ(PackLaneOf({header, kPackHeaderBytes}), e.lane);
      EXPECT_EQ(e.pack_id, e.lane == PackLane::kMain ? main : lasting);
    }
  }
  // Reopened with both packs to resume (cut to their lengths, as the store does): each lane
  // goes on in its own.
  for (const PackExtent& e : ends) {
    ASSERT_EQ(::truncate((dir_ / PackFileName(e.pack_id)).c_str(), static_cast<off_t>(e.length)),
              0);
  }
  PackWriter::Options options;
  options.use_io_uring = std::get<0>(GetParam());
  options.direct_io = std::get<1>(GetParam());
  auto w = PackWriter::Open(dir_, options, ends, 10);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (const PackExtent& e : ends) {
    const PackLocation loc = Add(**w, 999, 6 + static_cast<uint32_t>(e.lane), e.lane);
    EXPECT_EQ(loc.pack_id, e.pack_id);
    EXPECT_EQ(loc.offset, e.length);
  }
  ASSERT_TRUE((*w)->Sync().ok());
  CheckAll(**w);
  // Rotate closes both.
  ASSERT_TRUE((*w)->Rotate().ok());
  EXPECT_TRUE((*w)->active_extents().empty());
}

// Records that die apart free the block they share: the first punch zeroes its part of it (on
// disk, and in the tail segment still in memory, which a later write of the tail would
// otherwise bring back), the second finds the rest zero and frees the block.
TEST_P(PackWriterTest, DeadRecordsThatDieApartFreeTheBlockTheyShare) {
  auto w = Open(8u << 20);
  const PackLocation keep = Add(*w, 10000, 1);
  const PackLocation a = Add(*w, 6000, 2);
  ASSERT_TRUE(w->Sync().ok());  // a's last block is the tail's: written again with what follows
  const std::filesystem::path path = dir_ / PackFileName(a.pack_id);
  auto allocated = [&] {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  ASSERT_TRUE(w->PunchDead(a.pack_id, {{a.offset, a.offset + a.length}}).ok());
  const PackLocation b = Add(*w, 6000, 3);
  const PackLocation c = Add(*w, 9000, 4);
  ASSERT_TRUE(w->Sync().ok());
  // A block that only a and b hold: freed only once both are dead.
  const uint64_t shared = (a.offset + a.length) / 4096 * 4096;
  ASSERT_GE(shared, keep.offset + keep.length);
  ASSERT_LE(shared + 4096, b.offset + b.length);
  ASSERT_TRUE(w->PunchDead(b.pack_id, {{b.offset, b.offset + b.length}}).ok());
  // The blocks that hold a byte of the header, keep or c stay; a's and b's others are gone.
  std::set<uint64_t> blocks;
  for (const auto& [from, to] : {std::pair<uint64_t, uint64_t>{0, kPackHeaderBytes},
                                 {keep.offset, keep.offset + keep.length},
                                 {c.offset, c.offset + c.length}}) {
    for (uint64_t block = from / 4096; block * 4096 < to; ++block) blocks.insert(block);
  }
  EXPECT_EQ(allocated(), blocks.size() * 4096);
  // What lives reads back as written; the dead bytes read as zeros.
  written_.erase(written_.begin() + 1, written_.begin() + 3);
  CheckAll(*w);
  Buffer dead = ReadAt(PackLocation{a.pack_id, a.offset, a.length + b.length});
  EXPECT_TRUE(std::all_of(dead.data(), dead.data() + dead.size(),
                          [](std::byte x) { return x == std::byte{0}; }));
}

// A byte-exact punch leaves no hole where it zeroes part of a block: the log of punches says
// which ranges changed since a given point.
TEST_P(PackWriterTest, PunchedSinceNamesTheRangesPunchedAfterAPoint) {
  auto w = Open(8u << 20);
  const PackLocation a = Add(*w, 1000, 1);
  const PackLocation b = Add(*w, 1000, 2);
  const PackLocation far = Add(*w, 20000, 3);
  ASSERT_TRUE(w->Sync().ok());
  const uint64_t before = w->punch_seq();
  EXPECT_FALSE(w->PunchedSince(before, a.pack_id, 0, 1u << 20)) << "nothing punched yet";
  ASSERT_TRUE(w->PunchDead(a.pack_id, {{a.offset, a.offset + a.length}}).ok());
  EXPECT_TRUE(w->PunchedSince(before, a.pack_id, a.offset, a.offset + a.length));
  EXPECT_TRUE(w->PunchedSince(before, b.pack_id, b.offset, b.offset + b.length))
      << "b shares a block with a";
  EXPECT_FALSE(w->PunchedSince(before, far.pack_id, far.offset + 8192, far.offset + 12288));
  EXPECT_FALSE(w->PunchedSince(before, a.pack_id + 1, a.offset, a.offset + a.length));
  EXPECT_FALSE(w->PunchedSince(w->punch_seq(), a.pack_id, a.offset, a.offset + a.length))
      << "nothing since the punch";
}

INSTANTIATE_TEST_SUITE_P(IoUringAndPwrite, PackWriterTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "io_uring" : "pwrite") +
                                  (std::get<1>(info.param) ? "_direct" : "_page_cache");
                         });

}  // namespace
}  // namespace ckptfs
