// FileSystem's open-file bookkeeping, without FUSE.
#include "engine/namespace/filesystem.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ckptfs {
namespace {

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_filesystem_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto s = Store::Open(dir_, StoreOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    FileSystemOptions options;
    options.seal_after = std::chrono::milliseconds(0);
    auto fs = FileSystem::Open(store_.get(), options);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(*fs);
  }
  void TearDown() override {
    fs_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  Status WriteAll(Ino ino, int flags, uint64_t offset, std::string_view bytes) {
    CKPTFS_ASSIGN_OR_RETURN(uint64_t fh, fs_->Open(ino, flags));
    Status s = fs_->Write(fh, offset, AsBytes(bytes));
    Status r = fs_->Release(fh);
    return s.ok() ? r : s;
  }
  // A new file opened with O_TRUNC whose handle passes through (as the FUSE adapter makes it),
  // with `bytes` written into its staging file as the kernel writes them; the handle stays open.
  void CreateWrittenByKernel(Ino parent, const std::string& name, const std::string& bytes,
                             std::pair<Inode, uint64_t>* made) {
    auto created = fs_->Create(parent, name, 0644, O_WRONLY | O_TRUNC, Caller{});
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    auto backing = fs_->StartPassthrough(created->second);
    ASSERT_TRUE(backing.ok()) << backing.status().ToString();
    ASSERT_EQ(::pwrite(backing->get(), bytes.data(), bytes.size(), 0),
              static_cast<ssize_t>(bytes.size()));
    *made = *created;
  }
  std::string ReadAll(Ino ino) {
    auto fh = fs_->Open(ino, O_RDONLY);
    if (!fh.ok()) return "error: " + fh.status().ToString();
    std::string out(64, '\0');
    auto n = fs_->Read(*fh, 0, MutableBytes(reinterpret_cast<std::byte*>(out.data()), out.size()));
    (void)fs_->Release(*fh);
    if (!n.ok()) return "error: " + n.status().ToString();
    out.resize(*n);
    return out;
  }
  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<FileSystem> fs_;
};

// DeepSpeed rewrites `latest` at every save: open(O_TRUNC), write, close while the commit of
// the previous close is still queued, then reads it and appends. The committer commits and
// then forgets a released file on its own thread; a second thread keeps the catalog's writer
// busy (namespace changes), so that the forgetting often waits while this thread has already
// opened, rewritten and closed the file again. That file must not be forgotten with its
// newest bytes uncommitted (the next open would read the older content, and the queued commit
// would then release the content an append continues).
TEST_F(FileSystemTest, RewriteRightAfterCloseReadsTheLastBytes) {
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    for (int i = 0; !stop; ++i) {
      const std::string name = "busy-" + std::to_string(i % 4);
      (void)fs_->Mkdir(kRootIno, name, 0755, Caller{});
      (void)fs_->Rmdir(kRootIno, name);
    }
  });
  int failures = 0;
  for (int i = 0; i < 400 && failures == 0; ++i) {
    const std::string name = "latest-" + std::to_string(i);
    auto made = fs_->Create(kRootIno, name, 0644, O_WRONLY | O_TRUNC, Caller{});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    const Ino ino = made->first.ino;
    ASSERT_TRUE(fs_->Write(made->second, 0, AsBytes("global_step1")).ok());
    ASSERT_TRUE(fs_->Release(made->second).ok());
    // Let the committer begin that commit first (a FUSE round trip takes about this long).
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 8)));
    ASSERT_TRUE(WriteAll(ino, O_WRONLY | O_TRUNC, 0, "global_step2").ok());
    const std::string rewritten = ReadAll(ino);
    EXPECT_EQ(rewritten, "global_step2") << "iteration " << i;
    Status appended = WriteAll(ino, O_WRONLY | O_APPEND, 12, "+tail");
    EXPECT_TRUE(appended.ok()) << appended.ToString();
    const std::string tail = ReadAll(ino);
    EXPECT_EQ(tail, "global_step2+tail") << "iteration " << i;
    failures += (rewritten != "global_step2") + (tail != "global_step2+tail");
    EXPECT_TRUE(fs_->Unlink(kRootIno, name).ok());
  }
  stop = true;
  busy.join();
  EXPECT_TRUE(fs_->Sync().ok());
}

