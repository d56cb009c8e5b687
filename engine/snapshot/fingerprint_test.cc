#include "engine/snapshot/fingerprint.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace ckptfs::snapshot {
namespace {

// The definition of fingerprint.h written out the slow, obvious way: byte by byte.
Fingerprint Reference(const std::vector<unsigned char>& block) {
  auto mix = [](uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
  };
  uint64_t lo = 0, hi = 0;
  const size_t words = (block.size() + 7) / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = 0;
    for (size_t k = 0; k < 8; ++k) {
      size_t at = i * 8 + k;
      if (at < block.size()) w |= uint64_t{block[at]} << (8 * k);
    }
    lo += mix(w ^ (i * 0x9E3779B97F4A7C15ull + 0x243F6A8885A308D3ull));
    hi += mix(w ^ (i * 0xC2B2AE3D27D4EB4Full + 0x13198A2E03707344ull));
  }
  const uint64_t len = block.size();
  return Fingerprint{mix(lo ^ len), mix(hi + len * 0x9E3779B97F4A7C15ull)};
}

TEST(Fingerprint, EqualsTheReferenceForAnySizeAndAlignment) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(70000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t len : {0, 1, 7, 8, 9, 63, 64, 4095, 65536, 65537}) {
    for (size_t shift : {0, 1, 3, 5}) {
      std::vector<unsigned char> block(buf.begin() + shift, buf.begin() + shift + len);
      EXPECT_EQ(FingerprintBlock(buf.data() + shift, len), Reference(block))
          << "len " << len << " shift " << shift;
    }
  }
}

TEST(Fingerprint, AnyChangedBitOrSwappedWordsChangeIt) {
  std::vector<unsigned char> block(4096, 0);
  const Fingerprint zero = FingerprintBlock(block.data(), block.size());
  for (size_t bit = 0; bit < block.size() * 8; bit += 97) {
    block[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(FingerprintBlock(block.data(), block.size()), zero) << bit;
    block[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  block[0] = 1;  // word 0 = 1, word 1 = 0, then swap them
  const Fingerprint a = FingerprintBlock(block.data(), block.size());
  block[0] = 0;
  block[8] = 1;
  EXPECT_NE(FingerprintBlock(block.data(), block.size()), a);
  // Same bytes, different length (zero padding is not enough to collide).
  EXPECT_NE(FingerprintBlock(block.data(), 15), FingerprintBlock(block.data(), 16));
}

}  // namespace
}  // namespace ckptfs::snapshot
