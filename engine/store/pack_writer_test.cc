// Unit tests of the pack writer (pack_writer.h): records land where Append says, byte for
// byte, on the io_uring path and the pwrite path, a delta's base id is written from the
// header's buffer, and a queue far smaller than the records still makes progress.
#include "engine/store/pack_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "engine/util/file.h"
#include "engine/util/test_buffers.h"

namespace ckptfs {
namespace {

class PackWriterTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_pack_writer_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<PackWriter> Open(size_t queue_bytes) {
    PackWriter::Options options;
    options.use_io_uring = GetParam();
    options.queue_bytes = queue_bytes;
    auto w = PackWriter::Open(dir_, options, std::nullopt, 1);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(*w);
  }
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

INSTANTIATE_TEST_SUITE_P(IoUringAndPwrite, PackWriterTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "io_uring" : "pwrite"; });

}  // namespace
}  // namespace ckptfs
