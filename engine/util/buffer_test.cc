#include "engine/util/buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>

namespace ckptfs {
namespace {

TEST(BufferTest, PlainBuffersGrowMoveAndKeepTheirBytes) {
  Buffer a(1000);
  std::memset(a.data(), 7, a.size());
  a.Resize(5000);  // reallocates, keeps the first 1000 bytes
  EXPECT_EQ(a.size(), 5000u);
  EXPECT_EQ(a.data()[999], std::byte{7});
  a.Append(AsBytes("abc"));
  EXPECT_EQ(AsChars(a.bytes().last(3)), "abc");
  Buffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.size(), 5003u);
  EXPECT_TRUE(b.block().empty());  // only InAlignedBlock buffers have a block
  EXPECT_EQ(Buffer(0).data(), nullptr);
}

// What a direct read fills: the aligned block around the bytes the caller wants, which the
// buffer then holds without a copy (and frees with the matching deallocation: ASan checks).
TEST(BufferTest, InAlignedBlockViewsItsPartOfAnAlignedBlock) {
  for (size_t lead : {size_t{0}, size_t{100}, size_t{4095}}) {
    Buffer b = Buffer::InAlignedBlock(4096, 3 * 4096, lead, 2 * 4096);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(b.block().data()) % 4096, 0u);
    EXPECT_EQ(b.block().size(), 3u * 4096);
    EXPECT_EQ(b.data(), b.block().data() + lead);
    EXPECT_EQ(b.size(), 2u * 4096);
    for (size_t i = 0; i < b.block().size(); ++i) b.block()[i] = std::byte(i & 0xff);
    EXPECT_EQ(b.data()[0], std::byte(lead & 0xff));
    Buffer moved = std::move(b);
    EXPECT_EQ(moved.data()[1], std::byte((lead + 1) & 0xff));
    moved.Append(AsBytes("x"));  // past its capacity: a plain buffer with the same bytes
    EXPECT_TRUE(moved.block().empty());
    EXPECT_EQ(moved.size(), 2u * 4096 + 1);
    EXPECT_EQ(moved.data()[1], std::byte((lead + 1) & 0xff));
    moved = Buffer::InAlignedBlock(4096, 4096, 0, 4096);  // frees the plain one
  }
}

}  // namespace
}  // namespace ckptfs
