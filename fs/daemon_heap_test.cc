#include "fs/daemon_heap.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckptfs {
namespace {

TEST(DaemonHeapTest, HugePagesAreAddedToWhatTheUserSet) {
  EXPECT_EQ(TunablesWithHugePageHeap(nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(TunablesWithHugePageHeap(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.check=3"),
            "glibc.malloc.check=3:glibc.malloc.hugetlb=1");
  // A tunable whose name only starts like it is another tunable.
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.hugetlbx=2"),
            "glibc.malloc.hugetlbx=2:glibc.malloc.hugetlb=1");
}

TEST(DaemonHeapTest, AChoiceTheUserMadeIsKept) {
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.hugetlb=0"), std::nullopt);
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.check=3:glibc.malloc.hugetlb=1"), std::nullopt);
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.hugetlb=2:glibc.malloc.check=3"), std::nullopt);
}

TEST(DaemonHeapTest, TheTrimmerKnowsWhetherTheHeapAskedForHugePages) {
  EXPECT_TRUE(HugePageHeapRequested("glibc.malloc.hugetlb=1"));
  EXPECT_TRUE(HugePageHeapRequested("glibc.malloc.check=3:glibc.malloc.hugetlb=1"));
  EXPECT_FALSE(HugePageHeapRequested(nullptr));
  EXPECT_FALSE(HugePageHeapRequested(""));
  EXPECT_FALSE(HugePageHeapRequested("glibc.malloc.hugetlb=0"));
  EXPECT_FALSE(HugePageHeapRequested("glibc.malloc.hugetlb=2"));  // hugetlbfs pages: no THP
  EXPECT_FALSE(HugePageHeapRequested("glibc.malloc.hugetlbx=1"));
  EXPECT_FALSE(HugePageHeapRequested("glibc.malloc.hugetlb"));
}

TEST(DaemonHeapTest, OnlyTheMountCommandReexecutes) {
  auto is_mount = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    return IsMountCommand(static_cast<int>(args.size()), argv.data());
  };
  EXPECT_TRUE(is_mount({"ckptfs", "mount", "store", "mnt"}));
  EXPECT_TRUE(is_mount({"ckptfs", "-v", "mount", "store", "mnt"}));
  EXPECT_FALSE(is_mount({"ckptfs", "umount", "mnt"}));
  EXPECT_FALSE(is_mount({"ckptfs", "put", "mount", "name"}));  // "mount" is an argument here
  EXPECT_FALSE(is_mount({"ckptfs"}));
  EXPECT_FALSE(is_mount({"ckptfs", "--version"}));
}

}  // namespace
}  // namespace ckptfs
