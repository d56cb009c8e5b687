// Criterion 4: after a crash the store opens with every committed content intact.
//
// CrashTest kills (SIGKILL) a child process that writes contents in a loop, in the middle of a
// large write, several times over the same store. TornTailTest damages the uncommitted tail of
// a pack the way an interrupted write would: cut mid-record, garbage, a partial record.
// FlippedPackRowTest damages a pack's catalog row instead: the store's open must neither cut
// committed records off nor delete the pack on the word of that one row.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "engine/store/record.h"
#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

constexpr size_t kMiB = 1u << 20;

// What the writer child tells the parent, one fixed-size message at a time.
struct Message {
  enum Kind : uint32_t { kCommitted = 1, kLargeWriteUnderway = 2 };
  uint32_t kind = 0;
  ContentId id = 0;
  uint64_t seed = 0;
  uint64_t size = 0;
};

struct Committed {
  ContentId id;
  uint64_t seed;
  uint64_t size;
};

void Send(int fd, const Message& m) {
  if (::write(fd, &m, sizeof(m)) != static_cast<ssize_t>(sizeof(m))) ::_exit(5);
}

// The child: opens the store (its threads start here, after the fork) and commits contents of
// the stream `first_seed + i` until it is killed. The first three are small; then each is
// large, and the parent hears when one is well underway.
[[noreturn]] void WriterChild(const std::filesystem::path& dir, int fd, uint64_t first_seed) {
  auto store = Store::Open(dir, TestOptions());
  if (!store.ok()) ::_exit(2);
  Buffer piece((1u << 20) + 3);
  for (uint64_t i = 0;; ++i) {
    const uint64_t seed = first_seed + i;
    const uint64_t size = i < 3 ? (i + 1) * 3 * kMiB + i * 12345 : 64 * kMiB + 17;
    auto writer = (*store)->NewWriter();
    bool told = false;
    for (uint64_t offset = 0; offset < size;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), size - offset));
      FillPattern(seed, offset, piece.mutable_bytes().first(n));
      if (!writer->Append(piece.bytes().first(n)).ok()) ::_exit(3);
      offset += n;
      if (i >= 3 && !told && offset >= 16 * kMiB) {
        Send(fd, Message{Message::kLargeWriteUnderway, 0, seed, size});
        told = true;
      }
    }
    auto id = writer->Finish();
    if (!id.ok()) ::_exit(4);
    Send(fd, Message{Message::kCommitted, *id, seed, size});
  }
}

// Runs a writer child against dir and SIGKILLs it once it has committed three contents and a
// large write is underway. Returns what the child reported committed.
std::vector<Committed> RunAndKillWriter(const std::filesystem::path& dir, uint64_t first_seed) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    WriterChild(dir, fds[1], first_seed);
  }
  ::close(fds[1]);
  EXPECT_GT(pid, 0);
  std::vector<Committed> committed;
  bool killed = false;
  Message m;
  while (::read(fds[0], &m, sizeof(m)) == static_cast<ssize_t>(sizeof(m))) {
    if (m.kind == Message::kCommitted) committed.push_back({m.id, m.seed, m.size});
    if (m.kind == Message::kLargeWriteUnderway && committed.size() >= 3 && !killed) {
      // Let the pipeline put some of this content's records into the pack first.
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      ::kill(pid, SIGKILL);
      killed = true;
    }
  }
  ::close(fds[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the writer child was not killed: "
      << (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status)) : "signal");
  EXPECT_GE(committed.size(), 3u);
  return committed;
}

// Bytes in pack files beyond their committed lengths, read straight from the catalog (with no
// store open, so nothing is cut yet).
uint64_t UncommittedPackBytes(const std::filesystem::path& dir) {
  auto catalog = Catalog::Open(dir / "catalog");
  EXPECT_TRUE(catalog.ok()) << catalog.status().ToString();
  if (!catalog.ok()) return 0;
  auto txn = (*catalog)->BeginRead();
  EXPECT_TRUE(txn.ok());
  if (!txn.ok()) return 0;
  uint64_t extra = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "packs", ec)) {
    uint32_t id;
    if (!ParsePackFileName(entry.path().filename().string(), &id)) continue;
    auto row = txn->GetPack(id);
    uint64_t committed = row.ok() && *row ? (*row)->committed : 0;
    extra += entry.file_size() > committed ? entry.file_size() - committed : 0;
  }
  return extra;
}

