// Deltas between versions: real consecutive torch checkpoints (tests/engine/delta_versions.py)
// stored each against the previous one. They read back bitwise (also after reopening), the
// delta chain bound holds, releasing middle versions and collecting garbage keeps the later
// ones readable, and malformed checkpoints are stored as opaque bytes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

// Writes n consecutive checkpoints into dir; false (and a skip message) when torch is missing.
bool MakeVersions(const std::filesystem::path& dir, int n, const std::string& extra = "") {
  if (!std::filesystem::exists("/usr/bin/python3")) return false;
  std::string cmd = "/usr/bin/python3 " CKPTFS_SOURCE_DIR "/tests/engine/delta_versions.py ";
  cmd += dir.string();
  cmd += ' ';
  cmd += std::to_string(n);
  cmd += ' ';
  cmd += extra;
  return std::system(cmd.c_str()) == 0;
}

std::vector<std::vector<std::byte>> LoadVersions(const std::filesystem::path& dir, int n) {
  std::vector<std::vector<std::byte>> files;
  for (int v = 0; v < n; ++v) {
    char name[32];
    std::snprintf(name, sizeof(name), "v%d.pt", v);
    files.push_back(ReadFileBytes(dir / name));
  }
  return files;
}

// Stores each file with the previous one as its reference.
Result<std::vector<ContentId>> StoreChain(Store& store,
                                          const std::vector<std::vector<std::byte>>& files) {
  std::vector<ContentId> ids;
  for (size_t v = 0; v < files.size(); ++v) {
    auto writer = store.NewWriter();
    if (v > 0) CKPTFS_RETURN_IF_ERROR(writer->SetReference(ids.back()));
    Bytes rest(files[v]);
    std::mt19937 rng(static_cast<uint32_t>(v));
    while (!rest.empty()) {  // odd-sized writes, as a FUSE client makes them
      size_t n = std::min<size_t>(rest.size(), 1 + rng() % (300 << 10));
      CKPTFS_RETURN_IF_ERROR(writer->Append(rest.first(n)));
      rest = rest.subspan(n);
    }
    CKPTFS_ASSIGN_OR_RETURN(ContentId id, writer->Finish());
    ids.push_back(id);
  }
  return ids;
}

StoreOptions DeltaOptions(uint32_t chain) {
  StoreOptions o = TestOptions();
  o.codec = *CodecSpec::Parse("zstd:3");
  o.max_delta_chain = chain;
  return o;
}

class DeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!MakeVersions(data_.path(), kVersions)) GTEST_SKIP() << "needs /usr/bin/python3 with torch";
    files_ = LoadVersions(data_.path(), kVersions);
  }
  static constexpr int kVersions = 7;
  TempDir data_{"delta-data"};
  TempDir dir_{"delta-store"};
  std::vector<std::vector<std::byte>> files_;
};