// stat() after close() must see the written size while the committer commits the file and
// forgets it (CI once read a 100-byte file as empty: a GETATTR had read the catalog before the
// commit and looked for the open file after the committer forgot it, so the kernel cached size
// 0). Readers on more threads than cores get preempted between the two looks.
TEST_F(FileSystemTest, StatDuringTheCommitAfterCloseSeesTheWrittenSize) {
  const std::string bytes(100, 'x');
  std::atomic<Ino> released{0};
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      while (!stop) {
        const Ino ino = released.load();
        if (ino == 0) continue;
        auto inode = fs_->GetAttr(ino);
        if (inode.ok() && inode->size != bytes.size()) ++wrong;
      }
    });
  }
  for (int i = 0; i < 500 && wrong == 0; ++i) {
    auto made = fs_->Create(kRootIno, "closed-" + std::to_string(i), 0644, O_WRONLY, Caller{});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    ASSERT_TRUE(fs_->Write(made->second, 0, AsBytes(bytes)).ok());
    ASSERT_TRUE(fs_->Release(made->second).ok());
    released = made->first.ino;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0) << "stat saw another size than the one written before close";
  EXPECT_TRUE(fs_->Sync().ok());
}

// close() returns after FLUSH; the kernel sends RELEASE later, and a lookup of the file's view
// may come first (torch.save, then a loader opens FILE@fp32 or FILE@tensors). The view shows
// the closed file's bytes, not the last committed ones; a reader's handle does not hold that
// back, and a handle still writing keeps the view at the committed bytes.
TEST_F(FileSystemTest, AViewLookedUpBeforeTheReleaseShowsTheClosedFile) {
  auto made = fs_->Create(kRootIno, "notes.txt", 0644, O_WRONLY, Caller{});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const Ino ino = made->first.ino;
  ASSERT_TRUE(fs_->Write(made->second, 0, AsBytes("first")).ok());
  ASSERT_TRUE(fs_->Flush(made->second).ok());
  ASSERT_TRUE(fs_->Release(made->second).ok());
  ASSERT_TRUE(fs_->Sync().ok());

  auto reader = fs_->Open(ino, O_RDONLY);
  auto writer = fs_->Open(ino, O_WRONLY | O_TRUNC);
  ASSERT_TRUE(reader.ok() && writer.ok());
  const std::string second = "second, longer bytes";
  ASSERT_TRUE(fs_->Write(*writer, 0, AsBytes(second)).ok());
  auto writing = fs_->Lookup(kRootIno, "notes.txt@fp32");
  ASSERT_TRUE(writing.ok()) << writing.status().ToString();
  EXPECT_EQ(writing->size, 5u) << "a file being written: its view shows the committed bytes";
  ASSERT_TRUE(fs_->Flush(*writer).ok());  // close() has returned; RELEASE has not come
  auto closed = fs_->Lookup(kRootIno, "notes.txt@fp32");
  ASSERT_TRUE(closed.ok()) << closed.status().ToString();
  EXPECT_EQ(closed->size, second.size());
  EXPECT_EQ(ReadAll(closed->ino), second);
  ASSERT_TRUE(fs_->Release(*writer).ok());
  ASSERT_TRUE(fs_->Release(*reader).ok());

  // A new file, flushed and not released: its view is there with its bytes.
  auto fresh = fs_->Create(kRootIno, "fresh.txt", 0644, O_WRONLY, Caller{});
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(fs_->Write(fresh->second, 0, AsBytes(second)).ok());
  ASSERT_TRUE(fs_->Flush(fresh->second).ok());
  auto view = fs_->Lookup(kRootIno, "fresh.txt@fp32");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->size, second.size());
  EXPECT_EQ(ReadAll(view->ino), second);
  ASSERT_TRUE(fs_->Release(fresh->second).ok());
  EXPECT_TRUE(fs_->Sync().ok());
}

// `torch.save` then `ckptfs seal`: close() has returned (FLUSH), and the kernel's RELEASE of
// the passthrough handle comes a moment later. The seal waits for it instead of answering
// EBUSY ("close it first") about a file that is closed.
TEST_F(FileSystemTest, SealRightAfterAPassthroughCloseWaitsForTheRelease) {
  auto version = fs_->Mkdir(kRootIno, "global_step1", 0755, Caller{});
  ASSERT_TRUE(version.ok()) << version.status().ToString();
  const std::string bytes = "written by the kernel, closed before the seal";
  std::pair<Inode, uint64_t> made;
  ASSERT_NO_FATAL_FAILURE(CreateWrittenByKernel(version->ino, "model.pt", bytes, &made));
  ASSERT_TRUE(fs_->Flush(made.second).ok());
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(fs_->Release(made.second).ok());
  });
  const Status sealed = fs_->Seal(version->ino);
  release.join();
  EXPECT_TRUE(sealed.ok()) << sealed.ToString();
  EXPECT_EQ(ReadAll(made.first.ino), bytes);
  EXPECT_EQ(fs_->Open(made.first.ino, O_WRONLY).status().code(), Status::Code::kReadOnly);
}

