// Criterion 5: gc brings the pack bytes on disk down to the live set and keeps every live
// content; killed midway (SIGKILL in its copy loop), the store reopens consistent and the
// next gc finishes the job.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>

#include "engine/store/record.h"
#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

constexpr size_t kKiB = 1u << 10;
constexpr size_t kMiB = 1u << 20;
constexpr int kContents = 64;

// Small chunks and 4 MiB packs: many records, many packs, each holding many contents.
StoreOptions GcOptionsForTest() {
  StoreOptions options = TestOptions();
  options.chunking = FastCdc::Params{16 * kKiB, 64 * kKiB, 256 * kKiB};
  options.pack_target_bytes = 4 * kMiB;
  return options;
}

struct Content {
  ContentId id = 0;
  uint64_t seed = 0;
  uint64_t size = 0;
  bool live = false;
};

std::string NameOf(int i) { return "content-" + std::to_string(i); }

// Stores kContents contents of about 256 KiB in order, then drops three in four of them (half
// by Release, half by RemoveName), so that every pack is about a quarter live.
std::vector<Content> FillAndRelease(Store& store) {
  std::vector<Content> contents;
  for (int i = 0; i < kContents; ++i) {
    Content c{0, 100 + static_cast<uint64_t>(i), 256 * kKiB + 1000 * static_cast<uint64_t>(i),
              i % 4 == 0};
    ContentWriter::CommitHook bind;
    if (i % 2 == 1) {
      bind = [&store, i](Catalog::WriteTxn& txn, ContentId id) {
        return store.BindNameInTxn(txn, NameOf(i), id);
      };
    }
    auto id = WriteContent(store, PatternBytes(c.seed, 0, c.size), c.seed, bind);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (!id.ok()) return {};
    c.id = *id;
    contents.push_back(c);
  }
  for (int i = 0; i < kContents; ++i) {
    if (i % 2 == 1) {
      EXPECT_OK(store.RemoveName(NameOf(i)));
    } else if (i % 4 == 2) {
      EXPECT_OK(store.Release(contents[i].id));
    }
  }
  return contents;
}

::testing::AssertionResult LiveIntactDeadGone(const Store& store,
                                              const std::vector<Content>& contents) {
  if (contents.size() != kContents) return ::testing::AssertionFailure() << "no contents";
  for (const Content& c : contents) {
    if (c.live) {
      auto same = ContentEquals(store, c.id, PatternBytes(c.seed, 0, c.size));
      if (!same) return same;
    } else if (!store.StatContent(c.id).status().IsNotFound()) {
      return ::testing::AssertionFailure() << "released content " << c.id << " is still there";
    }
  }
  return ::testing::AssertionSuccess();
}

// Pack bytes on disk are the live records plus one header per pack, within 1%.
::testing::AssertionResult AtLiveSet(const Store& store) {
  auto st = store.Stats();
  if (!st.ok()) return ::testing::AssertionFailure() << st.status().ToString();
  const uint64_t live = st->record_bytes + st->packs * kPackHeaderBytes;
  if (st->pack_bytes < live || st->pack_bytes > live + live / 100) {
    return ::testing::AssertionFailure()
           << "pack bytes " << st->pack_bytes << ", live set " << live << " (" << st->packs
           << " packs, " << st->record_bytes << " record bytes)";
  }
  return ::testing::AssertionSuccess();
}

