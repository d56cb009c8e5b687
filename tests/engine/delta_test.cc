// Deltas between versions: real consecutive torch checkpoints (tests/engine/delta_versions.py)
// stored each against the previous one. They read back bitwise (also after reopening), the
// delta chain bound holds, releasing middle versions and collecting garbage keeps the later
// ones readable, and malformed checkpoints are stored as opaque bytes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>

#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

// Writes n consecutive checkpoints into dir; false when torch is missing.
bool MakeVersions(const std::filesystem::path& dir, int n) {
  if (!std::filesystem::exists("/usr/bin/python3")) return false;
  std::string cmd = "/usr/bin/python3 " CKPTFS_SOURCE_DIR "/tests/engine/delta_versions.py ";
  cmd += dir.string();
  cmd += ' ';
  cmd += std::to_string(n);
  return std::system(cmd.c_str()) == 0;
}

// The versions every DeltaTest uses: generated once per content of delta_versions.py (which is
// deterministic) into the build tree, and shared by the tests' processes (ctest runs each test
// in its own; starting torch takes ~1.8 s). Generated into a fresh directory beside it and
// renamed into place, so that processes starting at once never see a partial set (the loser of
// the rename uses the winner's). Null where torch is missing.
std::optional<std::filesystem::path> SharedVersions(int n) {
  const ChunkId key =
      ChunkId::Of(Bytes(ReadFileBytes(CKPTFS_SOURCE_DIR "/tests/engine/delta_versions.py")));
  const std::filesystem::path root = CKPTFS_TEST_CACHE_DIR;
  const std::filesystem::path dir = root / (key.ShortHex() + "-" + std::to_string(n));
  if (std::filesystem::exists(dir / "complete")) return dir;
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  std::string fresh = (root / "new-XXXXXX").string();
  if (::mkdtemp(fresh.data()) == nullptr) return std::nullopt;
  if (MakeVersions(fresh, n)) {
    std::ofstream(std::filesystem::path(fresh) / "complete") << "done\n";
    std::filesystem::rename(fresh, dir, ec);  // fails where another process got there first
  }
  std::filesystem::remove_all(fresh, ec);
  if (!std::filesystem::exists(dir / "complete")) return std::nullopt;
  return dir;
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
                                          const std::vector<std::vector<std::byte>>& files,
                                          bool encode_at_write = false) {
  std::vector<ContentId> ids;
  for (size_t v = 0; v < files.size(); ++v) {
    auto writer = store.NewWriter();
    if (encode_at_write) writer->EncodeAtWrite();
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

// Stores `file` as one new content, with `previous` (if any) as its reference.
Result<ContentId> StoreVersion(Store& store, std::optional<ContentId> previous,
                               const std::vector<std::byte>& file) {
  auto writer = store.NewWriter();
  if (previous) CKPTFS_RETURN_IF_ERROR(writer->SetReference(*previous));
  CKPTFS_RETURN_IF_ERROR(writer->Append(Bytes(file)));
  return writer->Finish();
}

// Forward deltas unless `reverse` (the re-encoder runs behind the writer: tests of the forward
// chains would race with it).
StoreOptions DeltaOptions(uint32_t chain, bool reverse = false) {
  StoreOptions o = TestOptions();
  o.codec = *CodecSpec::Parse("zstd:3");
  o.max_delta_chain = chain;
  o.reverse_deltas = reverse;
  return o;
}

class DeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<std::filesystem::path> versions = SharedVersions(kVersions);
    if (!versions) GTEST_SKIP() << "needs /usr/bin/python3 with torch";
    files_ = LoadVersions(*versions, kVersions);
  }
  // The record bytes of each of `files` stored as a chain into a fresh store with `options`,
  // once its re-encoder caught up; and how many records that store read.
  static void RecordBytesOf(const StoreOptions& options,
                            const std::vector<std::vector<std::byte>>& files,
                            std::vector<uint64_t>* record_bytes, uint64_t* pack_reads = nullptr) {
    TempDir dir{"delta-reference-store"};
    auto store = OpenStore(dir.path(), options);
    ASSERT_TRUE(store);
    ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, files));
    store->WaitReencoded();
    if (pack_reads) *pack_reads = store->pack_reads();
    for (ContentId id : ids) {
      ASSERT_OK_AND_ASSIGN(ContentEncoding e, store->DescribeContent(id));
      record_bytes->push_back(e.record_bytes);
    }
  }
  // The record bytes of each version in a store that encodes every piece as it is written
  // (compress_behind off), once its re-encoder caught up.
  void RecordBytesEncodedAtWrite(std::vector<uint64_t>* record_bytes) {
    StoreOptions at_write = DeltaOptions(8, /*reverse=*/true);
    at_write.compress_behind = false;
    RecordBytesOf(at_write, files_, record_bytes);
  }
  // Each version's records are `expected` (record bytes per version) and read back bitwise.
  void ExpectRecordsAndContent(Store& store, const std::vector<ContentId>& ids,
                               const std::vector<uint64_t>& expected) {
    for (size_t v = 0; v < ids.size(); ++v) {
      ASSERT_OK_AND_ASSIGN(ContentEncoding e, store.DescribeContent(ids[v]));
      EXPECT_EQ(e.record_bytes, expected[v]) << "version " << v;
      EXPECT_TRUE(ContentEquals(store, ids[v], files_[v])) << "version " << v;
    }
  }
  // Every version's records are smaller than its bytes: encoded as written (checked before the
  // re-encoder runs).
  static void ExpectEveryVersionEncoded(const Store& store, const std::vector<ContentId>& ids) {
    for (size_t v = 0; v < ids.size(); ++v) {
      ASSERT_OK_AND_ASSIGN(ContentEncoding e, store.DescribeContent(ids[v]));
      EXPECT_LT(e.record_bytes, e.raw_bytes) << "version " << v << " encoded as written";
    }
  }
  static constexpr int kVersions = 7;
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

