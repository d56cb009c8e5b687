// FileSystem's open-file bookkeeping, without FUSE.
#include "engine/namespace/filesystem.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

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

}  // namespace
}  // namespace ckptfs