TEST_F(DeltaTest, EveryVersionReadsBackBitwiseAfterDeltasAlsoAfterReopen) {
  std::vector<ContentId> ids;
  {
    auto store = OpenStore(dir_.path(), DeltaOptions(8));
    ASSERT_TRUE(store);
    ASSERT_OK_AND_ASSIGN(ids, StoreChain(*store, files_));
    for (int v = 0; v < kVersions; ++v) {
      EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
      ASSERT_OK_AND_ASSIGN(ContentEncoding e, store->DescribeContent(ids[v]));
      const uint64_t deltas = e.chunks_by_transform[static_cast<int>(Transform::kXor)] +
                              e.chunks_by_transform[static_cast<int>(Transform::kSub)];
      if (v == 0) {
        EXPECT_EQ(deltas, 0u);
        EXPECT_GT(e.chunks_by_transform[static_cast<int>(Transform::kPlanes)], 0u)
            << "fp32 tensors are stored as byte planes";
      } else {
        EXPECT_GT(deltas, 0u) << "version " << v << " changed tensors are deltas";
      }
    }
    // The layout was learned from the zip and data.pkl: float32 storages.
    ASSERT_OK_AND_ASSIGN(std::optional<ContentLayout> layout, store->GetLayout(ids[1]));
    ASSERT_TRUE(layout);
    EXPECT_EQ(layout->format, ContentLayout::Format::kTorchZip);
    int typed = 0;
    for (const LayoutSection& s : layout->sections) typed += s.dtype == DType::kF32;
    EXPECT_GT(typed, 10);
  }
  auto store = OpenStore(dir_.path(), DeltaOptions(8));
  ASSERT_TRUE(store);
  for (int v = kVersions - 1; v >= 0; --v) {  // newest first: deltas decode their bases cold
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
    EXPECT_TRUE(RandomReadsMatch(*store, ids[v], files_[v], v, 50));
  }
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, ChainBoundHolds) {
  constexpr uint32_t kChain = 3;
  auto store = OpenStore(dir_.path(), DeltaOptions(kChain));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, files_));
  uint32_t deepest = 0;
  for (int v = 0; v < kVersions; ++v) {
    ASSERT_OK_AND_ASSIGN(ContentEncoding e, store->DescribeContent(ids[v]));
    EXPECT_LE(e.max_depth, kChain) << "version " << v;
    deepest = std::max(deepest, e.max_depth);
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
  }
  EXPECT_EQ(deepest, kChain) << "the bound was reached, so a full record came after it";
  ASSERT_OK_AND_ASSIGN(StoreStats st, store->Stats());
  EXPECT_LE(st.max_depth, kChain);
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, DeletingMiddleVersionsKeepsLaterOnesReadable) {
  auto store = OpenStore(dir_.path(), DeltaOptions(8));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, files_));
  for (int v : {1, 2, 3}) ASSERT_OK(store->Release(ids[v]));
  ASSERT_OK_AND_ASSIGN(GcReport report, store->Gc(GcOptions{.rewrite_below = 0.99}));
  EXPECT_GT(report.deltas_rematerialized, 0u) << "version 4's deltas lost their bases";
  for (int v : {0, 4, 5, 6}) EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << v;
  EXPECT_TRUE(VerifyClean(*store));

  // Only the newest left: its whole chain stays, and goes with it.
  for (int v : {0, 4, 5}) ASSERT_OK(store->Release(ids[v]));
  ASSERT_OK(store->Gc(GcOptions{.rewrite_below = 0.99}).status());
  EXPECT_TRUE(ContentEquals(*store, ids[6], files_[6]));
  EXPECT_TRUE(VerifyClean(*store));
  ASSERT_OK(store->Release(ids[6]));
  ASSERT_OK(store->Gc().status());
  ASSERT_OK_AND_ASSIGN(StoreStats st, store->Stats());
  EXPECT_EQ(st.chunks, 0u);
  ASSERT_OK_AND_ASSIGN(auto txn, store->catalog().BeginRead());
  uint64_t rows = 0;
  ASSERT_OK(txn.ForEachChunk([&](const ChunkId&, const ChunkRow&) { return ++rows, true; }));
  EXPECT_EQ(rows, 0u) << "bases are dropped once their last delta is";
}

// Retention (keep the newest two): deleting the old versions frees their chains.
TEST_F(DeltaTest, DeletingOldVersionsFreesTheirChains) {
  auto store = OpenStore(dir_.path(), DeltaOptions(8));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, files_));
  ASSERT_OK_AND_ASSIGN(StoreStats all, store->Stats());
  for (int v = 0; v < kVersions - 2; ++v) ASSERT_OK(store->Release(ids[v]));
  ASSERT_OK(store->Gc(GcOptions{.rewrite_below = 0.99}).status());
  ASSERT_OK_AND_ASSIGN(StoreStats kept, store->Stats());
  // What stays is one whole version and one delta: well under the whole chain of seven.
  EXPECT_LT(kept.record_bytes, all.record_bytes / 2);
  EXPECT_LT(kept.pack_bytes, all.pack_bytes / 2);
  for (int v : {kVersions - 2, kVersions - 1}) {
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << v;
  }
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, UnchangedResaveCostsOnlyMetadata) {
  auto store = OpenStore(dir_.path(), DeltaOptions(8));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> first, StoreChain(*store, {files_[2]}));
  ASSERT_OK_AND_ASSIGN(StoreStats before, store->Stats());
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> again, StoreChain(*store, {files_[2]}));
  ASSERT_OK_AND_ASSIGN(StoreStats after, store->Stats());
  EXPECT_EQ(after.record_bytes, before.record_bytes);
  EXPECT_TRUE(ContentEquals(*store, again[0], files_[2]));
}

