// Unit tests of ReadProgress (read_progress.h): what a reader passed or finished is not
// wanted, starting over wants it again, Close wants nothing.
#include "engine/store/read_progress.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ckptfs {
namespace {

ChunkId IdOf(size_t n) {
  ChunkId id{};
  std::memcpy(id.bytes.data(), &n, sizeof(n));
  return id;
}

TEST(ReadProgressTest, PassedAndFinishedChunksAreNotWanted) {
  ReadProgress progress;
  EXPECT_TRUE(progress.Wants(IdOf(1), 100));
  progress.Passed(100);
  EXPECT_FALSE(progress.Wants(IdOf(1), 100)) << "ends where the reader passed";
  EXPECT_TRUE(progress.Wants(IdOf(2), 200));
  progress.Finished(IdOf(2), 200);
  EXPECT_FALSE(progress.Wants(IdOf(2), 200)) << "returned whole, though not passed yet";
  EXPECT_TRUE(progress.Wants(IdOf(3), 300));
  progress.Passed(150);
  EXPECT_FALSE(progress.Wants(IdOf(2), 200)) << "moving on keeps what lies ahead of it";
}

TEST(ReadProgressTest, StartingOverWantsEverythingAgain) {
  ReadProgress progress;
  progress.Passed(1000);
  progress.Finished(IdOf(1), 2000);
  progress.Passed(0);  // a read back at the start
  EXPECT_TRUE(progress.Wants(IdOf(1), 2000));
  EXPECT_TRUE(progress.Wants(IdOf(2), 500));
}

TEST(ReadProgressTest, FinishedChunksAreHeldUpToTheirLimit) {
  ReadProgress progress;
  const size_t n = ReadProgress::kMaxFinished;
  for (size_t i = 0; i <= n; ++i) progress.Finished(IdOf(i), 1 + i);
  EXPECT_TRUE(progress.Wants(IdOf(0), 1)) << "the oldest was forgotten";
  EXPECT_FALSE(progress.Wants(IdOf(n), 1 + n));
}

TEST(ReadProgressTest, CloseWantsNothing) {
  ReadProgress progress;
  progress.Close();
  EXPECT_FALSE(progress.Wants(IdOf(1), UINT64_MAX - 1));
}

}  // namespace
}  // namespace ckptfs