// Every pack file is exactly its committed length.
::testing::AssertionResult PackTailsCut(Store& store) {
  auto txn = store.catalog().BeginRead();
  if (!txn.ok()) return ::testing::AssertionFailure() << txn.status().ToString();
  auto result = ::testing::AssertionSuccess();
  bool ok = true;
  Status s = txn->ForEachPack([&](uint32_t id, const PackRow& row) {
    auto size = std::filesystem::file_size(store.dir() / "packs" / PackFileName(id));
    if (size != row.committed) {
      result = ::testing::AssertionFailure()
               << PackFileName(id) << " is " << size << " bytes, committed " << row.committed;
      ok = false;
    }
    return ok;
  });
  if (!s.ok()) return ::testing::AssertionFailure() << s.ToString();
  return result;
}

::testing::AssertionResult AllIntact(const Store& store, const std::vector<Committed>& contents) {
  for (const Committed& c : contents) {
    auto same = ContentEquals(store, c.id, PatternBytes(c.seed, 0, c.size));
    if (!same) return same;
  }
  return ::testing::AssertionSuccess();
}

TEST(CrashTest, KilledWriterLeavesEveryCommittedContentIntact) {
  TempDir dir("crash");
  std::vector<Committed> committed;
  for (uint64_t round = 1; round <= 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<Committed> more = RunAndKillWriter(dir.path(), 1000 * round);
    committed.insert(committed.end(), more.begin(), more.end());
    // The kill caught a write in flight: some records were never committed.
    EXPECT_GT(UncommittedPackBytes(dir.path()), 0u);

    auto store = OpenStore(dir.path());
    ASSERT_TRUE(store);
    EXPECT_TRUE(PackTailsCut(*store));
    ASSERT_OK_AND_ASSIGN(StoreStats stats, store->Stats());
    EXPECT_GE(stats.contents, committed.size());
    EXPECT_TRUE(AllIntact(*store, committed));
    EXPECT_TRUE(VerifyClean(*store));
  }
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store);
  ASSERT_OK(store->Gc().status());
  EXPECT_TRUE(VerifyClean(*store));
  EXPECT_TRUE(AllIntact(*store, committed));
}

enum class Damage { kCutMidRecord, kGarbage, kPartialRecord };
const char* NameOf(Damage damage) {
  switch (damage) {
    case Damage::kCutMidRecord:
      return "CutMidRecord";
    case Damage::kGarbage:
      return "Garbage";
    case Damage::kPartialRecord:
      return "PartialRecord";
  }
  return "Unknown";
}
void PrintTo(Damage damage, std::ostream* os) { *os << NameOf(damage); }

class TornTailTest : public ::testing::TestWithParam<Damage> {};

TEST_P(TornTailTest, StoreOpensWithCommittedContentsIntact) {
  TempDir dir("torn");
  const std::vector<std::byte> kept = PatternBytes(1, 0, 6 * kMiB + 99);
  ContentId kept_id = 0;
  uint32_t pack_id = 0;
  uint64_t committed = 0;
  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(store);
    ASSERT_OK_AND_ASSIGN(kept_id, WriteContent(*store, kept));
    // A writer that never finishes: its records land in the pack past the committed length.
    auto abandoned = store->NewWriter();
    ASSERT_OK(abandoned->Append(PatternBytes(2, 0, 10 * kMiB)));
    abandoned.reset();
    ASSERT_OK_AND_ASSIGN(auto txn, store->catalog().BeginRead());
    ASSERT_OK(txn.ForEachPack([&](uint32_t id, const PackRow& row) {
      pack_id = id;  // the last one
      committed = row.committed;
      return true;
    }));
  }
  const auto pack = dir.path() / "packs" / PackFileName(pack_id);
  const uint64_t size = std::filesystem::file_size(pack);
  ASSERT_GT(size, committed + 2 * kMiB) << "the abandoned writer left no tail";

  switch (GetParam()) {
    case Damage::kCutMidRecord:
      // Inside the first uncommitted record (records are at least min_size long).
      std::filesystem::resize_file(pack, committed + kRecordHeaderBytes + 12345);
      break;
    case Damage::kGarbage: {
      std::vector<std::byte> all = ReadFileBytes(pack);
      std::vector<std::byte> junk = PatternBytes(3, 0, 5000);
      all.insert(all.end(), junk.begin(), junk.end());
      WriteFileBytes(pack, all);
      break;
    }
    case Damage::kPartialRecord: {
      // A well-formed header promising 1 MiB, of which 777 bytes made it.
      std::vector<std::byte> all = ReadFileBytes(pack);
      const std::vector<std::byte> payload = PatternBytes(4, 0, kMiB);
      RecordHeader header;
      header.raw_len = header.stored_len = kMiB;
      header.id = ChunkId::Of(payload);
      header.payload_checksum = Checksum64(payload);
      std::byte encoded[kRecordHeaderBytes];
      header.EncodeTo(encoded);
      all.insert(all.end(), encoded, encoded + kRecordHeaderBytes);
      all.insert(all.end(), payload.begin(), payload.begin() + 777);
      WriteFileBytes(pack, all);
      break;
    }
  }

  const std::vector<std::byte> added = PatternBytes(5, 0, 5 * kMiB + 1);
  ContentId added_id = 0;
  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(store);
    EXPECT_EQ(std::filesystem::file_size(pack), committed);
    EXPECT_TRUE(PackTailsCut(*store));
    EXPECT_TRUE(ContentEquals(*store, kept_id, kept));
    EXPECT_TRUE(VerifyClean(*store));
    // Writing goes on from the committed end.
    ASSERT_OK_AND_ASSIGN(added_id, WriteContent(*store, added));
  }
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store);
  EXPECT_TRUE(ContentEquals(*store, kept_id, kept));
  EXPECT_TRUE(ContentEquals(*store, added_id, added));
  ASSERT_OK(store->Gc().status());
  EXPECT_TRUE(VerifyClean(*store));
  EXPECT_TRUE(ContentEquals(*store, kept_id, kept));
  EXPECT_TRUE(ContentEquals(*store, added_id, added));
}

