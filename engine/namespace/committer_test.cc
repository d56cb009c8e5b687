// Committer without FUSE: commits run in the order queued, waiters get their file's status,
// a barrier reports the first failure since the previous one, released files are handed back.
#include "engine/namespace/committer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace ckptfs {
namespace {

class CommitterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_committer_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto s = Store::Open(dir_ / "store", StoreOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    std::filesystem::create_directories(dir_ / "staging");
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::shared_ptr<OpenInode> File(Ino ino, ContentId content = 0) {
    Inode n;
    n.ino = ino;
    n.mode = S_IFREG | 0644;
    n.nlink = 1;
    n.content = content;
    auto txn = store_->catalog().BeginWrite();
    EXPECT_TRUE(txn.ok());
    EXPECT_TRUE(PutInode(*txn, n).ok());
    EXPECT_TRUE(txn->Commit().ok());
    return std::make_shared<OpenInode>(n, store_.get(), dir_ / "staging",
                                       [this](OpenInode&) { return store_->NewWriter(); });
  }
  ContentId CommittedContent(Ino ino) {
    auto txn = store_->catalog().BeginRead();
    auto inode = GetInode(*txn, ino);
    return inode.ok() && *inode ? (*inode)->content : 0;
  }
  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(CommitterTest, ReleasedFilesCommitInOrderAndComeBack) {
  std::mutex mu;
  std::vector<Ino> released;
  std::vector<ContentId> content_ids;
  Committer committer([&](const std::shared_ptr<OpenInode>& f) {
    std::lock_guard lock(mu);
    released.push_back(f->ino);
    content_ids.push_back(CommittedContent(f->ino));  // committed before it comes back
  });
  for (Ino ino = 2; ino < 10; ++ino) {
    auto f = File(ino);
    ASSERT_TRUE(f->Write(0, AsBytes("file " + std::to_string(ino)), false).ok());
    ASSERT_TRUE(committer.Commit(f, /*release=*/true, /*wait=*/false).ok());
  }
  ASSERT_TRUE(committer.Barrier().ok());
  std::lock_guard lock(mu);
  ASSERT_EQ(released.size(), 8u);
  for (size_t i = 0; i < released.size(); ++i) {
    EXPECT_EQ(released[i], 2 + i);
    EXPECT_NE(content_ids[i], 0u);
  }
  // Contents are numbered in commit order.
  for (size_t i = 1; i < content_ids.size(); ++i) EXPECT_GT(content_ids[i], content_ids[i - 1]);
}

TEST_F(CommitterTest, WaiterGetsItsStatusAndTheBarrierReportsFailuresOnce) {
  Committer committer(nullptr);
  auto good = File(2);
  auto bad = File(3);
  ASSERT_TRUE(good->Write(0, AsBytes("good"), false).ok());
  ASSERT_TRUE(bad->Write(0, AsBytes("bad"), false).ok());
  // A patch with no staging directory: the streamed bytes are lost, the commit must fail.
  std::filesystem::remove_all(dir_ / "staging");
  EXPECT_FALSE(bad->Write(0, AsBytes("x"), false).ok());
  EXPECT_TRUE(committer.Commit(good, false, /*wait=*/true).ok());
  EXPECT_NE(CommittedContent(2), 0u);
  EXPECT_TRUE(committer.Commit(bad, false, /*wait=*/false).ok());  // queued: no status yet
  EXPECT_FALSE(committer.Barrier().ok());
  EXPECT_TRUE(committer.Barrier().ok());  // reported once
  EXPECT_FALSE(committer.Commit(bad, false, /*wait=*/true).ok());
}

TEST_F(CommitterTest, DestructorRunsWhatIsQueued) {
  auto f = File(2);
  ASSERT_TRUE(f->Write(0, AsBytes("late"), false).ok());
  {
    Committer committer(nullptr);
    ASSERT_TRUE(committer.Commit(f, true, /*wait=*/false).ok());
  }
  EXPECT_NE(CommittedContent(2), 0u);
}

}  // namespace
}  // namespace ckptfs
