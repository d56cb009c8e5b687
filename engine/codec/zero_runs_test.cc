#include "engine/codec/zero_runs.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/codec/codec.h"
#include "engine/codec/rans.h"
#include "engine/codec/vector_level.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

// A plane of `n` bytes with each byte nonzero with probability `p`: small values mostly, as the
// high plane of a delta.
Buffer SparsePlane(size_t n, double p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution nonzero(p);
  std::geometric_distribution<int> value(0.5);
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) {
    b.data()[i] = static_cast<std::byte>(nonzero(rng) ? 1 + value(rng) % 255 : 0);
  }
  return b;
}

bool SameBytes(const Buffer& a, const Buffer& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

Buffer Encode(Bytes in) {
  Buffer out(in.size() + 64);
  const size_t n = ZeroRunsEncodeTo(in, out.data(), out.size());
  out.Resize(n);
  return out;
}

void ExpectRoundTrip(Bytes in, const char* what) {
  Buffer stored = Encode(in);
  size_t nonzero = 0;
  for (std::byte b : in) nonzero += b != std::byte{0};
  if (nonzero > in.size() / 4) {  // refused: too dense for runs to pay
    EXPECT_EQ(stored.size(), 0u) << what;
    return;
  }
  ASSERT_GT(stored.size(), 0u) << what;
  Buffer back(in.size());
  ASSERT_TRUE(ZeroRunsDecode(stored.bytes(), back.mutable_bytes()).ok()) << what;
  EXPECT_TRUE(in.empty() || std::memcmp(back.data(), in.data(), in.size()) == 0) << what;
  // And through Decompress, as a planes container's segment is read.
  Buffer again(in.size());
  ASSERT_TRUE(Decompress(Codec::kZeroRuns, stored.bytes(), again.mutable_bytes()).ok()) << what;
  EXPECT_TRUE(in.empty() || std::memcmp(again.data(), in.data(), in.size()) == 0) << what;
}

TEST(ZeroRunsTest, RoundTripsSparsePlanes) {
  for (double p : {0.0, 0.001, 0.026, 0.1, 0.24}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1000}, size_t{65536},
                     size_t{262147}}) {
      Buffer plane = SparsePlane(n, p, static_cast<uint32_t>(n));
      ExpectRoundTrip(plane.bytes(),
                      ("p " + std::to_string(p) + " n " + std::to_string(n)).c_str());
    }
  }
}

TEST(ZeroRunsTest, RunsAroundTheEscapeLength) {
  // Runs of 254, 255, 256, 509, 510 and 511 zeros, a value at the first and the last byte,
  // and trailing zeros of each of those lengths.
  for (size_t run : {size_t{0}, size_t{1}, size_t{254}, size_t{255}, size_t{256}, size_t{509},
                     size_t{510}, size_t{511}, size_t{5000}}) {
    std::vector<std::byte> v;
    v.push_back(std::byte{7});
    v.insert(v.end(), run, std::byte{0});
    v.push_back(std::byte{255});
    v.insert(v.end(), run, std::byte{0});
    v.push_back(std::byte{1});
    ExpectRoundTrip({v.data(), v.size()}, ("run " + std::to_string(run)).c_str());
    v.insert(v.end(), run, std::byte{0});  // trailing zeros
    ExpectRoundTrip({v.data(), v.size()}, ("trailing " + std::to_string(run)).c_str());
  }
  // All zeros: no runs at all.
  Buffer zeros(100000);
  std::memset(zeros.data(), 0, zeros.size());
  Buffer stored = Encode(zeros.bytes());
  EXPECT_LT(stored.size(), 20u);
  ExpectRoundTrip(zeros.bytes(), "all zeros");
}

TEST(ZeroRunsTest, EveryVectorLevelWritesTheSameBytes) {
  const CodecVectorLevel before = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
  for (double p : {0.0, 0.02, 0.2, 0.26}) {
    for (size_t n : {size_t{31}, size_t{64}, size_t{100}, size_t{4097}, size_t{262147}}) {
      Buffer plane = SparsePlane(n, p, static_cast<uint32_t>(n + 1));
      std::vector<Buffer> encoded;
      for (CodecVectorLevel level :
           {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2, CodecVectorLevel::kAvx512}) {
        CapCodecVectorLevelForTesting(level);
        encoded.push_back(Encode(plane.bytes()));
        EXPECT_TRUE(SameBytes(encoded.back(), encoded.front())) << p << " " << n;
      }
      ExpectRoundTrip(plane.bytes(), "every level");
    }
  }
  CapCodecVectorLevelForTesting(before);
}

TEST(ZeroRunsTest, RefusesDensePlanesAndSmallCapacity) {
  Buffer dense = SparsePlane(65536, 0.5, 1);
  Buffer out(dense.size());
  EXPECT_EQ(ZeroRunsEncodeTo(dense.bytes(), out.data(), out.size()), 0u);
  Buffer sparse = SparsePlane(65536, 0.02, 2);
  Buffer stored = Encode(sparse.bytes());
  ASSERT_GT(stored.size(), 0u);
  Buffer small(stored.size());
  EXPECT_EQ(ZeroRunsEncodeTo(sparse.bytes(), small.data(), stored.size() - 1), 0u);
  EXPECT_EQ(ZeroRunsEncodeTo(sparse.bytes(), small.data(), stored.size()), stored.size());
  EXPECT_EQ(ZeroRunsEncodeTo({}, small.data(), small.size()), 0u);
}

