#include "engine/store/space_reserve.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace ckptfs {
namespace {

class SpaceReserveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs_space_reserve_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Bytes of disk the file really holds (allocated blocks, not its length).
  static uint64_t AllocatedBytes(const std::filesystem::path& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return 0;
    return static_cast<uint64_t>(st.st_blocks) * 512;
  }
  std::filesystem::path dir_;
};

TEST_F(SpaceReserveTest, HoldsAllocatedBlocksUntilReleased) {
  SpaceReserve reserve(dir_ / "reserve", 4 << 20);
  EXPECT_FALSE(reserve.held());
  ASSERT_TRUE(reserve.Refill().ok());
  EXPECT_TRUE(reserve.held());
  EXPECT_GE(AllocatedBytes(dir_ / "reserve"), 4u << 20);  // blocks, not a sparse file

  EXPECT_TRUE(reserve.Release());
  EXPECT_FALSE(reserve.held());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "reserve"));
  EXPECT_FALSE(reserve.Release());  // nothing left to give

  ASSERT_TRUE(reserve.Refill().ok());
  EXPECT_TRUE(reserve.held());
  EXPECT_GE(AllocatedBytes(dir_ / "reserve"), 4u << 20);
}

TEST_F(SpaceReserveTest, ReservesLeftByAnEarlierRunAreReused) {
  {
    SpaceReserve first(dir_ / "reserve", 2 << 20);
    ASSERT_TRUE(first.Refill().ok());
  }
  SpaceReserve second(dir_ / "reserve", 2 << 20);
  ASSERT_TRUE(second.Refill().ok());
  EXPECT_TRUE(second.held());
  EXPECT_TRUE(second.Release());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "reserve"));
}

TEST_F(SpaceReserveTest, ZeroBytesIsNoReserve) {
  SpaceReserve reserve(dir_ / "reserve", 0);
  ASSERT_TRUE(reserve.Refill().ok());
  EXPECT_FALSE(reserve.held());
  EXPECT_FALSE(reserve.Release());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "reserve"));
}

}  // namespace
}  // namespace ckptfs