INSTANTIATE_TEST_SUITE_P(Tails, TornTailTest,
                         ::testing::Values(Damage::kCutMidRecord, Damage::kGarbage,
                                           Damage::kPartialRecord),
                         [](const ::testing::TestParamInfo<Damage>& info) {
                           return std::string(NameOf(info.param));
                         });

// How a flipped byte damages a pack row.
enum class RowFlip { kCommittedLength, kPackId };

class FlippedPackRowTest : public ::testing::TestWithParam<RowFlip> {};

TEST_P(FlippedPackRowTest, OpenNeitherCutsNorDeletesCommittedRecords) {
  TempDir dir("flipped-row");
  const std::vector<std::byte> kept = PatternBytes(6, 0, 6 * kMiB + 99);
  ContentId kept_id = 0;
  uint32_t pack_id = 0;
  uint64_t committed = 0;
  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(store);
    ASSERT_OK_AND_ASSIGN(kept_id, WriteContent(*store, kept));
    ASSERT_OK_AND_ASSIGN(auto txn, store->catalog().BeginRead());
    ASSERT_OK(txn.ForEachPack([&](uint32_t id, const PackRow& row) {
      pack_id = id;
      committed = row.committed;
      return true;
    }));
  }
  {
    auto catalog = Catalog::Open(dir.path() / "catalog");
    ASSERT_OK(catalog.status());
    ASSERT_OK((*catalog)->Update(Catalog::SpaceUse::kNormal, [&](Catalog::WriteTxn& txn) {
      if (GetParam() == RowFlip::kCommittedLength) {
        // The top bit of the length flipped: the row now ends in the middle of the records.
        return txn.PutPack(pack_id, PackRow{committed ^ (uint64_t{1} << (63 - __builtin_clzll(
                                                                          committed)))});
      }
      CKPTFS_RETURN_IF_ERROR(txn.DeletePack(pack_id));  // the key flipped: another pack's row
      return txn.PutPack(pack_id ^ 0x10, PackRow{committed});
    }));
  }
  const auto pack = dir.path() / "packs" / PackFileName(pack_id);
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store);
  ASSERT_TRUE(std::filesystem::exists(pack)) << "the pack was deleted";
  EXPECT_EQ(std::filesystem::file_size(pack), committed) << "the pack was cut";
  EXPECT_TRUE(ContentEquals(*store, kept_id, kept));
  EXPECT_FALSE(VerifyClean(*store)) << "verify does not see the damaged row";
}

INSTANTIATE_TEST_SUITE_P(Flips, FlippedPackRowTest,
                         ::testing::Values(RowFlip::kCommittedLength, RowFlip::kPackId),
                         [](const ::testing::TestParamInfo<RowFlip>& info) {
                           return std::string(info.param == RowFlip::kPackId ? "PackId"
                                                                             : "CommittedLength");
                         });

}  // namespace
}  // namespace ckptfs::testing
