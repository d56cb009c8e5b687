// Unit tests of Store and ContentWriter behaviour that the integration suite (tests/engine/)
// does not cover: caller-defined cuts, the in-flight budget, options, and a full disk.
#include "engine/store/store.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "engine/store/content_writer.h"
#include "engine/util/test_buffers.h"

namespace ckptfs {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_store_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  Store& Open(StoreOptions options = {}) {
    store_.reset();
    auto s = Store::Open(dir_, options);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    return *store_;
  }
  Buffer ReadAll(ContentId id) {
    auto row = store_->StatContent(id);
    EXPECT_TRUE(row.ok());
    Buffer out(row->size);
    auto n = store_->Read(id, 0, out.mutable_bytes());
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return out;
  }
  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, CallerOnlyModeCutsExactlyWhereTold) {
  Store& store = Open();
  Buffer data = RandomBuffer(3 << 20, 1);
  auto w = store.NewWriter();
  w->SetCutMode(ContentWriter::CutMode::kCallerOnly);
  const size_t max = store.options().chunking.max_size;
  // The last piece is longer than a chunk may be: it is cut at max_size.
  const std::vector<size_t> pieces = {100, 64, max / 2, max + 1000};
  size_t off = 0;
  for (size_t n : pieces) {
    ASSERT_TRUE(w->Append(data.bytes().subspan(off, n)).ok());
    ASSERT_TRUE(w->Cut().ok());
    off += n;
  }
  ContentId id = *w->Finish();
  auto txn = *store.catalog().BeginRead();
  std::vector<uint64_t> lengths;
  ASSERT_TRUE(txn.ForEachChunkRef(id, 0,
                                  [&](const ChunkRef& r) {
                                    lengths.push_back(r.length);
                                    return true;
                                  })
                  .ok());
  EXPECT_EQ(lengths, (std::vector<uint64_t>{100, 64, max / 2, max, 1000}));
  Buffer back = ReadAll(id);
  ASSERT_EQ(back.size(), off);
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), off));
}

TEST_F(StoreTest, AppenderContinuesABaseAndLeavesItIntact) {
  Store& store = Open();
  Buffer data = RandomBuffer(7 << 20, 5);
  const size_t split = (3 << 20) + 12345;
  auto w = store.NewWriter();
  ASSERT_TRUE(w->Append(data.bytes().first(split)).ok());
  ContentId base = *w->Finish();
  auto a = *store.NewAppender(base);
  ASSERT_TRUE(a->Append(data.bytes().subspan(split)).ok());
  ContentId whole = *a->Finish();
  Buffer back = ReadAll(whole);
  ASSERT_EQ(back.size(), data.size());
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), data.size()));
  EXPECT_EQ(ReadAll(base).size(), split);
  ASSERT_TRUE(store.Release(base).ok());
  ASSERT_TRUE(store.Gc().ok());
  back = ReadAll(whole);
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), data.size()));
  EXPECT_TRUE(store.Verify()->ok());
}

TEST_F(StoreTest, ReadBackShowsUncommittedBytes) {
  Store& store = Open();
  Buffer data = RandomBuffer(9 << 20, 6);
  auto w = store.NewWriter();
  ASSERT_TRUE(w->Append(data.bytes().first(100)).ok());
  ASSERT_TRUE(w->Append(data.bytes().subspan(100)).ok());
  std::mt19937 rng(1);
  for (int i = 0; i < 50; ++i) {
    uint64_t off = rng() % data.size();
    Buffer out(1 + rng() % (3 << 20));
    auto n = w->ReadBack(off, out.mutable_bytes());
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_EQ(*n, std::min<uint64_t>(out.size(), data.size() - off));
    ASSERT_EQ(0, std::memcmp(out.data(), data.data() + off, *n)) << off;
  }
  ASSERT_TRUE(w->Finish().ok());
}

