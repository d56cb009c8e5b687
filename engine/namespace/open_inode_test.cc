// OpenInode without FUSE: streaming writes, the staging patch path, reads of uncommitted
// bytes, truncation, sealing and the commit that binds the inode.
#include "engine/namespace/open_inode.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <random>
#include <thread>

#include "engine/util/file.h"
#include "engine/util/test_buffers.h"

namespace ckptfs {
namespace {

// Every test runs with writes spooled and ingested behind (the daemon's default) and without.
class OpenInodeTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_open_inode_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto s = Store::Open(dir_ / "store", StoreOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    std::filesystem::create_directories(dir_ / "staging");
    if (GetParam()) {
      // A small backlog: writes wait for the ingest, as they do when it falls behind.
      backlog_ = std::make_unique<ByteBudget>(256 << 10);
      ingester_ = std::make_unique<Ingester>(1, 64 << 10);
    }
  }
  void TearDown() override {
    ingester_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A regular file inode in the catalog.
  Inode MakeInode(Ino ino, ContentId content = 0, uint64_t size = 0) {
    Inode n;
    n.ino = ino;
    n.mode = S_IFREG | 0644;
    n.nlink = 1;
    n.content = content;
    n.size = size;
    auto txn = store_->catalog().BeginWrite();
    EXPECT_TRUE(txn.ok());
    EXPECT_TRUE(PutInode(*txn, n).ok());
    EXPECT_TRUE(txn->Commit().ok());
    return n;
  }
  std::optional<OpenInode::Spool> Spool() {
    if (!ingester_) return std::nullopt;
    return OpenInode::Spool{ingester_.get(), backlog_.get()};
  }
  std::shared_ptr<OpenInode> Open(const Inode& inode,
                                  std::filesystem::path staging = std::filesystem::path()) {
    return std::make_shared<OpenInode>(
        inode, store_.get(), staging.empty() ? dir_ / "staging" : staging,
        [this](OpenInode&) { return store_->NewWriter(); }, Spool());
  }
  Inode Committed(Ino ino) {
    auto txn = store_->catalog().BeginRead();
    EXPECT_TRUE(txn.ok());
    auto inode = GetInode(*txn, ino);
    EXPECT_TRUE(inode.ok() && *inode);
    return **inode;
  }
  std::string ReadContent(ContentId id, uint64_t size) {
    std::string out(size, '\0');
    auto n = store_->Read(id, 0, {reinterpret_cast<std::byte*>(out.data()), out.size()});
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, size);
    return out;
  }
  // What ReadPending returns (or the committed content when the file is clean).
  std::string ReadVisible(OpenInode& f, uint64_t offset, size_t n) {
    std::string out(n, '\0');
    MutableBytes span{reinterpret_cast<std::byte*>(out.data()), out.size()};
    ContentId content = 0;
    auto got = f.ReadPending(offset, span, &content);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (*got) {
      out.resize(**got);
      return out;
    }
    out.resize(span.size());
    if (content != 0) {
      auto r = store_->Read(content, offset, span);
      EXPECT_TRUE(r.ok());
    }
    return out;
  }
  static std::string Str(const Buffer& b) { return std::string(AsChars(b.bytes())); }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<ByteBudget> backlog_;
  std::unique_ptr<Ingester> ingester_;
};

INSTANTIATE_TEST_SUITE_P(SpoolOrNot, OpenInodeTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Spooled" : "Direct"; });

TEST_P(OpenInodeTest, StreamedBytesReadBackBeforeAndAfterCommit) {
  auto f = Open(MakeInode(2));
  Buffer data = RandomBuffer(5 << 20, 1);
  for (size_t off = 0; off < data.size(); off += 1 << 20) {
    ASSERT_TRUE(f->Write(off, data.bytes().subspan(off, 1 << 20), false).ok());
  }
  EXPECT_EQ(f->size_view(), data.size());
  EXPECT_EQ(ReadVisible(*f, 3 << 20, 100), Str(data).substr(3 << 20, 100));
  EXPECT_EQ(Committed(2).content, 0u);  // nothing durable before the commit
  ASSERT_TRUE(f->Commit().ok());
  Inode after = Committed(2);
  EXPECT_NE(after.content, 0u);
  EXPECT_EQ(after.size, data.size());
  EXPECT_EQ(ReadContent(after.content, after.size), Str(data));
  EXPECT_EQ(ReadVisible(*f, 0, 64), Str(data).substr(0, 64));  // clean: from the store
}

TEST_P(OpenInodeTest, PatchingEarlierBytesGoesThroughStaging) {
  auto f = Open(MakeInode(2));
  Buffer data = RandomBuffer(3 << 20, 2);
  ASSERT_TRUE(f->Write(0, data.bytes(), false).ok());
  std::string expect = Str(data);
  ASSERT_TRUE(f->Write(10, AsBytes("patched"), false).ok());
  expect.replace(10, 7, "patched");
  EXPECT_EQ(ReadVisible(*f, 0, 32), expect.substr(0, 32));
  ASSERT_TRUE(f->Write(expect.size(), AsBytes("tail"), /*append=*/true).ok());
  expect += "tail";
  ASSERT_TRUE(f->Commit().ok());
  Inode after = Committed(2);
  EXPECT_EQ(ReadContent(after.content, after.size), expect);
}

TEST_P(OpenInodeTest, AppendsContinueTheCommittedContent) {
  auto f = Open(MakeInode(2));
  ASSERT_TRUE(f->Write(0, AsBytes("first "), false).ok());
  ASSERT_TRUE(f->Commit().ok());
  const ContentId first = Committed(2).content;
  ASSERT_TRUE(f->Write(6, AsBytes("second"), false).ok());
  ASSERT_TRUE(f->Commit().ok());
  Inode after = Committed(2);
  EXPECT_NE(after.content, first);
  EXPECT_EQ(ReadContent(after.content, after.size), "first second");
  EXPECT_FALSE(store_->StatContent(first).ok());  // the old content was released
}

TEST_P(OpenInodeTest, TruncateShrinksExtendsAndEmpties) {
  auto f = Open(MakeInode(2));
  ASSERT_TRUE(f->Write(0, AsBytes("0123456789"), false).ok());
  ASSERT_TRUE(f->Truncate(4).ok());
  ASSERT_TRUE(f->Truncate(6).ok());
  ASSERT_TRUE(f->Commit().ok());
  Inode after = Committed(2);
  EXPECT_EQ(ReadContent(after.content, after.size), std::string("0123\0\0", 6));
  ASSERT_TRUE(f->Truncate(0).ok());
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_EQ(Committed(2).content, 0u);
  EXPECT_EQ(Committed(2).size, 0u);
}

TEST_P(OpenInodeTest, SealedFileRefusesWrites) {
  auto f = Open(MakeInode(2));
  ASSERT_TRUE(f->Write(0, AsBytes("kept"), false).ok());
  f->sealed = true;
  EXPECT_EQ(f->Write(4, AsBytes("lost"), false).code(), Status::Code::kReadOnly);
  // Nor truncation: an O_TRUNC open or a truncate() that raced the seal keeps the bytes.
  EXPECT_EQ(f->TruncateForOpen().code(), Status::Code::kReadOnly);
  EXPECT_EQ(f->Truncate(1).code(), Status::Code::kReadOnly);
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_EQ(Committed(2).size, 4u);
  EXPECT_EQ(ReadContent(Committed(2).content, 4), "kept");
}

TEST_P(OpenInodeTest, FailedWriteIsStickyAndTheInodeKeepsItsContent) {
  // The staging directory goes: the patch path fails after bytes were streamed.
  auto first = Open(MakeInode(2));
  ASSERT_TRUE(first->Write(0, AsBytes("base"), false).ok());
  ASSERT_TRUE(first->Commit().ok());
  std::filesystem::create_directories(dir_ / "later");
  auto f = Open(Committed(2), dir_ / "later");
  ASSERT_TRUE(f->Write(4, AsBytes("streamed"), false).ok());
  std::filesystem::remove_all(dir_ / "later");
  EXPECT_FALSE(f->Write(0, AsBytes("patch"), false).ok());
  EXPECT_FALSE(f->error().ok());
  EXPECT_FALSE(f->Write(8, AsBytes("more"), false).ok());
  std::string buf(4, '\0');
  MutableBytes span{reinterpret_cast<std::byte*>(buf.data()), buf.size()};
  ContentId content;
  EXPECT_FALSE(f->ReadPending(0, span, &content).ok());
  const ContentId before = Committed(2).content;
  EXPECT_FALSE(f->Commit().ok());
  EXPECT_EQ(Committed(2).content, before);
  std::filesystem::create_directories(dir_ / "later");
  ASSERT_TRUE(f->TruncateForOpen().ok());  // O_TRUNC starts over
  EXPECT_TRUE(f->error().ok());
  ASSERT_TRUE(f->Write(0, AsBytes("new"), false).ok());
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_EQ(ReadContent(Committed(2).content, 3), "new");
}

TEST_P(OpenInodeTest, AppenderOfAMissingContentFailsTheWrite) {
  auto f = Open(MakeInode(2, /*content=*/12345, /*size=*/3));
  EXPECT_FALSE(f->Write(3, AsBytes("more"), false).ok());
  EXPECT_TRUE(f->Commit().ok());  // nothing was accepted: nothing to commit
  EXPECT_EQ(Committed(2).content, 12345u);
}

TEST_P(OpenInodeTest, ManySmallWritesThroughASmallBacklog) {
  auto f = Open(MakeInode(2));
  Buffer data = RandomBuffer(3 << 20, 7);
  for (size_t off = 0; off < data.size(); off += 100000) {
    const size_t n = std::min<size_t>(100000, data.size() - off);
    ASSERT_TRUE(f->Write(off, data.bytes().subspan(off, n), false).ok());
    // Reads see what was written at once, ingested or not.
    EXPECT_EQ(ReadVisible(*f, off, n), Str(data).substr(off, n));
  }
  // All of it, across what was ingested (its spool pages punched out) and what was not.
  EXPECT_EQ(ReadVisible(*f, 0, data.size()), Str(data));
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_EQ(ReadContent(Committed(2).content, data.size()), Str(data));
  EXPECT_EQ(backlog_ ? backlog_->used() : 0u, 0u);
}

TEST_P(OpenInodeTest, AnAppendersPatchReadsItsBaseAndSpool) {
  auto f = Open(MakeInode(2));
  Buffer data = RandomBuffer(2 << 20, 8);
  ASSERT_TRUE(f->Write(0, data.bytes().first(1 << 20), false).ok());
  ASSERT_TRUE(f->Commit().ok());
  ASSERT_TRUE(f->Write(1 << 20, data.bytes().subspan(1 << 20), false).ok());
  std::string expect = Str(data);
  EXPECT_EQ(ReadVisible(*f, (1 << 20) - 5, 10), expect.substr((1 << 20) - 5, 10));
  ASSERT_TRUE(f->Write(100, AsBytes("patch"), false).ok());
  expect.replace(100, 5, "patch");
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_EQ(ReadContent(Committed(2).content, expect.size()), expect);
  EXPECT_EQ(backlog_ ? backlog_->used() : 0u, 0u);
}

TEST_P(OpenInodeTest, DroppingAnUncommittedFileReturnsItsBacklog) {
  {
    auto f = Open(MakeInode(2));
    ASSERT_TRUE(f->Write(0, RandomBuffer(100000, 9).bytes(), false).ok());
  }
  // The Ingester may hold the file a little longer (and ingest it): then it goes.
  for (int i = 0; i < 500 && backlog_ && backlog_->used() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(backlog_ ? backlog_->used() : 0u, 0u);
  EXPECT_EQ(Committed(2).content, 0u);
}

TEST_P(OpenInodeTest, CommitOfADroppedInodeReleasesItsContent) {
  auto f = Open(MakeInode(2));
  ASSERT_TRUE(f->Write(0, AsBytes("orphan"), false).ok());
  {
    auto txn = store_->catalog().BeginWrite();
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(txn->Delete(Table::kInodes, InodeKey(2)).ok());
    ASSERT_TRUE(txn->Commit().ok());
  }
  ASSERT_TRUE(f->Commit().ok());
  auto st = store_->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->contents, 0u);
}

// ---- FUSE passthrough: the test writes the staging file as the kernel would ---------------

void KernelWrite(const FileDescriptor& fd, uint64_t offset, const std::string& bytes) {
  ASSERT_EQ(::pwrite(fd.get(), bytes.data(), bytes.size(), static_cast<off_t>(offset)),
            static_cast<ssize_t>(bytes.size()));
}

TEST_P(OpenInodeTest, PassthroughWritesAreCommittedAndLaterOnesAgain) {
  auto f = Open(MakeInode(2));
  auto fd = f->StartPassthrough();
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(f->passthrough_handles(), 1);
  std::string expect = Str(RandomBuffer(3 << 20, 20));
  KernelWrite(*fd, 0, expect);
  EXPECT_EQ(f->size_view(), expect.size());  // GetAttr sees the kernel's writes
  ++f->fsyncs_in_progress;                   // as FileSystem::Fsync does
  ASSERT_TRUE(f->Commit().ok());
  --f->fsyncs_in_progress;
  EXPECT_EQ(ReadContent(Committed(2).content, Committed(2).size), expect);
  // More bytes after the fsync, then close: the release's commit finds them by the file's
  // size and times.
  std::string more = Str(RandomBuffer(1 << 20, 21));
  KernelWrite(*fd, expect.size(), more);
  expect += more;
  f->EndPassthroughHandle();
  EXPECT_EQ(f->size_view(), expect.size());  // published at close, before the commit
  EXPECT_EQ(ReadVisible(*f, expect.size() - 10, 10), expect.substr(expect.size() - 10));
  ASSERT_TRUE(f->Commit().ok());
  Inode after = Committed(2);
  EXPECT_EQ(after.size, expect.size());
  EXPECT_EQ(ReadContent(after.content, after.size), expect);
  // The staging file went with that commit: the file is clean and no handle can join it.
  EXPECT_FALSE(f->AddPassthroughHandle());
  EXPECT_FALSE(f->changed_since_commit());
}

TEST_P(OpenInodeTest, PassthroughOverwriteAfterACommitIsNotLost) {
  auto f = Open(MakeInode(2));
  auto fd = f->StartPassthrough();
  ASSERT_TRUE(fd.ok());
  std::string expect = Str(RandomBuffer(2 << 20, 22));
  KernelWrite(*fd, 0, expect);
  ASSERT_TRUE(f->Commit().ok());  // a sync: not under an fsync, the writer could write on
  KernelWrite(*fd, 1000, "overwritten in place");  // same size
  expect.replace(1000, 20, "overwritten in place");
  f->EndPassthroughHandle();
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_EQ(ReadContent(Committed(2).content, Committed(2).size), expect);
}

TEST_P(OpenInodeTest, PassthroughJoinTruncateAndSetattr) {
  auto f = Open(MakeInode(2));
  auto fd = f->StartPassthrough();
  ASSERT_TRUE(fd.ok());
  KernelWrite(*fd, 0, "first writer's bytes");
  ASSERT_TRUE(f->AddPassthroughHandle());  // a second open of the file
  EXPECT_EQ(f->passthrough_handles(), 2);
  ASSERT_TRUE(f->TruncateForOpen().ok());  // it had O_TRUNC: the shared file empties, and stays
  struct stat st {};
  ASSERT_EQ(::fstat(fd->get(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  KernelWrite(*fd, 0, "after the truncate, and more");
  ASSERT_TRUE(f->Truncate(16).ok());  // ftruncate through FUSE's setattr
  f->EndPassthroughHandle();
  f->EndPassthroughHandle();
  ASSERT_TRUE(f->Commit().ok());
  Inode after = Committed(2);
  EXPECT_EQ(ReadContent(after.content, after.size), "after the trunca");
}

TEST_P(OpenInodeTest, PassthroughOnlyForAnEmptyUnsealedFile) {
  auto written = Open(MakeInode(2));
  ASSERT_TRUE(written->Write(0, AsBytes("bytes"), false).ok());
  EXPECT_FALSE(written->StartPassthrough().ok());
  auto sealed = Open(MakeInode(3));
  sealed->sealed = true;
  auto refused = sealed->StartPassthrough();
  EXPECT_EQ(refused.status().code(), Status::Code::kReadOnly);
  EXPECT_EQ(sealed->passthrough_handles(), 0);
  auto twice = Open(MakeInode(4));
  ASSERT_TRUE(twice->StartPassthrough().ok());
  EXPECT_FALSE(twice->StartPassthrough().ok());  // the second handle joins instead
  twice->EndPassthroughHandle();
}

std::string FileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// fsync of a passthrough file: the staging file is synced and named; nothing is committed
// until the close's commit, which takes the later bytes too and removes the name.
TEST_P(OpenInodeTest, FsyncJournalNamesTheBytesUntilTheCommit) {
  auto f = Open(MakeInode(2));
  auto fd = f->StartPassthrough();
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  std::string expect = Str(RandomBuffer(3 << 20, 23));
  KernelWrite(*fd, 0, expect);
  const auto journal = dir_ / "staging" / OpenInode::JournalName(2, 0);
  ++f->fsyncs_in_progress;
  auto journaled = f->Journal();
  --f->fsyncs_in_progress;
  ASSERT_TRUE(journaled.ok()) << journaled.status().ToString();
  EXPECT_TRUE(*journaled);
  EXPECT_TRUE(f->holds_journal());
  EXPECT_EQ(Committed(2).content, 0u);  // not committed: durable in the journal
  EXPECT_EQ(Committed(2).size, 0u);
  EXPECT_EQ(FileBytes(journal), expect);
  EXPECT_EQ(f->pending_bytes(), 0u);
  std::string more = Str(RandomBuffer(1 << 20, 24));
  KernelWrite(*fd, expect.size(), more);
  expect += more;
  ++f->fsyncs_in_progress;  // a second fsync: the same journal, synced again
  journaled = f->Journal();
  --f->fsyncs_in_progress;
  ASSERT_TRUE(journaled.ok() && *journaled);
  EXPECT_EQ(FileBytes(journal), expect);
  f->EndPassthroughHandle();
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_EQ(ReadContent(Committed(2).content, Committed(2).size), expect);
  EXPECT_FALSE(std::filesystem::exists(journal));
  EXPECT_FALSE(f->holds_journal());
  // A clean file, or one without a passthrough staging file, has nothing to journal.
  auto clean = f->Journal();
  ASSERT_TRUE(clean.ok());
  EXPECT_FALSE(*clean);
  auto streamed = Open(MakeInode(3));
  ASSERT_TRUE(streamed->Write(0, AsBytes("daemon-written"), false).ok());
  auto not_passthrough = streamed->Journal();
  ASSERT_TRUE(not_passthrough.ok());
  EXPECT_FALSE(*not_passthrough);
}

// The daemon dies after the fsync and before the commit: the journal stays, and the file
// that adopts it at the next mount commits it.
TEST_P(OpenInodeTest, AJournalLeftByADeadDaemonIsAdoptedAndCommitted) {
  const std::string old = "the committed content before";
  auto first = Open(MakeInode(2));
  ASSERT_TRUE(first->Write(0, AsBytes(old), false).ok());
  ASSERT_TRUE(first->Commit().ok());
  const ContentId committed = Committed(2).content;
  ASSERT_NE(committed, 0u);
  first.reset();

  const std::string expect = Str(RandomBuffer(2 << 20, 25));
  const std::string name = OpenInode::JournalName(2, committed);
  {
    auto f = Open(Committed(2));
    ASSERT_TRUE(f->TruncateForOpen().ok());  // open(O_TRUNC): empty, so passthrough may start
    auto fd = f->StartPassthrough();
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    KernelWrite(*fd, 0, expect);
    ++f->fsyncs_in_progress;
    auto journaled = f->Journal();
    ASSERT_TRUE(journaled.ok() && *journaled);
    f->EndPassthroughHandle();
  }  // dropped without a commit, as by kill -9
  EXPECT_EQ(ReadContent(Committed(2).content, Committed(2).size), old);
  ASSERT_TRUE(std::filesystem::exists(dir_ / "staging" / name));

  auto parsed = OpenInode::ParseJournalName(name);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->first, 2u);
  EXPECT_EQ(parsed->second, committed);
  for (const char* bad : {"journal-2-", "journal--5", "journal-x-5", "journal-2-5.new", "journal-2",
                          "spool-2-5", "journal-99999999999999999999999-1"}) {
    EXPECT_FALSE(OpenInode::ParseJournalName(bad)) << bad;
  }

  auto g = Open(Committed(2));
  auto fd = OpenFile(dir_ / "staging" / name, O_RDWR, 0);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(g->AdoptJournal(std::move(*fd), name).ok());
  EXPECT_TRUE(g->holds_journal());
  EXPECT_EQ(g->size_view(), expect.size());
  EXPECT_EQ(ReadVisible(*g, 0, expect.size()), expect);
  ASSERT_TRUE(g->Commit().ok());
  EXPECT_EQ(ReadContent(Committed(2).content, Committed(2).size), expect);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "staging" / name));
  EXPECT_FALSE(g->holds_journal());
}

// A commit that ran while a passthrough handle was open (the previous close's, or a sync) may
// have read less than the kernel then wrote: the handle's release counts as a change, so that
// FileSystem does not forget the file before that release's own commit ran.
TEST_P(OpenInodeTest, APassthroughReleaseAfterACommitIsAChange) {
  auto f = Open(MakeInode(2));
  auto fd = f->StartPassthrough();
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(f->Commit().ok());  // nothing written yet
  EXPECT_FALSE(f->changed_since_commit());
  KernelWrite(*fd, 0, "global_step2");
  f->EndPassthroughHandle();
  EXPECT_TRUE(f->changed_since_commit());
  ASSERT_TRUE(f->Commit().ok());
  EXPECT_FALSE(f->changed_since_commit());
  EXPECT_EQ(ReadContent(Committed(2).content, Committed(2).size), "global_step2");
}

// A view opened right after a save asks the file whether a commit is left to do
// (FileSystem::CommitIfClosed). While the release's commit runs its on_content_changed call
// (which drops the kernel's cache of the views), the answer waits: answered "clean" before it,
// the view opened on the old cached pages, which the invalidation then dropped too late.
TEST_P(OpenInodeTest, ACommitIsDoneForOthersOnlyOnceItsViewsAreTold) {
  auto f = Open(MakeInode(2));
  ASSERT_TRUE(f->Write(0, AsBytes("DD"), false).ok());
  std::promise<void> entered;
  std::promise<void> gate;
  std::shared_future<void> open_gate = gate.get_future().share();
  f->on_content_changed = [&](Ino) {
    entered.set_value();
    open_gate.wait();
  };
  std::thread committer([&] { EXPECT_TRUE(f->Commit().ok()); });
  entered.get_future().wait();
  std::atomic<bool> answered{false};
  Result<bool> uncommitted = true;
  std::thread viewer([&] {
    uncommitted = f->HasUncommittedChanges();
    answered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(answered.load()) << "answered while the views were not told yet";
  gate.set_value();
  committer.join();
  viewer.join();
  ASSERT_TRUE(uncommitted.ok());
  EXPECT_FALSE(*uncommitted);
}

}  // namespace
}  // namespace ckptfs