// Reverse deltas (engine/store/reencode.cc): once the re-encoder has caught up, the newest
// version decodes one record per piece, the oldest (an anchor) one too, the ones between
// through reverse chains within the bound; all read back bitwise, also after reopening and
// after middle versions are deleted; the store is about as large as with forward deltas.
uint32_t NewestDepth(Store& store, ContentId id) {
  auto e = store.DescribeContent(id);
  return e.ok() ? e->max_depth : 0;
}

// Holds the re-encoder before it commits its `hold_at`-th batch (and any later one) until
// Release(): what a test sees between the writer's commit and the re-encoder's. Declare it
// before the store it is installed in. A hold ends by itself after 60 s, so that a test that
// fails while it holds does not hang in the store's destructor.
class ReencoderGate {
 public:
  explicit ReencoderGate(int hold_at) : hold_at_(hold_at) {}
  void Install(StoreOptions* options) {
    options->before_reencode_commit = [this] {
      std::unique_lock lock(mu_);
      if (++calls_ < hold_at_) return;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(60), [&] { return released_; });
    };
  }
  // Whether the re-encoder reached the held batch within 60 s.
  bool WaitHeld() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return calls_ >= hold_at_; });
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  const int hold_at_;
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  bool released_ = false;
};

// Reverse deltas; the writer encodes every piece whole (no compress-behind), and the
// re-encoder takes one batch per version, calling `gate`'s hook before each commit.
StoreOptions WriterEncodesOneBatchPerVersion(ReencoderGate* gate) {
  StoreOptions options = DeltaOptions(8, /*reverse=*/true);
  options.compress_behind = false;
  options.reencode_batch_bytes = 1u << 30;
  gate->Install(&options);
  return options;
}