// Both pack write paths store the same bytes; io_uring is used where the kernel allows it.
TEST_F(StoreTest, PwriteAndIoUringPathsRoundTrip) {
  for (bool uring : {false, true}) {
    StoreOptions options;
    options.use_io_uring = uring;
    options.pack_target_bytes = 4 << 20;  // several packs: rotation under both paths
    Store& store = Open(options);
    if (!uring) {
      EXPECT_FALSE(store.using_io_uring());
    }
    Buffer data = RandomBuffer(12 << 20, uring ? 30 : 31);
    auto w = store.NewWriter();
    ASSERT_TRUE(w->Append(data.bytes()).ok());
    ContentId id = *w->Finish();
    Open(options);  // reopen: recovery keeps what was committed
    Buffer back = ReadAll(id);
    ASSERT_EQ(back.size(), data.size());
    EXPECT_EQ(0, std::memcmp(back.data(), data.data(), data.size())) << "io_uring=" << uring;
    EXPECT_TRUE(store_->Verify()->ok());
  }
}

TEST_F(StoreTest, AbandonedWriterLeavesNothingVisible) {
  Store& store = Open();
  {
    auto w = store.NewWriter();
    Buffer data = RandomBuffer(5 << 20, 2);
    ASSERT_TRUE(w->Append(data.bytes()).ok());
  }
  auto st = store.Stats();
  EXPECT_EQ(st->contents, 0u);
  EXPECT_EQ(st->chunks, 0u);
  ASSERT_TRUE(store.Gc().ok());
  EXPECT_TRUE(store.Verify()->ok());
}

TEST_F(StoreTest, InFlightBytesStayWithinBudget) {
  StoreOptions options;
  options.inflight_bytes = 4 << 20;
  options.worker_threads = 1;
  options.codec = CodecSpec{Codec::kZstd, 19};  // a slow worker: the writer must wait for it
  Store& store = Open(options);
  auto w = store.NewWriter();
  Buffer data = RandomBuffer(16 << 20, 3);
  for (size_t off = 0; off < data.size(); off += 1 << 20) {
    ASSERT_TRUE(w->Append(data.bytes().subspan(off, 1 << 20)).ok());
  }
  ASSERT_TRUE(w->Finish().ok());
  // The writer ran ahead of the single (slow) worker, so the budget filled, and never
  // overflowed: a chunk larger than the rest of the budget waits until the budget is empty.
  EXPECT_GT(store.inflight_peak_bytes(), 2u << 20);
  EXPECT_LE(store.inflight_peak_bytes(),
            std::max<size_t>(4u << 20, store.options().chunking.max_size));
}

TEST_F(StoreTest, SecondOpenOfTheSameStoreIsBusy) {
  Open();
  auto again = Store::Open(dir_, StoreOptions{});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Status::Code::kBusy);
}

TEST_F(StoreTest, NewerFormatIsRefusedWithAClearMessage) {
  Open();
  store_.reset();
  ASSERT_TRUE(WriteFileAtomic(dir_ / "ckptfs.json", R"({"format": 99})").ok());
  auto s = Store::Open(dir_, StoreOptions{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kNotSupported);
  EXPECT_NE(s.status().message().find("upgrade ckptfs"), std::string::npos);
}

// A format change is never silent: an older store opens only with upgrade_format.
TEST_F(StoreTest, OlderFormatOpensOnlyWhenUpgradeIsAsked) {
  Open();
  store_.reset();
  ASSERT_TRUE(WriteFileAtomic(dir_ / "ckptfs.json", R"({"format": 1})").ok());
  auto refused = Store::Open(dir_, StoreOptions{});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kNotSupported);
  EXPECT_NE(refused.status().message().find("ckptfs upgrade"), std::string::npos);
  EXPECT_EQ(*Store::ReadFormat(dir_), 1u);
  StoreOptions upgrade;
  upgrade.upgrade_format = true;
  ASSERT_TRUE(Store::Open(dir_, upgrade).ok());
  EXPECT_EQ(*Store::ReadFormat(dir_), kStoreFormatVersion);
}

