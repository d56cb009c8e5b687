// Unit tests of adopting packs another process wrote (adopt.cc): encoded and delta records.
// The snapshot integration tests (tests/snapshot/) drive the same path through the daemon.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "engine/store/content_writer.h"
#include "engine/store/record.h"
#include "engine/store/store.h"

namespace ckptfs {
namespace {

class AdoptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_adopt_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto s = Store::Open(dir_, StoreOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  static std::vector<float> Floats(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0, 0.02f);
    std::vector<float> v(1024);
    for (float& x : v) x = normal(rng);
    return v;
  }
  static Bytes BytesOf(const std::vector<float>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)};
  }
  ContentId Write(Bytes data) {
    auto w = store_->NewWriter();
    EXPECT_TRUE(w->Append(data).ok());
    auto id = w->Finish();
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return *id;
  }
  std::vector<std::byte> ReadAll(ContentId id) {
    auto row = store_->StatContent(id);
    EXPECT_TRUE(row.ok()) << row.status().ToString();
    std::vector<std::byte> out(row.ok() ? row->size : 0);
    auto n = store_->Read(id, 0, {out.data(), out.size()});
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return out;
  }
  // Writes `raw` as a sub-delta against `base` (whose id the record names) into a new external
  // pack, as the snapshot engine does, and checks it; returns the pack's id and length.
  std::pair<uint32_t, uint64_t> WriteDeltaPack(const ChunkId& base_id, Bytes base, Bytes raw,
                                               std::vector<Store::AdoptedChunk>* chunks) {
    auto pack = store_->CreateExternalPack(::getuid(), ::getgid());
    EXPECT_TRUE(pack.ok()) << pack.status().ToString();
    const Buffer base_buf(base);
    const CodecSpec spec;
    Buffer encoded = EncodePieceAs(spec, raw, Transform::kSub, 4, &base_buf);
    Buffer payload = JoinDeltaPayload(base_id, encoded.bytes());
    const ChunkId id = ChunkId::Of(raw);
    const RecordHeader h =
        RecordHeader::For(id, static_cast<uint32_t>(raw.size()),
                          PieceEncoding{Transform::kSub, 4, spec.codec}, payload.bytes());
    std::byte header[kRecordHeaderBytes];
    h.EncodeTo(header);
    auto fd = OpenFile(pack->second, O_WRONLY);
    EXPECT_TRUE(fd.ok());
    EXPECT_TRUE(PWriteFull(fd->get(), kPackHeaderBytes, {header, kRecordHeaderBytes}, "p").ok());
    EXPECT_TRUE(
        PWriteFull(fd->get(), kPackHeaderBytes + kRecordHeaderBytes, payload.bytes(), "p").ok());
    const uint32_t length = static_cast<uint32_t>(kRecordHeaderBytes + payload.size());
    chunks->push_back({id,
                       static_cast<uint32_t>(raw.size()),
                       PackLocation{pack->first, kPackHeaderBytes, length},
                       {}});
    return {pack->first, kPackHeaderBytes + length};
  }
  Result<ContentId> Adopt(const std::vector<Store::AdoptedChunk>& chunks, uint64_t size,
                          uint32_t pack_id, uint64_t pack_length) {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
    CKPTFS_ASSIGN_OR_RETURN(ContentId id,
                            store_->AdoptContentInTxn(txn, chunks, size, pack_id, pack_length));
    CKPTFS_RETURN_IF_ERROR(txn.Commit());
    return id;
  }
  ChunkRow Row(const ChunkId& id) {
    auto txn = store_->catalog().BeginRead();
    EXPECT_TRUE(txn.ok());
    auto row = txn->GetChunk(id);
    EXPECT_TRUE(row.ok() && row->has_value());
    return row.ok() && row->has_value() ? **row : ChunkRow{};
  }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(AdoptTest, ADeltaRecordIsAdoptedWithAReferenceOnItsBase) {
  const std::vector<float> a = Floats(1);
  std::vector<float> b = a;
  for (float& x : b) x *= 1.0001f;  // a small update: the high bytes of the difference are 0
  const ContentId ca = Write(BytesOf(a));
  const ChunkId ida = ChunkId::Of(BytesOf(a)), idb = ChunkId::Of(BytesOf(b));

  std::vector<Store::AdoptedChunk> chunks;
  auto [pack_id, pack_length] = WriteDeltaPack(ida, BytesOf(a), BytesOf(b), &chunks);
  ASSERT_TRUE(store_->CheckExternalPack(pack_id, pack_length, &chunks).ok());
  EXPECT_EQ(chunks[0].row.transform, Transform::kSub);
  EXPECT_EQ(chunks[0].row.base, ida);
  auto cb = Adopt(chunks, BytesOf(b).size(), pack_id, pack_length);
  ASSERT_TRUE(cb.ok()) << cb.status().ToString();

  const ChunkRow row_a = Row(ida), row_b = Row(idb);
  EXPECT_EQ(row_a.refcount, 2u);  // its content and the delta
  EXPECT_EQ(row_b.depth, row_a.depth + 1);
  EXPECT_EQ(row_b.base, ida);
  auto read = ReadAll(*cb);
  ASSERT_EQ(read.size(), BytesOf(b).size());
  EXPECT_EQ(std::memcmp(read.data(), b.data(), read.size()), 0);

  // The base's own content goes: gc stores the delta whole (as for the store's own deltas),
  // and it reads on.
  ASSERT_TRUE(store_->Release(ca).ok());
  auto gc = store_->Gc();
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->deltas_rematerialized, 1u);
  read = ReadAll(*cb);
  EXPECT_EQ(std::memcmp(read.data(), b.data(), read.size()), 0);
  auto report = store_->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();

  // Releasing the delta's content drops both.
  ASSERT_TRUE(store_->Release(*cb).ok());
  ASSERT_TRUE(store_->Gc().ok());
  auto stats = store_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->chunks, 0u);
}

TEST_F(AdoptTest, ADeltaAgainstAChunkNoLongerStoredIsRefused) {
  const std::vector<float> a = Floats(2), b = Floats(3);
  std::vector<Store::AdoptedChunk> chunks;
  auto [pack_id, pack_length] =
      WriteDeltaPack(ChunkId::Of(BytesOf(a)), BytesOf(a), BytesOf(b), &chunks);
  ASSERT_TRUE(store_->CheckExternalPack(pack_id, pack_length, &chunks).ok());
  auto adopted = Adopt(chunks, BytesOf(b).size(), pack_id, pack_length);
  ASSERT_FALSE(adopted.ok());
  EXPECT_TRUE(adopted.status().IsNotFound()) << adopted.status().ToString();
  auto stats = store_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->chunks, 0u);  // nothing of it was kept
}

TEST_F(AdoptTest, ADeltaThatNamesItselfIsCorruption) {
  const std::vector<float> a = Floats(4);
  std::vector<Store::AdoptedChunk> chunks;
  auto [pack_id, pack_length] =
      WriteDeltaPack(ChunkId::Of(BytesOf(a)), BytesOf(a), BytesOf(a), &chunks);
  Status s = store_->CheckExternalPack(pack_id, pack_length, &chunks);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

}  // namespace
}  // namespace ckptfs