TEST_F(DeltaTest, ReverseDeltasReadTheNewestVersionInOneRecordPerPiece) {
  StoreOptions forward_options = DeltaOptions(8);
  uint64_t forward_bytes = 0;
  {
    TempDir forward_dir{"delta-forward"};
    auto forward = OpenStore(forward_dir.path(), forward_options);
    ASSERT_TRUE(forward);
    ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*forward, files_));
    EXPECT_GT(NewestDepth(*forward, ids.back()), 1u) << "forward: the newest is a chain";
    ASSERT_OK_AND_ASSIGN(StoreStats st, forward->Stats());
    forward_bytes = st.pack_bytes;
  }
  std::vector<ContentId> ids;
  {
    auto store = OpenStore(dir_.path(), DeltaOptions(8, /*reverse=*/true));
    ASSERT_TRUE(store);
    ASSERT_OK_AND_ASSIGN(ids, StoreChain(*store, files_));
    store->WaitReencoded();
    EXPECT_GT(store->pieces_reencoded(), 0u);
    EXPECT_EQ(NewestDepth(*store, ids.back()), 1u) << "the newest version: one record per piece";
    EXPECT_EQ(NewestDepth(*store, ids.front()), 1u) << "the oldest version stays whole";
    for (int v = 1; v + 1 < kVersions; ++v) {
      EXPECT_GT(NewestDepth(*store, ids[v]), 1u) << "version " << v << " is a reverse delta";
      EXPECT_LE(NewestDepth(*store, ids[v]), 8u);
    }
    ASSERT_OK_AND_ASSIGN(StoreStats st, store->Stats());
    std::printf("pack bytes: forward deltas %llu, reverse deltas %llu (%.3f)\n",
                static_cast<unsigned long long>(forward_bytes),
                static_cast<unsigned long long>(st.pack_bytes),
                static_cast<double>(st.pack_bytes) / static_cast<double>(forward_bytes));
    // Reverse costs one more whole piece per changed piece (the oldest version's anchor next
    // to the newest), less what the swaps gain; the swapped records are punched out at once.
    EXPECT_LE(st.pack_bytes, forward_bytes + files_[0].size());
    for (int v = 0; v < kVersions; ++v) {
      EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
    }
    EXPECT_TRUE(VerifyClean(*store));
  }
  auto store = OpenStore(dir_.path(), DeltaOptions(8, /*reverse=*/true));
  ASSERT_TRUE(store);
  for (int v = 0; v < kVersions; ++v) {  // cold, oldest first: chains decode from the newest
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
    EXPECT_TRUE(RandomReadsMatch(*store, ids[v], files_[v], v, 30));
  }
  // Deleting middle versions (their chunks are links of the reverse chains) and collecting
  // garbage keeps the others readable.
  for (int v : {2, 3}) ASSERT_OK(store->Release(ids[v]));
  ASSERT_OK(store->Gc(GcOptions{.rewrite_below = 0.99}).status());
  for (int v : {0, 1, 4, 5, 6}) EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << v;
  EXPECT_TRUE(VerifyClean(*store));
}

// gc forgets a dropped chunk's mark as promoted (made whole by the re-encoder): the same bytes
// stored again later as a first version are an anchor, which stays whole, not a piece to
// re-encode against the next version.
TEST_F(DeltaTest, AChunkStoredAgainAfterGcAsAFirstVersionStaysWhole) {
  auto store = OpenStore(dir_.path(), DeltaOptions(8, /*reverse=*/true));
  ASSERT_TRUE(store);
  {
    ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, {files_[0], files_[1]}));
    store->WaitReencoded();  // version 1's pieces are promoted now
    for (ContentId id : ids) ASSERT_OK(store->Release(id));
    ASSERT_OK(store->Gc(GcOptions{}).status());
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> again, StoreChain(*store, {files_[1], files_[2]}));
  store->WaitReencoded();
  EXPECT_EQ(NewestDepth(*store, again[0]), 1u) << "a first version is an anchor";
  EXPECT_EQ(NewestDepth(*store, again[1]), 1u);
  for (int v = 0; v < 2; ++v) EXPECT_TRUE(ContentEquals(*store, again[v], files_[v + 1])) << v;
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, WithReverseDeltasTheWriterStoresWholeAndTheReencoderOnlyTheBase) {
  // A forward delta against a whole base would only be decoded and replaced by the
  // re-encoder: the writer stores the piece whole, and the re-encoder makes the base (the
  // version before) a delta against it. Seen between the writer's commit and the re-encoder's.
  ReencoderGate gate(/*hold_at=*/2);  // version 1 against the anchor: let it through
  auto store = OpenStore(dir_.path(), WriterEncodesOneBatchPerVersion(&gate));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids,
                       StoreChain(*store, {files_[0], files_[1], files_[2]}));
  ASSERT_TRUE(gate.WaitHeld());
  // The re-encoder holds version 2's batch: every version is whole, none was a delta.
  for (int v = 0; v < 3; ++v) EXPECT_EQ(NewestDepth(*store, ids[v]), 1u) << "version " << v;
  gate.Release();
  store->WaitReencoded();
  EXPECT_EQ(NewestDepth(*store, ids[0]), 1u) << "the anchor stays whole";
  EXPECT_EQ(NewestDepth(*store, ids[1]), 2u) << "a delta against version 2";
  EXPECT_EQ(NewestDepth(*store, ids[2]), 1u) << "the newest stays whole";
  for (int v = 0; v < 3; ++v) EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << v;
  EXPECT_TRUE(VerifyClean(*store));
  store.reset();
  auto reopened = OpenStore(dir_.path(), DeltaOptions(8, /*reverse=*/true));
  ASSERT_TRUE(reopened);
  for (int v = 0; v < 3; ++v) EXPECT_TRUE(ContentEquals(*reopened, ids[v], files_[v])) << v;
}

