#include "engine/hash/chunk_id.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "engine/codec/vector_level.h"

namespace ckptfs {
namespace {

Bytes Span(const std::vector<std::byte>& v, size_t from, size_t n) {
  return Bytes(v.data() + from, n);
}

// XXH3-64 as Debian's libxxhash computes it: what every record written so far carries.
uint64_t Reference(Bytes data) { return XXH3_64bits(data.data(), data.size()); }

TEST(Checksum64Test, EveryVectorLevelGivesLibxxhashsHashOfOneAndTwoParts) {
  std::vector<std::byte> data((1 << 20) + 4096);
  std::mt19937_64 rng(7);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  // Lengths around each of XXH3's code paths (0, 1-3, 4-8, 9-16, 17-128, 129-240, longer,
  // a stripe and a block boundary, a record), at aligned and odd addresses.
  std::vector<size_t> lengths = {0,   1,    3,    4,    8,    9,     16,     17,      128,
                                 129, 240,  241,  255,  256,  1023,  1024,   1025,    4096,
                                 32,  4127, 8192, 8193, 65536, 99991, 1 << 20, (1 << 20) + 17};
  const CodecVectorLevel before = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
  for (CodecVectorLevel level : {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2,
                                 CodecVectorLevel::kAvx512}) {
    CapCodecVectorLevelForTesting(level);
    for (size_t n : lengths) {
      for (size_t from : {size_t{0}, size_t{1}, size_t{13}}) {
        Bytes whole = Span(data, from, n);
        ASSERT_EQ(Checksum64(whole), Reference(whole))
            << "level " << int(level) << ", " << n << " bytes at +" << from;
        // Split anywhere (a delta record: the 32-byte base id, then the encoded bytes).
        for (size_t cut : {size_t{0}, std::min<size_t>(n, 32), n / 2, n}) {
          ASSERT_EQ(Checksum64(Span(data, from, cut), Span(data, from + cut, n - cut)),
                    Reference(whole))
              << "level " << int(level) << ", " << n << " bytes cut at " << cut;
        }
      }
    }
  }
  CapCodecVectorLevelForTesting(before);
}

TEST(Checksum64Test, AFlippedByteChangesTheHash) {
  std::vector<std::byte> data(100000, std::byte{0x5a});
  const uint64_t h = Checksum64(Span(data, 0, data.size()));
  data[54321] ^= std::byte{1};
  EXPECT_NE(Checksum64(Span(data, 0, data.size())), h);
}

}  // namespace
}  // namespace ckptfs