// A view handle reads the content it was opened on. Once its file is rewritten (that content
// released), a read says the handle is stale (ESTALE), not that something is missing (ENOENT).
TEST_F(FileSystemTest, AViewOfARewrittenFileIsStale) {
  auto made = fs_->Create(kRootIno, "notes.txt", 0644, O_WRONLY, Caller{});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ASSERT_TRUE(fs_->Write(made->second, 0, AsBytes("first")).ok());
  ASSERT_TRUE(fs_->Release(made->second).ok());
  auto file = fs_->Lookup(kRootIno, "notes.txt");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(fs_->Sync().ok());
  auto view = fs_->Lookup(kRootIno, "notes.txt@fp32");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto fh = fs_->Open(view->ino, O_RDONLY);
  ASSERT_TRUE(fh.ok()) << fh.status().ToString();
  ASSERT_TRUE(WriteAll(file->ino, O_WRONLY | O_TRUNC, 0, "second").ok());
  ASSERT_TRUE(fs_->Sync().ok());
  std::string out(16, '\0');
  auto n = fs_->Read(*fh, 0, MutableBytes(reinterpret_cast<std::byte*>(out.data()), out.size()));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().ToErrno(), ESTALE) << n.status().ToString();
  ASSERT_TRUE(fs_->Release(*fh).ok());
  EXPECT_EQ(ReadAll(view->ino), "second");
}

// A view inode lives while the kernel holds a reference to it (the mount's lookup count); of
// the others (forgotten, or never referenced) only a bounded number stay, those idle for a
// second going first once there are kMaxUnreferencedViewNodes (1024), so looking up the views
// of many files over a mount's life does not grow the daemon.
TEST_F(FileSystemTest, ViewInodesLiveWhileReferencedAndTheRestStayBounded) {
  constexpr int kFiles = 400;
  for (int i = 0; i < kFiles; ++i) {
    const std::string name = "file" + std::to_string(i) + ".bin";
    auto made = fs_->Create(kRootIno, name, 0644, O_WRONLY, Caller{});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    ASSERT_TRUE(fs_->Write(made->second, 0, AsBytes("bytes")).ok());
    ASSERT_TRUE(fs_->Release(made->second).ok());
  }
  for (const char* name : {"kept.txt", "forgotten.txt"}) {
    auto made = fs_->Create(kRootIno, name, 0644, O_WRONLY, Caller{});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    ASSERT_TRUE(fs_->Release(made->second).ok());
  }
  ASSERT_TRUE(fs_->Sync().ok());
  auto kept = fs_->Lookup(kRootIno, "kept.txt@fp32");
  auto forgotten = fs_->Lookup(kRootIno, "forgotten.txt@fp32");
  ASSERT_TRUE(kept.ok() && forgotten.ok());
  ASSERT_TRUE(fs_->ViewReferenced(kept->ino));
  ASSERT_TRUE(fs_->ViewReferenced(forgotten->ino));
  fs_->ViewForget(forgotten->ino, 1);
  // Three rounds of 400 new view inodes, a second and more apart: the third passes 1024
  // unreferenced ones and drops the idle ones (the first two rounds', the forgotten one).
  for (const char* suffix : {"@bf16", "@fp16", "@fp32"}) {
    for (int i = 0; i < kFiles; ++i) {
      const std::string name = "file" + std::to_string(i) + ".bin" + suffix;
      auto view = fs_->Lookup(kRootIno, name);
      ASSERT_TRUE(view.ok()) << name << ": " << view.status().ToString();
    }
    if (std::string_view(suffix) != "@fp32")
      std::this_thread::sleep_for(std::chrono::seconds(1) + std::chrono::milliseconds(100));
  }
  EXPECT_LE(fs_->ViewNodes(), static_cast<size_t>(kFiles) + 1) << "the idle ones were dropped";
  auto again = fs_->Lookup(kRootIno, "kept.txt@fp32");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ino, kept->ino) << "a referenced view inode stays";
  EXPECT_TRUE(fs_->GetAttr(kept->ino).ok());
  EXPECT_FALSE(fs_->GetAttr(forgotten->ino).ok()) << "a forgotten one went";
  EXPECT_FALSE(fs_->ViewReferenced(forgotten->ino));
  auto fresh = fs_->Lookup(kRootIno, "forgotten.txt@fp32");
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->ino, forgotten->ino) << "view inode numbers are not reused";
  EXPECT_TRUE(fs_->ViewReferenced(fresh->ino));
}