// gc between the re-encoder's appends and its commit: the new records are in no row yet and
// in no writer's pin, and a commit by another writer has raised their pack's committed length
// past them. gc must neither punch them nor rewrite (and delete) their pack, or the commit
// would point rows at nothing.
TEST_F(DeltaTest, GcWhileTheReencoderCommitsLeavesItsNewRecordsAlone) {
  ReencoderGate gate(/*hold_at=*/2);  // version 1 against the anchor: let it through
  auto store = OpenStore(dir_.path(), WriterEncodesOneBatchPerVersion(&gate));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids,
                       StoreChain(*store, {files_[0], files_[1], files_[2]}));
  ASSERT_TRUE(gate.WaitHeld());  // version 1's deltas against version 2 appended, not committed
  // Bytes no delta replaces, committed into the same pack as those deltas, after them.
  const std::vector<std::byte> other = PatternBytes(7, 0, 3u << 20);
  ASSERT_OK_AND_ASSIGN(ContentId other_id, WriteContent(*store, other));
  ASSERT_OK(store->Gc(GcOptions{.rewrite_below = 0.99}).status());
  gate.Release();
  store->WaitReencoded();
  EXPECT_GT(NewestDepth(*store, ids[1]), 1u) << "version 1 became a delta";
  for (int v = 0; v < 3; ++v) EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << v;
  EXPECT_TRUE(ContentEquals(*store, other_id, other));
  EXPECT_TRUE(VerifyClean(*store));
  ASSERT_OK(store->Gc(GcOptions{.rewrite_below = 0.99}).status());  // and after a later gc
  for (int v = 0; v < 3; ++v) EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << v;
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, TheReencoderReadsNoRecordItHasNoUseForOrFindsInTheCache) {
  // Version 1's pieces against the anchor (version 0) have nothing to re-encode: the writer
  // stored them whole and the anchor stays whole. Version 2's bases (version 1's pieces) and
  // its own pieces are in the cache, where the writer put them as delta bases. So the
  // re-encoder reads no record, and the store ends as one that decodes everything.
  StoreOptions options = DeltaOptions(8, /*reverse=*/true);
  options.compress_behind = false;  // pieces encoded by the writer: no compression behind it
  options.cache_bytes = StoreOptions().cache_bytes;  // the default: three versions fit
  auto store = OpenStore(dir_.path(), options);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids,
                       StoreChain(*store, {files_[0], files_[1], files_[2]}));
  store->WaitReencoded();
  EXPECT_EQ(store->pack_reads(), 0u);
  EXPECT_GT(store->pieces_reencoded(), 0u);
  EXPECT_EQ(NewestDepth(*store, ids[0]), 1u) << "the anchor stays whole";
  EXPECT_EQ(NewestDepth(*store, ids[1]), 2u) << "a delta against version 2";
  EXPECT_EQ(NewestDepth(*store, ids[2]), 1u) << "the newest stays whole";
  std::vector<uint64_t> expected;  // what the same writes leave where nothing was cached
  uint64_t uncached_reads = 0;
  StoreOptions uncached = options;
  uncached.cache_bytes = 0;
  ASSERT_NO_FATAL_FAILURE(
      RecordBytesOf(uncached, {files_[0], files_[1], files_[2]}, &expected, &uncached_reads));
  EXPECT_GT(uncached_reads, 0u) << "without a cache the bases are read";
  ASSERT_NO_FATAL_FAILURE(ExpectRecordsAndContent(*store, ids, expected));
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, CompressingBehindTheVersionAfterAnAnchorReadsNothingOfTheAnchor) {
  // The default: version 1's pieces are written raw and compressed by the re-encoder; their
  // bases (version 0's pieces) stay whole as anchors, so their bytes are not needed. The
  // re-encoder reads one record per new piece of version 1 that is not in the cache (the
  // writer caches tensor pieces, not the zip's other bytes), and none of version 0.
  StoreOptions options = DeltaOptions(8, /*reverse=*/true);
  options.compress_behind_min_bytes = 0;  // these test files' pieces are small
  options.cache_bytes = StoreOptions().cache_bytes;
  auto store = OpenStore(dir_.path(), options);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> first, StoreChain(*store, {files_[0]}));
  store->WaitReencoded();
  const uint64_t reads = store->pack_reads();
  ASSERT_OK_AND_ASSIGN(ContentId second, StoreVersion(*store, first[0], files_[1]));
  store->WaitReencoded();
  const uint64_t reencoder_reads = store->pack_reads() - reads;
  std::set<ChunkId> old_ids, uncached_new;
  {
    ASSERT_OK_AND_ASSIGN(auto txn, store->catalog().BeginRead());
    ASSERT_OK(txn.ForEachChunkRef(first[0], 0, [&](const ChunkRef& ref) {
      old_ids.insert(ref.id);
      return true;
    }));
    ASSERT_OK(txn.ForEachChunkRef(second, 0, [&](const ChunkRef& ref) {
      if (old_ids.count(ref.id) == 0 && !store->Cached(ref.id)) uncached_new.insert(ref.id);
      return true;
    }));
  }
  EXPECT_EQ(reencoder_reads, uncached_new.size());
  ASSERT_OK_AND_ASSIGN(ContentEncoding e, store->DescribeContent(second));
  EXPECT_LT(e.record_bytes, e.raw_bytes) << "compressed behind the writer";
  EXPECT_TRUE(ContentEquals(*store, first[0], files_[0]));
  EXPECT_TRUE(ContentEquals(*store, second, files_[1]));
}

