#include "engine/chunk/fastcdc.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

namespace ckptfs {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

// Chunk lengths of `data` fed to the chunker in pieces of `piece` bytes.
std::vector<size_t> Cuts(const std::vector<std::byte>& data, size_t piece,
                         const FastCdc::Params& p) {
  FastCdc cdc(p);
  std::vector<size_t> lengths;
  size_t current = 0;
  Bytes rest(data);
  while (!rest.empty()) {
    Bytes in = rest.first(std::min(piece, rest.size()));
    while (!in.empty()) {
      size_t n = cdc.Scan(in);
      current += n;
      in = in.subspan(n);
      if (cdc.AtCut()) {
        lengths.push_back(current);
        current = 0;
      }
    }
    rest = rest.subspan(std::min(piece, rest.size()));
  }
  if (current > 0) lengths.push_back(current);
  return lengths;
}

FastCdc::Params Small() { return {4096, 16384, 65536}; }

TEST(FastCdc, BoundariesDoNotDependOnHowBytesArrive) {
  auto data = RandomBytes(4 << 20, 1);
  auto whole = Cuts(data, data.size(), Small());
  EXPECT_EQ(whole, Cuts(data, 1000, Small()));
  EXPECT_EQ(whole, Cuts(data, 7777, Small()));
  EXPECT_EQ(whole, Cuts(data, 1, Small()));
}

TEST(FastCdc, SizesStayWithinBoundsAndAverageNearTarget) {
  auto data = RandomBytes(16 << 20, 2);
  auto cuts = Cuts(data, 1 << 20, Small());
  size_t total = 0;
  for (size_t i = 0; i < cuts.size(); ++i) {
    total += cuts[i];
    if (i + 1 < cuts.size()) {
      EXPECT_GE(cuts[i], Small().min_size);
    }
    EXPECT_LE(cuts[i], Small().max_size);
  }
  EXPECT_EQ(total, data.size());
  double avg = static_cast<double>(total) / static_cast<double>(cuts.size());
  EXPECT_GT(avg, 0.5 * Small().avg_size);
  EXPECT_LT(avg, 2.0 * Small().avg_size);
}

TEST(FastCdc, AnInsertionMovesOnlyNearbyBoundaries) {
  auto data = RandomBytes(8 << 20, 3);
  auto edited = data;
  auto extra = RandomBytes(100, 4);
  edited.insert(edited.begin() + (4 << 20), extra.begin(), extra.end());
  auto a = Cuts(data, 1 << 16, Small());
  auto b = Cuts(edited, 1 << 16, Small());
  // Chunks are identical up to the edit and again after it: count the common ones.
  std::multiset<size_t> sa(a.begin(), a.end());
  size_t common = 0;
  for (size_t len : b) {
    auto it = sa.find(len);
    if (it != sa.end()) {
      ++common;
      sa.erase(it);
    }
  }
  EXPECT_GE(common + 4, a.size());
}

TEST(FastCdc, ZerosCutAtMaximumSize) {
  std::vector<std::byte> zeros(1 << 20);
  auto cuts = Cuts(zeros, zeros.size(), Small());
  ASSERT_FALSE(cuts.empty());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) EXPECT_EQ(cuts[i], cuts[0]);
}

TEST(FastCdc, ValidateRejectsBadParameters) {
  EXPECT_TRUE(FastCdc::Validate(FastCdc::Params{}).ok());
  EXPECT_FALSE(FastCdc::Validate({4096, 10000, 65536}).ok());  // avg not a power of two
  EXPECT_FALSE(FastCdc::Validate({65536, 16384, 131072}).ok());
  EXPECT_FALSE(FastCdc::Validate({16, 16384, 65536}).ok());
}

}  // namespace
}  // namespace ckptfs