TEST_F(StoreTest, MissingStoreIsNotFoundWithoutCreate) {
  StoreOptions options;
  options.create_if_missing = false;
  auto s = Store::Open(dir_, options);
  EXPECT_TRUE(s.status().IsNotFound());
}

// A full disk fails the write with NoSpace and keeps every earlier content readable.
TEST_F(StoreTest, FullDiskFailsTheWriteAndKeepsEarlierContents) {
  std::filesystem::create_directories(dir_);
  if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=24m") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): " << std::strerror(errno);
  }
  struct Unmount {
    std::filesystem::path dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir_};
  const auto store_dir = dir_ / "store";
  StoreOptions options;
  options.codec = CodecSpec{Codec::kNone};
  std::vector<std::pair<ContentId, Buffer>> kept;
  {
    auto store = std::move(*Store::Open(store_dir, options));
    for (uint32_t i = 0; i < 2; ++i) {
      Buffer data = RandomBuffer(4 << 20, 10 + i);
      auto w = store->NewWriter();
      ASSERT_TRUE(w->Append(data.bytes()).ok());
      auto id = w->Finish();
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      kept.emplace_back(*id, std::move(data));
    }
    Buffer big = RandomBuffer(32 << 20, 20);
    auto w = store->NewWriter();
    Status st = w->Append(big.bytes());
    Result<ContentId> id = st.ok() ? w->Finish() : Result<ContentId>(st);
    ASSERT_FALSE(id.ok());
    EXPECT_TRUE(id.status().IsNoSpace()) << id.status().ToString();
    EXPECT_EQ(id.status().ToErrno(), ENOSPC);
  }
  auto store = std::move(*Store::Open(store_dir, options));
  for (const auto& [id, data] : kept) {
    Buffer out(data.size());
    auto n = store->Read(id, 0, out.mutable_bytes());
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(0, std::memcmp(out.data(), data.data(), data.size()));
  }
  EXPECT_TRUE(store->Verify()->ok());
  store.reset();
}

}  // namespace
}  // namespace ckptfs

namespace ckptfs {
namespace {

TEST_F(StoreTest, TheCodecIsRecordedAtCreationAndUsedOnReopenUnlessGiven) {
  // A new store without a codec records the default.
  EXPECT_EQ(Open().options().codec->ToString(), "auto");
  store_.reset();
  std::filesystem::remove_all(dir_);
  // Created with zstd:5: recorded, and a reopen without flags uses it.
  StoreOptions o;
  o.codec = *CodecSpec::Parse("zstd:5");
  Open(o);
  store_.reset();
  auto json = ReadSmallFile(dir_ / "ckptfs.json");
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"codec\": \"zstd:5\""), std::string::npos) << *json;
  EXPECT_EQ(Open().options().codec->ToString(), "zstd:5");
  // A codec given for an existing store applies while it is open and is not recorded.
  o.codec = *CodecSpec::Parse("lz4");
  EXPECT_EQ(Open(o).options().codec->ToString(), "lz4");
  EXPECT_EQ(Open().options().codec->ToString(), "zstd:5");
  // A store from before codecs were recorded gets the default.
  store_.reset();
  ASSERT_TRUE(WriteFileAtomic(dir_ / "ckptfs.json",
                              "{\"format\": 2, \"chunking\": {\"min\": 65536, \"avg\": "
                              "262144, \"max\": 1048576}}\n")
                  .ok());
  EXPECT_EQ(Open().options().codec->ToString(), "auto");
  // An unknown codec name is a damaged configuration, not a silent default.
  store_.reset();
  ASSERT_TRUE(
      WriteFileAtomic(dir_ / "ckptfs.json", "{\"format\": 2, \"codec\": \"brotli\"}\n").ok());
  EXPECT_FALSE(Store::Open(dir_, StoreOptions{}).ok());
}

}  // namespace
}  // namespace ckptfs