TEST_F(DeltaTest, OnlyPiecesOfAFileWithAPredecessorAreCachedAsDeltaBases) {
  // A first version's pieces would be the next version's bases only for a comparison the
  // writer can do with a hash, and the re-encoder does not need them (the anchor stays whole):
  // caching them would only grow the daemon's heap. A later version's pieces are cached.
  StoreOptions options = DeltaOptions(8, /*reverse=*/true);
  options.cache_bytes = StoreOptions().cache_bytes;
  auto store = OpenStore(dir_.path(), options);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> first, StoreChain(*store, {files_[0]}));
  store->WaitReencoded();
  EXPECT_EQ(store->cache_bytes(), 0u);
  ASSERT_OK_AND_ASSIGN(ContentId second, StoreVersion(*store, first[0], files_[1]));
  store->WaitReencoded();
  EXPECT_GT(store->cache_bytes(), files_[1].size() / 2);
  EXPECT_TRUE(ContentEquals(*store, first[0], files_[0]));
  EXPECT_TRUE(ContentEquals(*store, second, files_[1]));
}

TEST_F(DeltaTest, CompressBehindWritesRawPiecesThatTheReencoderCompresses) {
  // The default: the writer stores every whole piece raw, so a save pays no encoding, and the
  // re-encoder compresses the pieces behind it. Once it caught up, the store holds what a
  // writer that encodes as it writes leaves, record for record.
  std::vector<uint64_t> expected;  // record bytes per version, encoded at write
  ASSERT_NO_FATAL_FAILURE(RecordBytesEncodedAtWrite(&expected));
  StoreOptions options = DeltaOptions(8, /*reverse=*/true);
  ASSERT_TRUE(options.compress_behind) << "the default";
  options.compress_behind_min_bytes = 0;    // these test files' pieces are small
  options.reencode_batch_bytes = 1u << 30;  // one batch, one hook call per version
  ReencoderGate gate(/*hold_at=*/1);        // holds the first version's compression
  gate.Install(&options);
  auto store = OpenStore(dir_.path(), options);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, files_));
  ASSERT_TRUE(gate.WaitHeld());
  // Before the re-encoder: every version as written, raw, and readable.
  for (int v = 0; v < kVersions; ++v) {
    ASSERT_OK_AND_ASSIGN(ContentEncoding e, store->DescribeContent(ids[v]));
    EXPECT_GE(e.record_bytes, e.raw_bytes) << "version " << v << " written raw";
    EXPECT_EQ(e.max_depth, 1u) << "version " << v << " whole";
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
  }
  gate.Release();
  store->WaitReencoded();
  for (int v = 0; v < kVersions; ++v) {
    ASSERT_OK_AND_ASSIGN(ContentEncoding e, store->DescribeContent(ids[v]));
    EXPECT_EQ(e.record_bytes, expected[v]) << "version " << v;
    EXPECT_LT(e.record_bytes, e.raw_bytes) << "version " << v;
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
  }
  EXPECT_EQ(NewestDepth(*store, ids.back()), 1u) << "the newest stays whole";
  EXPECT_TRUE(VerifyClean(*store));
  store.reset();
  auto reopened = OpenStore(dir_.path(), DeltaOptions(8, /*reverse=*/true));
  ASSERT_TRUE(reopened);
  for (int v = 0; v < kVersions; ++v) EXPECT_TRUE(ContentEquals(*reopened, ids[v], files_[v]));
}