TEST(ZeroRunsTest, StoresAboutWhatRansDoesOnADeltasHighPlane) {
  // 2.6% nonzero, as the bf16 weights' high planes of step 35 -> 40 (docs/engine.md).
  Buffer plane = SparsePlane(1 << 19, 0.026, 3);
  Buffer stored = Encode(plane.bytes());
  Buffer rans(plane.size());
  const size_t rans_size = RansEncodeTo(plane.bytes(), rans.data(), rans.size());
  ASSERT_GT(rans_size, 0u);
  EXPECT_LT(stored.size(), rans_size * 21 / 20);
}

TEST(ZeroRunsTest, ShapeCountsTheValuesAndThoseRightAfterAnother) {
  Buffer plane(1000);
  std::memset(plane.data(), 0, plane.size());
  for (size_t at : {0, 1, 2, 10, 500, 501, 998, 999}) plane.data()[at] = std::byte{7};
  Buffer out(plane.size());
  ZeroRunsShape shape;
  ASSERT_GT(ZeroRunsEncodeTo(plane.bytes(), out.data(), out.size(), &shape), 0u);
  EXPECT_EQ(shape.values, 8u);
  EXPECT_EQ(shape.adjacent, 5u);  // at 0 (the start), 1, 2, 501 and 999
}

TEST(ZeroRunsTest, BlockCodecStoresNoLessWhereFewValuesFollowAnother) {
  // BlockCodecCanBeatZeroRuns (piece_codec.cc) skips lz4 where at most a third of the nonzero
  // bytes follow another: lz4 then spends at least a sequence on each stretch. Random sparse
  // planes up to the density the zero runs accept, and planes where every fourth value has a
  // neighbour.
  for (double p : {0.001, 0.01, 0.05, 0.15, 0.24}) {
    for (bool pairs : {false, true}) {
      Buffer plane = SparsePlane(1 << 18, pairs ? p / 2 : p, 6);
      for (size_t i = 0, k = 0; pairs && i + 1 < plane.size(); ++i) {
        if (plane.data()[i] != std::byte{0} && plane.data()[i + 1] == std::byte{0} &&
            ++k % 4 == 0) {
          plane.data()[++i] = std::byte{3};
        }
      }
      Buffer out(plane.size());
      ZeroRunsShape shape;
      const size_t stored = ZeroRunsEncodeTo(plane.bytes(), out.data(), out.size(), &shape);
      ASSERT_GT(stored, 0u) << p << " " << pairs;
      ASSERT_LE(3 * shape.adjacent, shape.values) << p << " " << pairs;
      Buffer lz4;
      const size_t block =
          TryCompress(CodecSpec{}, plane.bytes(), &lz4) ? lz4.size() : plane.size();
      EXPECT_GE(block, stored) << p << " " << pairs;
    }
  }
}

TEST(ZeroRunsTest, DamageIsCorruptionNeverACrash) {
  Buffer plane = SparsePlane(20000, 0.03, 4);
  Buffer stored = Encode(plane.bytes());
  ASSERT_GT(stored.size(), 0u);
  Buffer out(plane.size());
  // Every truncation.
  for (size_t cut = 0; cut < stored.size(); ++cut) {
    EXPECT_FALSE(ZeroRunsDecode(stored.bytes().first(cut), out.mutable_bytes()).ok()) << cut;
  }
  // Bad header fields: more runs than bytes, an unknown stream mode, trailing bytes.
  {
    Buffer bad(stored.bytes());
    PutLE<uint32_t>(bad.data(), static_cast<uint32_t>(plane.size() + 1));
    EXPECT_FALSE(ZeroRunsDecode(bad.bytes(), out.mutable_bytes()).ok());
  }
  {
    Buffer bad(stored.bytes());
    bad.data()[4] = std::byte{9};
    EXPECT_FALSE(ZeroRunsDecode(bad.bytes(), out.mutable_bytes()).ok());
  }
  {
    Buffer bad(stored.size() + 1);
    std::memcpy(bad.data(), stored.data(), stored.size());
    bad.data()[stored.size()] = std::byte{0};
    EXPECT_FALSE(ZeroRunsDecode(bad.bytes(), out.mutable_bytes()).ok());
  }
  // Raw streams whose runs run past the plane.
  {
    const uint8_t runs[] = {200, 255, 255};
    Buffer bad(4 + 5 + sizeof(runs) + 5 + 1);
    PutLE<uint32_t>(bad.data(), 3);
    bad.data()[4] = std::byte{0};
    PutLE<uint32_t>(bad.data() + 5, 3);
    std::memcpy(bad.data() + 9, runs, 3);
    bad.data()[12] = std::byte{0};
    PutLE<uint32_t>(bad.data() + 13, 1);
    bad.data()[17] = std::byte{5};
    Buffer small_out(600);
    EXPECT_FALSE(ZeroRunsDecode(bad.bytes(), small_out.mutable_bytes()).ok());
    Buffer exact(201);  // 200 zeros and the value; the escapes run 510 zeros past it
    EXPECT_FALSE(ZeroRunsDecode(bad.bytes(), exact.mutable_bytes()).ok());
    Buffer enough(711);
    ASSERT_TRUE(ZeroRunsDecode(bad.bytes(), enough.mutable_bytes()).ok());
    EXPECT_EQ(enough.data()[200], std::byte{5});
  }
  // Flipped bits anywhere: a status either way, and when it decodes, exactly the plane's size.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    Buffer bad(stored.bytes());
    bad.data()[rng() % bad.size()] ^= static_cast<std::byte>(1 << (rng() % 8));
    (void)ZeroRunsDecode(bad.bytes(), out.mutable_bytes());
  }
}

}  // namespace
}  // namespace ckptfs