// The same state saved again as the next version of itself: each unchanged piece equals its
// delta base, which the writer finds in the cache and takes the id of without hashing
// (content_writer.cc, PieceId). The ids must still be the SHA-256 of the bytes (verify
// recomputes them) and nothing new is stored; a changed version next to it hashes as before.
TEST_F(DeltaTest, UnchangedPiecesOfTheNextVersionKeepTheirIds) {
  auto store = OpenStore(dir_.path(), DeltaOptions(8));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> first, StoreChain(*store, {files_[2]}));
  ASSERT_OK_AND_ASSIGN(StoreStats before, store->Stats());
  for (ContentId reference : {first[0], first[0]}) {
    auto writer = store->NewWriter();
    ASSERT_OK(writer->SetReference(reference));
    ASSERT_OK(writer->Append(files_[2]));
    ASSERT_OK_AND_ASSIGN(ContentId again, writer->Finish());
    EXPECT_TRUE(ContentEquals(*store, again, files_[2]));
  }
  ASSERT_OK_AND_ASSIGN(StoreStats after, store->Stats());
  EXPECT_EQ(after.record_bytes, before.record_bytes);
  EXPECT_EQ(after.chunks, before.chunks);
  auto writer = store->NewWriter();
  ASSERT_OK(writer->SetReference(first[0]));
  ASSERT_OK(writer->Append(files_[3]));
  ASSERT_OK_AND_ASSIGN(ContentId changed, writer->Finish());
  EXPECT_TRUE(ContentEquals(*store, changed, files_[3]));
  EXPECT_TRUE(VerifyClean(*store));
}

// A .pt that is not what it claims: truncated, its pickle garbage, its offsets wrong. Each is
// stored and read back as it is.
TEST_F(DeltaTest, MalformedCheckpointsAreStoredAsOpaqueBytes) {
  auto store = OpenStore(dir_.path(), DeltaOptions(8));
  ASSERT_TRUE(store);
  const std::vector<std::byte>& good = files_[0];
  std::vector<std::vector<std::byte>> bad;
  bad.emplace_back(good.begin(), good.begin() + good.size() / 2);  // truncated
  bad.emplace_back(good.begin(), good.begin() + 100);              // inside the first header
  {
    std::vector<std::byte> garbage = good;  // data.pkl's bytes replaced by noise
    std::mt19937 rng(1);
    for (size_t i = 80; i < 600 && i < garbage.size(); ++i) garbage[i] = std::byte(rng());
    bad.push_back(std::move(garbage));
  }
  {
    std::vector<std::byte> wrong = good;  // every local header's name length off by one
    for (size_t i = 0; i + 30 < wrong.size(); ++i) {
      if (wrong[i] == std::byte{'P'} && wrong[i + 1] == std::byte{'K'} &&
          wrong[i + 2] == std::byte{3} && wrong[i + 3] == std::byte{4}) {
        wrong[i + 26] = std::byte(static_cast<uint8_t>(wrong[i + 26]) + 1);
      }
    }
    bad.push_back(std::move(wrong));
  }
  ContentId previous = 0;
  for (size_t i = 0; i < bad.size(); ++i) {
    auto writer = store->NewWriter();
    if (previous != 0) ASSERT_OK(writer->SetReference(previous));
    ASSERT_OK(writer->Append(bad[i]));
    ASSERT_OK_AND_ASSIGN(ContentId id, writer->Finish());
    EXPECT_TRUE(ContentEquals(*store, id, bad[i])) << "malformed file " << i;
    previous = id;
  }
  EXPECT_TRUE(VerifyClean(*store));
}

}  // namespace
}  // namespace ckptfs::testing