TEST_F(DeltaTest, AVersionWhoseBaseAnotherWriterPinsStillBecomesADelta) {
  // Two writers continue version 0 at once (two files saved against the same predecessor):
  // the second still pins version 0's pieces as its delta bases when the re-encoder takes
  // version 1. Version 0's anchors stay whole either way; version 1's pieces must still become
  // deltas of version 2's once it comes, and not stay whole for good.
  auto store = OpenStore(dir_.path(), DeltaOptions(8, /*reverse=*/true));
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(ContentId v0, StoreVersion(*store, std::nullopt, files_[0]));
  store->WaitReencoded();
  auto other = store->NewWriter();
  ASSERT_OK(other->SetReference(v0));
  ASSERT_OK(other->Append(Bytes(files_[2])));
  std::byte first;
  ASSERT_OK(other->ReadBack(0, MutableBytes(&first, 1)).status());  // its pieces are pinned
  ASSERT_OK_AND_ASSIGN(ContentId v1, StoreVersion(*store, v0, files_[1]));
  store->WaitReencoded();
  other.reset();  // abandoned, as by an rm while it was written
  ASSERT_OK_AND_ASSIGN(ContentId v2, StoreVersion(*store, v1, files_[2]));
  store->WaitReencoded();
  EXPECT_GT(NewestDepth(*store, v1), 1u) << "version 1 is a delta of version 2";
  EXPECT_EQ(NewestDepth(*store, v2), 1u);
  EXPECT_TRUE(ContentEquals(*store, v0, files_[0]));
  EXPECT_TRUE(ContentEquals(*store, v1, files_[1]));
  EXPECT_TRUE(ContentEquals(*store, v2, files_[2]));
  EXPECT_TRUE(VerifyClean(*store));
}

// The re-encoder overlaps its batches (one batch's records sync while the next encodes, and
// it commits after): a version re-encoded in many small batches ends where one batch per
// version ends, record for record, and reads back bitwise.
TEST_F(DeltaTest, ManySmallReencoderBatchesStoreWhatOneBatchStores) {
  auto run = [&](const std::filesystem::path& dir, uint64_t batch_bytes,
                 std::vector<uint64_t>* record_bytes, uint64_t* batches) {
    StoreOptions options = DeltaOptions(8, /*reverse=*/true);
    options.compress_behind_min_bytes = 0;  // these test files' pieces are small
    options.reencode_batch_bytes = batch_bytes;
    auto store = OpenStore(dir, options);
    ASSERT_TRUE(store);
    std::vector<ContentId> ids;
    for (const auto& file : files_) {  // one version at a time: the same states either way
      std::optional<ContentId> previous;
      if (!ids.empty()) previous = ids.back();
      ASSERT_OK_AND_ASSIGN(ContentId id, StoreVersion(*store, previous, file));
      ids.push_back(id);
      store->WaitReencoded();
    }
    for (int v = 0; v < kVersions; ++v) {
      ASSERT_OK_AND_ASSIGN(ContentEncoding e, store->DescribeContent(ids[v]));
      record_bytes->push_back(e.record_bytes);
      EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
    }
    EXPECT_EQ(NewestDepth(*store, ids.back()), 1u) << "the newest stays whole";
    EXPECT_GT(NewestDepth(*store, ids[kVersions - 2]), 1u) << "the one before is a delta";
    EXPECT_TRUE(VerifyClean(*store));
    *batches = store->reencode_batches();
  };
  std::vector<uint64_t> one, many;
  uint64_t one_batches = 0, many_batches = 0;
  TempDir one_dir{"delta-one-batch"};
  run(one_dir.path(), 1u << 30, &one, &one_batches);
  run(dir_.path(), 64u << 10, &many, &many_batches);
  EXPECT_GT(many_batches, 2 * one_batches) << "small batches: several per version";
  EXPECT_EQ(many, one);
}

