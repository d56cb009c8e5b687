// Sealing through FileSystem, without FUSE: Seal() commits the version's open files first and
// refuses later writes; the sealer seals an idle older version on its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "engine/namespace/filesystem.h"

namespace ckptfs {
namespace {

class SealingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_sealing_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    auto s = Store::Open(dir_, StoreOptions{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void TearDown() override {
    fs_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  FileSystem& Mount(std::chrono::milliseconds seal_after) {
    FileSystemOptions options;
    options.seal_after = seal_after;
    auto fs = FileSystem::Open(store_.get(), options);
    EXPECT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(*fs);
    return *fs_;
  }
  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<FileSystem> fs_;
};

TEST_F(SealingTest, SealCommitsOpenFilesThenRefusesChanges) {
  FileSystem& fs = Mount(std::chrono::milliseconds(0));
  auto version = fs.Mkdir(kRootIno, "v1", 0755, Caller{});
  ASSERT_TRUE(version.ok());
  auto made = fs.Create(version->ino, "model.pt", 0644, O_WRONLY, Caller{});
  ASSERT_TRUE(made.ok());
  const uint64_t fh = made->second;
  ASSERT_TRUE(fs.Write(fh, 0, AsBytes("weights")).ok());
  ASSERT_TRUE(fs.Seal(version->ino).ok());
  // Committed by the seal, while still open.
  {
    auto txn = store_->catalog().BeginRead();
    auto inode = GetInode(*txn, made->first.ino);
    ASSERT_TRUE(inode.ok() && *inode);
    EXPECT_NE((*inode)->content, 0u);
    EXPECT_EQ((*inode)->size, 7u);
  }
  EXPECT_EQ(fs.Write(fh, 7, AsBytes("more")).code(), Status::Code::kReadOnly);
  EXPECT_TRUE(fs.Release(fh).ok());
  EXPECT_EQ(fs.Create(version->ino, "late.pt", 0644, O_WRONLY, Caller{}).status().code(),
            Status::Code::kReadOnly);
  EXPECT_EQ(*fs.GetXattr(made->first.ino, "user.ckptfs.sealed"), "1");
  EXPECT_TRUE(fs.Unlink(version->ino, "model.pt").ok());  // retention may delete it
}

TEST_F(SealingTest, SealerSealsAnIdleOlderVersion) {
  FileSystem& fs = Mount(std::chrono::milliseconds(100));
  auto v1 = fs.Mkdir(kRootIno, "v1", 0755, Caller{});
  ASSERT_TRUE(v1.ok());
  auto made = fs.Create(v1->ino, "a", 0644, O_WRONLY, Caller{});
  ASSERT_TRUE(made.ok());
  ASSERT_TRUE(fs.Write(made->second, 0, AsBytes("a")).ok());
  ASSERT_TRUE(fs.Release(made->second).ok());
  auto v2 = fs.Mkdir(kRootIno, "v2", 0755, Caller{});
  ASSERT_TRUE(v2.ok());
  std::string sealed;
  for (int i = 0; i < 100 && sealed != "1"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    sealed = *fs.GetXattr(v1->ino, "user.ckptfs.sealed");
  }
  EXPECT_EQ(sealed, "1");
  EXPECT_EQ(*fs.GetXattr(v2->ino, "user.ckptfs.sealed"), "0");  // the newest stays open
}

// File versions (file_versions.h): in a marked directory each checkpoint file is a version.
TEST_F(SealingTest, FileVersionsSealOnTheirOwn) {
  FileSystem& fs = Mount(std::chrono::milliseconds(100));
  auto logs = fs.Mkdir(kRootIno, "lightning_logs", 0755, Caller{});
  ASSERT_TRUE(logs.ok());
  auto ckpts = fs.Mkdir(logs->ino, "checkpoints", 0755, Caller{});
  ASSERT_TRUE(ckpts.ok());
  ASSERT_TRUE(fs.SetXattr(logs->ino, "user.ckptfs.file_versions", "1", 0).ok());
  EXPECT_EQ(fs.SetXattr(logs->ino, "user.ckptfs.file_versions", "yes", 0).code(),
            Status::Code::kInvalidArgument);
  auto write = [&](const char* name, const char* bytes) {
    auto made = fs.Create(ckpts->ino, name, 0644, O_WRONLY, Caller{});
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    EXPECT_TRUE(fs.Write(made->second, 0, AsBytes(bytes)).ok());
    EXPECT_TRUE(fs.Release(made->second).ok());
    return made->first;
  };
  Inode first = write("epoch=0-step=10.ckpt", "first");
  Inode log = write("notes.txt", "not a checkpoint");
  EXPECT_TRUE(first.file_version());
  EXPECT_FALSE(log.file_version());
  EXPECT_EQ(*fs.GetXattr(first.ino, "user.ckptfs.sealed"), "0");
  // Explicit seal of something that is not a version is refused.
  EXPECT_EQ(fs.Seal(log.ino).code(), Status::Code::kInvalidArgument);
  Inode second = write("epoch=0-step=20.ckpt", "second");
  EXPECT_GT(second.version_seq, first.version_seq);
  std::string sealed;
  for (int i = 0; i < 100 && sealed != "1"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    sealed = *fs.GetXattr(first.ino, "user.ckptfs.sealed");
  }
  EXPECT_EQ(sealed, "1");
  EXPECT_EQ(*fs.GetXattr(second.ino, "user.ckptfs.sealed"), "0");  // the newest stays open
  // The container directory is never sealed as a version; new files still go in.
  auto opened = fs.Open(first.ino, O_WRONLY | O_TRUNC);
  EXPECT_EQ(opened.status().code(), Status::Code::kReadOnly);
  SetAttrRequest chmod;
  chmod.mode = 0600;
  EXPECT_EQ(fs.SetAttr(first.ino, chmod).status().code(), Status::Code::kReadOnly);
  write("epoch=0-step=30.ckpt", "third");
  ASSERT_TRUE(fs.Seal(second.ino).ok());  // explicit
  EXPECT_EQ(*fs.GetXattr(second.ino, "user.ckptfs.sealed"), "1");
  EXPECT_TRUE(fs.Unlink(ckpts->ino, "epoch=0-step=10.ckpt").ok());  // retention may delete it
  // Unmarking leaves sealed files sealed and makes new checkpoint files ordinary.
  ASSERT_TRUE(fs.RemoveXattr(logs->ino, "user.ckptfs.file_versions").ok());
  Inode later = write("epoch=1-step=40.ckpt", "later");
  EXPECT_FALSE(later.file_version());
  EXPECT_EQ(*fs.GetXattr(second.ino, "user.ckptfs.sealed"), "1");
}

TEST_F(SealingTest, MarkingADirectoryFlagsTheCheckpointFilesAlreadyInIt) {
  FileSystem& fs = Mount(std::chrono::milliseconds(0));
  auto made = fs.Create(kRootIno, "ckpt_100.pt", 0644, O_WRONLY, Caller{});
  ASSERT_TRUE(made.ok());
  ASSERT_TRUE(fs.Release(made->second).ok());
  EXPECT_FALSE(made->first.file_version());
  ASSERT_TRUE(fs.SetXattr(kRootIno, "user.ckptfs.file_versions", "1", 0).ok());  // whole mount
  auto inode = fs.GetAttr(made->first.ino);
  ASSERT_TRUE(inode.ok());
  EXPECT_TRUE(inode->file_version());
  EXPECT_GT(inode->version_seq, 0u);
  // Renamed to a name that is not a checkpoint's, it is an ordinary file again.
  ASSERT_TRUE(fs.Rename(kRootIno, "ckpt_100.pt", kRootIno, "ckpt_100.txt", 0).ok());
  EXPECT_FALSE(fs.GetAttr(made->first.ino)->file_version());
}

}  // namespace
}  // namespace ckptfs