std::vector<std::string> Journals(const std::filesystem::path& staging) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(staging)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("journal-", 0) == 0) out.push_back(name);
  }
  return out;
}

Inode CatalogInode(Store& store, Ino ino) {
  auto txn = store.catalog().BeginRead();
  EXPECT_TRUE(txn.ok());
  auto inode = GetInode(*txn, ino);
  EXPECT_TRUE(inode.ok() && *inode);
  return inode.ok() && *inode ? **inode : Inode{};
}

// fsync of a passthrough handle (the FUSE adapter gave the kernel the staging file) is
// answered from the journal: nothing is committed until the close; then the journal goes.
TEST_F(FileSystemTest, FsyncOfAPassthroughFileJournalsAndCloseCommits) {
  const std::string bytes = "written by the kernel into the staging file";
  std::pair<Inode, uint64_t> made;
  ASSERT_NO_FATAL_FAILURE(CreateWrittenByKernel(kRootIno, "model.pt", bytes, &made));
  const Ino ino = made.first.ino;
  ASSERT_TRUE(fs_->Fsync(made.second).ok());
  EXPECT_EQ(Journals(dir_ / "staging").size(), 1u);
  EXPECT_EQ(CatalogInode(*store_, ino).size, 0u);
  EXPECT_EQ(ReadAll(ino), bytes);
  ASSERT_TRUE(fs_->Release(made.second).ok());
  ASSERT_TRUE(fs_->Sync().ok());
  EXPECT_EQ(CatalogInode(*store_, ino).size, bytes.size());
  EXPECT_TRUE(Journals(dir_ / "staging").empty());
  EXPECT_EQ(ReadAll(ino), bytes);
}

// The daemon died between an fsync that a journal answered and the commit: the next mount
// commits the journal; one whose file was committed since is dropped.
TEST_F(FileSystemTest, JournalLeftByADeadDaemonIsCommittedAtMount) {
  auto made = fs_->Create(kRootIno, "model.pt", 0644, O_WRONLY, Caller{});
  ASSERT_TRUE(made.ok());
  const Ino ino = made->first.ino;
  ASSERT_TRUE(fs_->Write(made->second, 0, AsBytes("old")).ok());
  ASSERT_TRUE(fs_->Release(made->second).ok());
  ASSERT_TRUE(fs_->Sync().ok());
  fs_.reset();
  const Inode before = CatalogInode(*store_, ino);
  ASSERT_NE(before.content, 0u);

  const std::string bytes = "fsynced through passthrough, never committed";
  {  // what the daemon did before kill -9: an O_TRUNC open, the kernel's writes, the fsync
    auto f = std::make_shared<OpenInode>(before, store_.get(), dir_ / "staging",
                                         [this](OpenInode&) { return store_->NewWriter(); });
    ASSERT_TRUE(f->TruncateForOpen().ok());
    auto backing = f->StartPassthrough();
    ASSERT_TRUE(backing.ok()) << backing.status().ToString();
    ASSERT_EQ(::pwrite(backing->get(), bytes.data(), bytes.size(), 0),
              static_cast<ssize_t>(bytes.size()));
    ++f->fsyncs_in_progress;
    auto journaled = f->Journal();
    ASSERT_TRUE(journaled.ok() && *journaled);
  }
  // A stale journal of the same file (its content was committed since it was made).
  {
    std::ofstream stale(dir_ / "staging" / OpenInode::JournalName(ino, before.content + 1000));
    stale << "stale bytes";
  }
  ASSERT_EQ(Journals(dir_ / "staging").size(), 2u);

  FileSystemOptions options;
  options.seal_after = std::chrono::milliseconds(0);
  auto fs = FileSystem::Open(store_.get(), options);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  fs_ = std::move(*fs);
  EXPECT_EQ(ReadAll(ino), bytes);
  ASSERT_TRUE(fs_->Sync().ok());
  EXPECT_TRUE(Journals(dir_ / "staging").empty());
  EXPECT_EQ(CatalogInode(*store_, ino).size, bytes.size());
  fs_.reset();
  auto again = FileSystem::Open(store_.get(), options);
  ASSERT_TRUE(again.ok());
  fs_ = std::move(*again);
  EXPECT_EQ(ReadAll(ino), bytes);
}

}  // namespace
}  // namespace ckptfs