// Records die in groups: raw pieces once compressed, a version's whole pieces once the next
// version makes them deltas. The pack lanes keep each group together (deltas, which nothing
// replaces, apart; a reopened store goes on in each lane's pack) and a punch frees the blocks a
// dead range shares with ranges that died before it, so once every version is re-encoded no
// allocated block of a pack is without a live record (or the pack's header), but for the
// block each lane appends to next.
TEST_F(DeltaTest, ReplacedRecordsLeaveNoBlockWithoutALiveRecord) {
  for (bool compress_behind : {true, false}) {
    SCOPED_TRACE(compress_behind ? "compress behind" : "encoded at write");
    TempDir dir{"delta-punched"};
    StoreOptions options = DeltaOptions(8, /*reverse=*/true);
    options.compress_behind = compress_behind;
    options.compress_behind_min_bytes = 0;  // these test files' pieces are small
    auto store = OpenStore(dir.path(), options);
    ASSERT_TRUE(store);
    std::optional<ContentId> previous;
    auto pack_files = [&] {
      return std::distance(std::filesystem::directory_iterator(dir.path() / "packs"),
                           std::filesystem::directory_iterator());
    };
    for (size_t v = 0; v < files_.size(); ++v) {
      if (v == files_.size() / 2) {
        // Reopened, each lane goes on appending to its pack: no new pack file.
        const auto packs = pack_files();
        EXPECT_EQ(store->ActivePacks().size(), compress_behind ? 3u : 2u) << "lanes in use";
        store.reset();
        store = OpenStore(dir.path(), options);
        ASSERT_TRUE(store);
        EXPECT_EQ(store->ActivePacks().size(), compress_behind ? 3u : 2u) << "lanes resumed";
        ASSERT_OK_AND_ASSIGN(ContentId id, StoreVersion(*store, previous, files_[v]));
        store->WaitReencoded();
        EXPECT_EQ(pack_files(), packs);
        previous = id;
        continue;
      }
      ASSERT_OK_AND_ASSIGN(ContentId id, StoreVersion(*store, previous, files_[v]));
      previous = id;
      store->WaitReencoded();
    }
    std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> live;  // pack -> [from, to)
    {
      ASSERT_OK_AND_ASSIGN(auto txn, store->catalog().BeginRead());
      ASSERT_OK(txn.ForEachChunk([&](const ChunkId&, const ChunkRow& row) {
        live[row.pack_id].emplace_back(row.offset, row.offset + row.length);
        return true;
      }));
    }
    ASSERT_OK_AND_ASSIGN(StoreStats stats, store->Stats());
    EXPECT_GT(stats.chunks_by_transform[static_cast<size_t>(Transform::kSub)] +
                  stats.chunks_by_transform[static_cast<size_t>(Transform::kXor)],
              0u)
        << "versions became deltas";
    // Every delta lies in a pack of the lasting lane (nothing replaces it).
    std::map<uint32_t, PackLane> lanes;
    for (const auto& [pack, ranges] : live) {
      std::byte header[kPackHeaderBytes];
      FileDescriptor fd(::open((dir.path() / "packs" / PackFileName(pack)).c_str(), O_RDONLY));
      ASSERT_OK(PReadFull(fd.get(), 0, {header, kPackHeaderBytes}, "pack"));
      lanes[pack] = PackLaneOf({header, kPackHeaderBytes});
    }
    {
      ASSERT_OK_AND_ASSIGN(auto txn, store->catalog().BeginRead());
      ASSERT_OK(txn.ForEachChunk([&](const ChunkId& id, const ChunkRow& row) {
        if (IsDelta(row.transform)) {
          EXPECT_EQ(lanes[row.pack_id], PackLane::kLasting) << "delta " << id.ShortHex();
        }
        return true;
      }));
    }
    constexpr uint64_t kBlock = 4096;
    // An active pack's last block is where its next record goes: dead or not, it stays.
    std::map<uint32_t, uint64_t> tail;
    for (const auto& [pack, ranges] : live) tail[pack] = UINT64_MAX;
    for (const PackExtent& e : store->ActivePacks()) tail[e.pack_id] = e.length / kBlock * kBlock;
    uint64_t waste_blocks = 0;
    for (auto& [pack, ranges] : live) {
      ranges.emplace_back(0, kPackHeaderBytes);
      std::sort(ranges.begin(), ranges.end());
      const std::filesystem::path path = dir.path() / "packs" / PackFileName(pack);
      FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      ASSERT_TRUE(fd.valid()) << path;
      const off_t size = ::lseek(fd.get(), 0, SEEK_END);
      for (off_t pos = 0; pos < size;) {
        const off_t data = ::lseek(fd.get(), pos, SEEK_DATA);
        if (data < 0) break;
        const off_t hole = ::lseek(fd.get(), data, SEEK_HOLE);
        for (uint64_t block = static_cast<uint64_t>(data) / kBlock * kBlock;
             block < static_cast<uint64_t>(hole); block += kBlock) {
          // The first range ending past the block's start (ranges do not overlap: sorted by
          // their ends too) holds a byte of it if it starts before the block's end.
          auto it = std::partition_point(ranges.begin(), ranges.end(),
                                         [&](const auto& r) { return r.second <= block; });
          if ((it == ranges.end() || it->first >= block + kBlock) && block < tail[pack]) {
            ++waste_blocks;
            ADD_FAILURE() << PackFileName(pack) << ": block at " << block
                          << " is allocated and holds no live record";
            if (waste_blocks > 5) return;
          }
        }
        pos = hole;
      }
    }
    std::printf("pack bytes %llu, live record bytes %llu\n",
                static_cast<unsigned long long>(stats.pack_bytes),
                static_cast<unsigned long long>(stats.record_bytes));
  }
}