TEST(GcTest, PackBytesFallToTheLiveSet) {
  TempDir dir("gc");
  std::vector<Content> contents;
  {
    auto store = OpenStore(dir.path(), GcOptionsForTest());
    ASSERT_TRUE(store);
    contents = FillAndRelease(*store);
    ASSERT_OK_AND_ASSIGN(StoreStats before, store->Stats());
    EXPECT_EQ(before.contents, kContents / 4);
    ASSERT_GE(before.packs, 4u);

    ASSERT_OK_AND_ASSIGN(GcReport report, store->Gc());
    EXPECT_GT(report.chunks_dropped, 0u);
    EXPECT_GT(report.records_moved, 0u);
    EXPECT_GE(report.packs_deleted, before.packs - 1);
    EXPECT_TRUE(report.skipped.empty()) << ::testing::PrintToString(report.skipped);
    EXPECT_LT(report.pack_bytes_after, report.pack_bytes_before / 2);
    EXPECT_TRUE(AtLiveSet(*store));
    EXPECT_TRUE(LiveIntactDeadGone(*store, contents));
    EXPECT_TRUE(VerifyClean(*store));
  }
  auto store = OpenStore(dir.path(), GcOptionsForTest());
  ASSERT_TRUE(store);
  EXPECT_TRUE(AtLiveSet(*store));
  EXPECT_TRUE(LiveIntactDeadGone(*store, contents));
  EXPECT_TRUE(VerifyClean(*store));
}

// The parameter is the record copy after which gc is killed, in eighths of the live records
// (so a kill early in the first pack, and kills in later packs after earlier rewrites
// committed).
class GcKilledTest : public ::testing::TestWithParam<int> {};

TEST_P(GcKilledTest, StoreReopensConsistentAndGcCompletes) {
  TempDir dir("gc-killed");
  std::vector<Content> contents;
  uint64_t live_records = 0;
  {
    auto store = OpenStore(dir.path(), GcOptionsForTest());
    ASSERT_TRUE(store);
    contents = FillAndRelease(*store);
    ASSERT_OK_AND_ASSIGN(StoreStats st, store->Stats());
    live_records = st.chunks;
    ASSERT_TRUE(std::filesystem::exists(dir.path() / "packs" / PackFileName(1)));
  }
  auto pack_files = [&] {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path() / "packs")) {
      names.insert(entry.path().filename().string());
    }
    return names;
  };
  const std::set<std::string> packs_before = pack_files();
  const uint64_t kill_after = std::max<uint64_t>(1, live_records * GetParam() / 8);
  ASSERT_LT(kill_after, live_records);

  pid_t pid = ::fork();
  if (pid == 0) {
    // The child opens the store after the fork, so its threads are its own.
    auto store = Store::Open(dir.path(), GcOptionsForTest());
    if (!store.ok()) ::_exit(2);
    uint64_t copied = 0;
    GcOptions options;
    options.after_record_copied = [&] {
      if (++copied == kill_after) ::raise(SIGKILL);
    };
    auto report = (*store)->Gc(options);
    ::_exit(report.ok() ? 3 : 4);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "gc was not killed: "
      << (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status)) : "signal");

  auto store = OpenStore(dir.path(), GcOptionsForTest());
  ASSERT_TRUE(store);
  // A pack holds about a fifth of the live records: past the first eighth, the killed gc had
  // committed the rewrite of its first victim (and deleted it).
  const std::set<std::string> packs_after = pack_files();
  const bool all_kept = std::includes(packs_after.begin(), packs_after.end(), packs_before.begin(),
                                      packs_before.end());
  EXPECT_EQ(all_kept, GetParam() == 0);
  EXPECT_TRUE(VerifyClean(*store));
  EXPECT_TRUE(LiveIntactDeadGone(*store, contents));
  ASSERT_OK_AND_ASSIGN(GcReport report, store->Gc());
  EXPECT_TRUE(report.skipped.empty()) << ::testing::PrintToString(report.skipped);
  EXPECT_TRUE(AtLiveSet(*store));
  EXPECT_TRUE(VerifyClean(*store));
  EXPECT_TRUE(LiveIntactDeadGone(*store, contents));
}

INSTANTIATE_TEST_SUITE_P(KillPoints, GcKilledTest, ::testing::Values(0, 3, 6),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "After" + std::to_string(info.param) + "Eighths";
                         });

}  // namespace
}  // namespace ckptfs::testing