TEST_F(DeltaTest, AWriterThatEncodesAtWriteStoresWhatACompressAtWriteStoreStores) {
  // ContentWriter::EncodeAtWrite (the commit of a passthrough file): with compress_behind on,
  // such a writer's pieces are encoded as they are stored, before the re-encoder runs, and the
  // store ends record for record where a store without compress_behind ends.
  std::vector<uint64_t> expected;
  ASSERT_NO_FATAL_FAILURE(RecordBytesEncodedAtWrite(&expected));
  StoreOptions options = DeltaOptions(8, /*reverse=*/true);
  options.compress_behind_min_bytes = 0;  // as in CompressBehindWritesRaw...: every piece
  options.reencode_batch_bytes = 1u << 30;
  ReencoderGate gate(/*hold_at=*/1);
  gate.Install(&options);
  auto store = OpenStore(dir_.path(), options);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids,
                       StoreChain(*store, files_, /*encode_at_write=*/true));
  ASSERT_TRUE(gate.WaitHeld());
  ASSERT_NO_FATAL_FAILURE(ExpectEveryVersionEncoded(*store, ids));
  gate.Release();
  store->WaitReencoded();
  ASSERT_NO_FATAL_FAILURE(ExpectRecordsAndContent(*store, ids, expected));
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, PiecesBelowTheCompressBehindMinimumAreEncodedAsWritten) {
  // Small pieces are encoded by the writer even with compress_behind: before the re-encoder
  // runs, the first version is already compressed (and the re-encoder does not queue it).
  StoreOptions options = DeltaOptions(8, /*reverse=*/true);
  options.compress_behind_min_bytes = 1u << 30;  // above every piece here
  options.reencode_batch_bytes = 1u << 30;
  ReencoderGate gate(/*hold_at=*/1);
  gate.Install(&options);
  auto store = OpenStore(dir_.path(), options);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, files_));
  ASSERT_TRUE(gate.WaitHeld());
  ASSERT_NO_FATAL_FAILURE(ExpectEveryVersionEncoded(*store, ids));
  gate.Release();
  store->WaitReencoded();
  for (int v = 0; v < kVersions; ++v) {
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
  }
  EXPECT_TRUE(VerifyClean(*store));
}

TEST_F(DeltaTest, ReverseChainBoundHolds) {
  constexpr uint32_t kChain = 3;
  // Small batches: several catalog transactions per version, which must keep the chain
  // depths they learnt from one scan of the chunk rows exact from batch to batch.
  StoreOptions options = DeltaOptions(kChain, /*reverse=*/true);
  options.reencode_batch_bytes = 256 << 10;
  auto store = OpenStore(dir_.path(), options);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(std::vector<ContentId> ids, StoreChain(*store, files_));
  store->WaitReencoded();
  EXPECT_GT(store->reencode_batches(), 2 * store->reencode_scans())
      << "batches after the first of a version reuse its scan";
  for (int v = 0; v < kVersions; ++v) {
    EXPECT_LE(NewestDepth(*store, ids[v]), kChain) << "version " << v;
    EXPECT_TRUE(ContentEquals(*store, ids[v], files_[v])) << "version " << v;
  }
  EXPECT_EQ(NewestDepth(*store, ids.back()), 1u);
  ASSERT_OK_AND_ASSIGN(StoreStats st, store->Stats());
  EXPECT_LE(st.max_depth, kChain);
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
