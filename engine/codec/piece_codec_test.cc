#include "engine/codec/piece_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine/codec/vector_level.h"

namespace ckptfs {
namespace {

// fp32 weights of a "layer": N(0, 0.02), and the same after a small update.
std::vector<float> Weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> w(n);
  for (float& x : w) x = d(rng);
  return w;
}

// memcmp(a, b, n) == 0, also for n == 0 where a buffer may be null (memcmp must not see null).
bool SameBytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

Buffer ToBuffer(const void* data, size_t bytes) {
  return Buffer(Bytes(static_cast<const std::byte*>(data), bytes));
}

void ExpectRoundTrip(const EncodedPiece& p, const Buffer& original, const Buffer* base) {
  Buffer back(original.size());
  ASSERT_TRUE(DecodePiece(p.encoding, p.stored_raw() ? original.bytes() : p.stored.bytes(),
                          base ? base->bytes() : Bytes{}, back.mutable_bytes())
                  .ok());
  ASSERT_TRUE(SameBytes(back.data(), original.data(), original.size()));
}

TEST(PieceCodecTest, EveryTransformRoundTripsForEveryWidthAndTail) {
  const CodecSpec spec = *CodecSpec::Parse("zstd:3");
  std::mt19937 rng(7);
  for (uint8_t width : {1, 2, 3, 4, 8}) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4096 + 3}, size_t{200001}}) {
      std::vector<uint8_t> a(size), b(size);
      for (size_t i = 0; i < size; ++i) {
        a[i] = static_cast<uint8_t>(rng() % 7);  // compressible, so transforms get chosen
        b[i] = static_cast<uint8_t>(a[i] + (rng() % 3 == 0));
      }
      Buffer base = ToBuffer(a.data(), size);
      Buffer raw = ToBuffer(b.data(), size);
      EncodedPiece p = EncodePiece(spec, raw.bytes(), width, &base);
      SCOPED_TRACE(std::string(TransformName(p.encoding.transform)) + " width " +
                   std::to_string(width) + " size " + std::to_string(size));
      ExpectRoundTrip(p, raw, &base);
    }
  }
}

TEST(PieceCodecTest, EachTransformIsExactlyInvertedForEveryWidth) {
  const CodecSpec spec = *CodecSpec::Parse("lz4");
  std::mt19937_64 rng(11);
  for (uint8_t width = 1; width <= kMaxPieceWidth; ++width) {
    const size_t size = 3000 * width + width / 2;  // and a tail
    Buffer base(size), raw(size);
    for (size_t i = 0; i < size; ++i) {
      base.data()[i] = static_cast<std::byte>(rng());
      raw.data()[i] =
          static_cast<std::byte>(i % 5 == 0 ? rng() : static_cast<uint64_t>(base.data()[i]));
    }
    for (Transform t : {Transform::kPlanes, Transform::kXor, Transform::kSub}) {
      Buffer stored = EncodePieceAs(spec, raw.bytes(), t, width, &base);
      Buffer back(size);
      ASSERT_TRUE(
          DecodePiece({t, width, spec.codec}, stored.bytes(), base.bytes(), back.mutable_bytes())
              .ok());
      ASSERT_TRUE(SameBytes(back.data(), raw.data(), size))
          << TransformName(t) << " width " << int{width};
    }
  }
}

TEST(PieceCodecTest, SubOfSmallChangesOfEitherSignLeavesHighPlanesZero) {
  const size_t n = 1 << 14;
  std::vector<uint32_t> a(n), b(n);
  std::mt19937 rng(12);
  for (size_t i = 0; i < n; ++i) {
    a[i] = rng();
    b[i] = a[i] + static_cast<uint32_t>(static_cast<int32_t>(rng() % 201) - 100);
  }
  Buffer base = ToBuffer(a.data(), n * 4), raw = ToBuffer(b.data(), n * 4);
  Buffer stored = EncodePieceAs(*CodecSpec::Parse("none"), raw.bytes(), Transform::kSub, 4, &base);
  // Uncompressed planes: segment headers of 5 bytes, then each plane of n bytes.
  const std::byte* plane2 = stored.data() + 3 * 5 + 2 * n;
  const std::byte* plane3 = stored.data() + 4 * 5 + 3 * n;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(plane2[i], std::byte{0}) << i;
    ASSERT_EQ(plane3[i], std::byte{0}) << i;
  }
}

TEST(PieceCodecTest, DeltaOfASmallUpdateBeatsPlanesWhichBeatPlain) {
  const CodecSpec spec = *CodecSpec::Parse("zstd:3");
  const size_t n = 256 << 10;  // 1 MiB of fp32
  std::vector<float> v1 = Weights(n, 1), v2 = v1;
  std::mt19937 rng(2);
  std::normal_distribution<float> step(0.0f, 1e-5f);
  for (float& x : v2) x += step(rng);
  Buffer base = ToBuffer(v1.data(), n * 4);
  Buffer raw2 = ToBuffer(v2.data(), n * 4);

  Buffer plain_out;
  const size_t plain = TryCompress(spec, raw2.bytes(), &plain_out) ? plain_out.size() : n * 4;
  EncodedPiece planes = EncodePiece(spec, raw2.bytes(), 4, nullptr);
  EncodedPiece delta = EncodePiece(spec, raw2.bytes(), 4, &base);
  EXPECT_EQ(planes.encoding.transform, Transform::kPlanes);
  EXPECT_TRUE(IsDelta(delta.encoding.transform));
  EXPECT_LT(planes.stored.size(), plain);
  EXPECT_LT(delta.stored.size(), planes.stored.size());
  ExpectRoundTrip(delta, raw2, &base);
  ExpectRoundTrip(planes, raw2, nullptr);
}

TEST(PieceCodecTest, IncompressibleBytesStayPlainAndUncopied) {
  std::mt19937_64 rng(3);
  std::vector<uint64_t> noise(1 << 14);
  for (auto& x : noise) x = rng();
  Buffer raw = ToBuffer(noise.data(), noise.size() * 8);
  EncodedPiece p = EncodePiece(*CodecSpec::Parse("lz4"), raw.bytes(), 4, nullptr);
  EXPECT_EQ(p.encoding.transform, Transform::kPlain);
  EXPECT_EQ(p.encoding.codec, Codec::kNone);
  EXPECT_TRUE(p.stored_raw());
  EXPECT_TRUE(p.stored.empty());
}

TEST(PieceCodecTest, MalformedContainersAreCorruptionNotCrashes) {
  const CodecSpec spec = *CodecSpec::Parse("lz4");
  std::vector<float> w = Weights(4096, 4);
  Buffer original = ToBuffer(w.data(), w.size() * 4);
  EncodedPiece p = EncodePiece(spec, original.bytes(), 4, nullptr);
  ASSERT_EQ(p.encoding.transform, Transform::kPlanes);
  Buffer out(original.size());
  // Every truncation fails.
  for (size_t cut = 0; cut < p.stored.size(); cut += 97) {
    EXPECT_FALSE(
        DecodePiece(p.encoding, p.stored.bytes().first(cut), {}, out.mutable_bytes()).ok());
  }
  // Flipped bytes either fail or decode to something the caller's SHA-256 check rejects.
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    Buffer bad(p.stored.bytes());
    bad.data()[rng() % bad.size()] ^= std::byte{0x5a};
    (void)DecodePiece(p.encoding, bad.bytes(), {}, out.mutable_bytes());
  }
  // A delta without its base fails.
  PieceEncoding xor_enc{Transform::kXor, 4, Codec::kLz4};
  EXPECT_FALSE(DecodePiece(xor_enc, p.stored.bytes(), {}, out.mutable_bytes()).ok());
  PieceEncoding unknown{static_cast<Transform>(9), 4, Codec::kLz4};
  EXPECT_FALSE(DecodePiece(unknown, p.stored.bytes(), {}, out.mutable_bytes()).ok());
}

TEST(PieceCodecTest, AutoHuffmanCodesTheExponentPlaneAndStoresMantissaRaw) {
  const size_t n = 256 << 10;  // 1 MiB of fp32
  std::vector<float> w = Weights(n, 6);
  Buffer raw = ToBuffer(w.data(), n * 4);
  EncodedPiece a = EncodePiece(CodecSpec{}, raw.bytes(), 4, nullptr);
  EncodedPiece l = EncodePiece(*CodecSpec::Parse("lz4"), raw.bytes(), 4, nullptr);
  ASSERT_EQ(a.encoding.transform, Transform::kPlanes);
  ExpectRoundTrip(a, raw, nullptr);
  // The elements rotated (an empty segment of kind 0x41 first), then planes 0..2 (mantissa, and
  // the sign in plane 0) raw, plane 3 (the exponent) Huffman.
  const std::byte* seg = a.stored.data();
  EXPECT_EQ(static_cast<uint8_t>(seg[0]), 0x41);
  EXPECT_EQ(static_cast<Codec>(seg[5]), Codec::kNone);
  EXPECT_EQ(static_cast<Codec>(seg[10 + n]), Codec::kNone);
  size_t pos = 5;
  Codec codecs[5];
  for (int s = 0; s < 5; ++s) {
    codecs[s] = static_cast<Codec>(seg[pos]);
    uint32_t len;
    std::memcpy(&len, seg + pos + 1, 4);
    pos += 5 + len;
  }
  EXPECT_EQ(codecs[3], Codec::kHuffman);
  EXPECT_EQ(pos, a.stored.size());
  // N(0, 0.02) weights: the exponent byte has ~2.7 bits of entropy; lz4 finds little.
  EXPECT_LT(a.stored.size(), 0.85 * raw.size());
  EXPECT_LT(a.stored.size() + raw.size() / 20, l.stored_raw() ? raw.size() : l.stored.size());
}

TEST(PieceCodecTest, AutoRoundTripsBf16AndDeltasOfEveryWidth) {
  std::mt19937 rng(8);
  for (uint8_t width : {1, 2, 4, 8}) {
    for (size_t size : {size_t{5}, size_t{4096 + 3}, size_t{300001}}) {
      std::vector<float> w = Weights(size / 4 + 2, static_cast<uint32_t>(size));
      Buffer base = ToBuffer(w.data(), size);
      for (float& x : w) x *= 1.0f + 1e-3f * static_cast<float>(rng() % 7);
      Buffer raw = ToBuffer(w.data(), size);
      for (const Buffer* b :
           {static_cast<const Buffer*>(nullptr), static_cast<const Buffer*>(&base)}) {
        EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), width, b);
        SCOPED_TRACE(std::string(TransformName(p.encoding.transform)) + " width " +
                     std::to_string(width) + " size " + std::to_string(size));
        ExpectRoundTrip(p, raw, b);
      }
    }
  }
}

// The codecs of a container's segments, in order (the first `skip` bytes are option segments).
std::vector<Codec> SegmentCodecs(const Buffer& stored) {
  std::vector<Codec> codecs;
  for (size_t pos = 0; pos + 5 <= stored.size();) {
    codecs.push_back(static_cast<Codec>(stored.data()[pos]));
    uint32_t len;
    std::memcpy(&len, stored.data() + pos + 1, 4);
    pos += 5 + len;
  }
  return codecs;
}

TEST(PieceCodecTest, ZeroRunsOrRansTakeTheTopPlaneOfADeltaAndRoundTrip) {
  // A bf16 training step's sub delta: its top plane mostly one value and a few small others
  // (~0.8 bit of entropy, where Huffman spends ~1.2), its low plane noise. Built on the delta
  // itself: each element is the base plus the difference whose zigzag form has that top byte.
  // Where the common value is zero (a delta's high plane), the zero runs take it; where it is
  // not (no runs of zeros to code), rANS.
  for (int common : {0, 1}) {
    const size_t n = 256 << 10;
    std::mt19937 rng(13);
    std::discrete_distribution<int> top({85, 9, 4, 2});
    std::vector<uint16_t> base(n), next(n), zs(n);
    for (size_t i = 0; i < n; ++i) {
      base[i] = static_cast<uint16_t>(rng());
      const int t = top(rng);
      const int byte = t == 0 ? common : (t == common ? 0 : t);
      const uint16_t z = zs[i] = static_cast<uint16_t>(byte << 8 | (rng() & 0xff));
      const uint16_t d = static_cast<uint16_t>((z >> 1) ^ (0 - (z & 1)));  // zigzag, inverted
      next[i] = static_cast<uint16_t>(base[i] + d);
    }
    Buffer b = ToBuffer(base.data(), n * 2), raw = ToBuffer(next.data(), n * 2);
    EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), 2, &b);
    ASSERT_EQ(p.encoding.transform, Transform::kSub);
    const std::vector<Codec> codecs = SegmentCodecs(p.stored);
    ASSERT_EQ(codecs.size(), 3u);  // two planes and the tail
    EXPECT_EQ(codecs[0], Codec::kNone);
    EXPECT_EQ(codecs[1], common == 0 ? Codec::kZeroRuns : Codec::kRans) << common;
    ExpectRoundTrip(p, raw, &b);
    // Smaller than Huffman would store the top plane: both coders get near the entropy.
    EXPECT_LT(p.stored.size(), n + n * 9 / 80) << common;
    // The same bytes as a whole piece keep Huffman: the newest version, which restores read,
    // is whole and decodes fast.
    Buffer same = ToBuffer(zs.data(), n * 2);
    EncodedPiece whole = EncodePiece(CodecSpec{}, same.bytes(), 2, nullptr);
    const std::vector<Codec> whole_codecs = SegmentCodecs(whole.stored);
    EXPECT_NE(std::find(whole_codecs.begin(), whole_codecs.end(), Codec::kHuffman),
              whole_codecs.end());
    for (Codec c : {Codec::kRans, Codec::kZeroRuns}) {
      EXPECT_EQ(std::find(whole_codecs.begin(), whole_codecs.end(), c), whole_codecs.end());
    }
  }
}

TEST(PieceCodecTest, BlockCodecBytesSurviveAnEntropyCoderThatDoesNotFitUnderThem) {
  // A delta whose changes sit in one run (3% of the elements replaced): its top plane is long
  // runs of zeros, which lz4 stores in less than the plane's order-0 entropy. rANS is smaller
  // than Huffman there, so it is tried, and must not leave its bytes over lz4's.
  const size_t n = 256 << 10;
  std::vector<float> w = Weights(n, 14);
  Buffer base = ToBuffer(w.data(), n * 4);
  std::vector<float> other = Weights(n / 33, 15);
  std::copy(other.begin(), other.end(), w.begin() + n / 2);
  Buffer raw = ToBuffer(w.data(), n * 4);
  EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), 4, &base);
  const std::vector<Codec> codecs = SegmentCodecs(p.stored);
  EXPECT_NE(std::find(codecs.begin(), codecs.end(), Codec::kLz4), codecs.end());
  ExpectRoundTrip(p, raw, &base);
}

TEST(PieceCodecTest, CorruptedHuffmanPlanesAreCorruptionOrCaughtByTheChecksum) {
  std::vector<float> w = Weights(1 << 15, 9);
  Buffer original = ToBuffer(w.data(), w.size() * 4);
  EncodedPiece p = EncodePiece(CodecSpec{}, original.bytes(), 4, nullptr);
  ASSERT_EQ(p.encoding.transform, Transform::kPlanes);
  Buffer out(original.size());
  for (size_t cut = 0; cut < p.stored.size(); cut += 61) {
    EXPECT_FALSE(
        DecodePiece(p.encoding, p.stored.bytes().first(cut), {}, out.mutable_bytes()).ok());
  }
  std::mt19937 rng(10);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    Buffer bad(p.stored.bytes());
    for (int f = 0; f <= i % 3; ++f) {
      bad.data()[rng() % bad.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    }
    Status s = DecodePiece(p.encoding, bad.bytes(), {}, out.mutable_bytes());
    // What decodes is wrong bytes only where a flip hit a raw mantissa plane or a code of the
    // same length; the record's XXH3 and the chunk's SHA-256 reject those.
    rejected += !s.ok();
  }
  EXPECT_GT(rejected, 0);
}

// Adam's exp_avg_sq one saved version later: decayed by beta2^5 and refreshed by a little new
// gradient; the new gradient varies per element.
std::pair<Buffer, Buffer> DecayingMoment(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<float> v0(-12.0f, 1.5f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> a(n), b(n);
  const float decay = std::pow(0.999f, 5.0f) * 0.9f;
  for (size_t i = 0; i < n; ++i) {
    a[i] = v0(rng);
    const float gi = g(rng) * 1e-3f * std::sqrt(a[i]);
    b[i] = a[i] * decay + 0.001f * gi * gi;
  }
  return {ToBuffer(a.data(), n * 4), ToBuffer(b.data(), n * 4)};
}

TEST(PieceCodecTest, ScaledPredictionIsChosenForADecayingMomentAndRoundTrips) {
  auto [base, raw] = DecayingMoment(256 << 10, 21);
  EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), 4, &base);
  ASSERT_EQ(p.encoding.transform, Transform::kSub);
  ASSERT_FALSE(p.stored.empty());
  EXPECT_EQ(static_cast<uint8_t>(p.stored.data()[0]), 0x40);  // the factor's segment
  ExpectRoundTrip(p, raw, &base);
  // It beats sub against the unscaled base by a wide margin on such data.
  Buffer unscaled = EncodePieceAs(CodecSpec{}, raw.bytes(), Transform::kSub, 4, &base);
  EXPECT_LT(p.stored.size() * 10, unscaled.size() * 9);
  // Weights that moved a little: no factor (the prediction would be the base itself).
  std::vector<float> w = Weights(1 << 16, 22), w2 = w;
  for (float& x : w2) x += 1e-5f;
  Buffer wb = ToBuffer(w.data(), w.size() * 4), wr = ToBuffer(w2.data(), w2.size() * 4);
  EncodedPiece q = EncodePiece(CodecSpec{}, wr.bytes(), 4, &wb);
  ASSERT_EQ(q.encoding.transform, Transform::kSub);
  EXPECT_NE(static_cast<uint8_t>(q.stored.data()[0]), 0x40);
  ExpectRoundTrip(q, wr, &wb);
}

// The factor a container of scaled sub records (its 0x40 segment).
float RecordedFactor(const EncodedPiece& p) {
  if (p.stored.size() < 9 || static_cast<uint8_t>(p.stored.data()[0]) != 0x40) return 0;
  float f;
  std::memcpy(&f, p.stored.data() + 5, 4);
  return f;
}

TEST(PieceCodecTest, ScaledPredictionTakesAdamsDecayWhereItBoundsTheRatios) {
  // exp_avg_sq five steps on: every element decays by exactly beta2^5 and gains (1 - beta2) g^2
  // per step. Late in training most gradients are small beside the squares the moment still
  // holds (a gradient scale per element, spread over orders of magnitude), so the ratios new /
  // old crowd at beta2^5 and lie above it, and old / new at or below its inverse; the median lies
  // inside.
  constexpr size_t n = 256 << 10;
  std::mt19937 rng(31);
  std::lognormal_distribution<float> v0(-12.0f, 1.5f), scale(-2.0f, 1.5f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> old_v(n), new_v(n);
  const float decay = 0.99f * 0.99f * 0.99f * 0.99f * 0.99f;
  for (size_t i = 0; i < n; ++i) {
    old_v[i] = v0(rng);
    const float s = scale(rng) * std::sqrt(old_v[i]);
    float v = old_v[i];
    for (int step = 0; step < 5; ++step) {
      const float gi = g(rng) * s;
      v = 0.99f * v + 0.01f * gi * gi;
    }
    new_v[i] = v;
  }
  Buffer old_b = ToBuffer(old_v.data(), n * 4), new_b = ToBuffer(new_v.data(), n * 4);
  auto median_ratio = [&](const std::vector<float>& num, const std::vector<float>& den) {
    std::vector<float> r(n);
    for (size_t i = 0; i < n; ++i) r[i] = num[i] / den[i];
    std::nth_element(r.begin(), r.begin() + n / 2, r.end());
    return r[n / 2];
  };
  // Forward (the new version against the old) and reverse (the old against the new, as the
  // re-encoder stores it).
  for (bool reverse : {false, true}) {
    const Buffer& raw = reverse ? old_b : new_b;
    const Buffer& base = reverse ? new_b : old_b;
    EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), 4, &base);
    ASSERT_EQ(p.encoding.transform, Transform::kSub);
    ExpectRoundTrip(p, raw, &base);
    const float envelope = reverse ? 1.0f / decay : decay;
    EXPECT_NEAR(RecordedFactor(p), envelope, envelope * 2e-4f) << "reverse " << reverse;
    // Smaller than the same container with the median ratio as its factor.
    const float median = reverse ? median_ratio(old_v, new_v) : median_ratio(new_v, old_v);
    Buffer with_median = EncodeScaledSub(CodecSpec{}, raw.bytes(), base, median);
    EXPECT_LT(p.stored.size() * 100, with_median.size() * 97) << "reverse " << reverse;
  }
}

TEST(PieceCodecTest, ScaledPredictionIsExactOnSpecialValuesAndOddLengths) {
  // NaN (with payloads), infinities, zeros of both signs, subnormals, the largest floats
  // (whose product overflows) and the smallest normals (whose product underflows).
  const uint32_t specials[] = {0x7fc00000, 0x7f800001, 0xffc01234, 0x7f800000, 0xff800000,
                               0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x7f7fffff,
                               0xff7fffff, 0x00800000, 0x80800000, 0x3f800000, 0x4b000000};
  for (float scale : {0.5f, 0.994f, 1.75f, 3.0e38f, 1.0e-30f}) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{61}, size_t{4099}}) {
      std::mt19937 rng(static_cast<uint32_t>(size));
      Buffer base(size), raw(size);
      for (size_t i = 0; i < size; ++i) {
        base.data()[i] = static_cast<std::byte>(rng());
        raw.data()[i] = static_cast<std::byte>(rng());
      }
      for (size_t i = 0; i + 4 <= size; i += 4) {
        const uint32_t b = specials[(i / 4) % std::size(specials)];
        const uint32_t v = specials[(i / 4 + 3) % std::size(specials)];
        std::memcpy(base.data() + i, &b, 4);
        if (i % 8 == 0) std::memcpy(raw.data() + i, &v, 4);
      }
      Buffer stored = EncodeScaledSub(CodecSpec{}, raw.bytes(), base, scale);
      Buffer back(size);
      ASSERT_TRUE(DecodePiece({Transform::kSub, 4, Codec::kLz4}, stored.bytes(), base.bytes(),
                              back.mutable_bytes())
                      .ok())
          << "scale " << scale << " size " << size;
      ASSERT_TRUE(SameBytes(back.data(), raw.data(), size)) << scale << " " << size;
    }
  }
  // All-equal pieces, with and without a factor.
  std::vector<float> ones(1 << 12, 1.0f), twos(1 << 12, 2.0f);
  Buffer b1 = ToBuffer(ones.data(), ones.size() * 4), r2 = ToBuffer(twos.data(), twos.size() * 4);
  EncodedPiece p = EncodePiece(CodecSpec{}, r2.bytes(), 4, &b1);
  ExpectRoundTrip(p, r2, &b1);
  EXPECT_LT(p.stored_raw() ? r2.size() : p.stored.size(), r2.size() / 50);
}

TEST(PieceCodecTest, MalformedPredictionSegmentsAreCorruption) {
  auto [base, raw] = DecayingMoment(4096 + 1, 23);
  Buffer stored = EncodeScaledSub(CodecSpec{}, raw.bytes(), base, 0.9f);
  Buffer out(raw.size());
  const PieceEncoding sub4{Transform::kSub, 4, Codec::kLz4};
  ASSERT_TRUE(DecodePiece(sub4, stored.bytes(), base.bytes(), out.mutable_bytes()).ok());
  // Truncations.
  for (size_t cut = 0; cut < stored.size(); cut += 37) {
    EXPECT_FALSE(
        DecodePiece(sub4, stored.bytes().first(cut), base.bytes(), out.mutable_bytes()).ok());
  }
  // The factor's segment in a container of another width or transform, with another length,
  // or a factor that is not a normal float.
  EXPECT_FALSE(DecodePiece({Transform::kSub, 2, Codec::kLz4}, stored.bytes(), base.bytes(),
                           out.mutable_bytes())
                   .ok());
  EXPECT_FALSE(DecodePiece({Transform::kXor, 4, Codec::kLz4}, stored.bytes(), base.bytes(),
                           out.mutable_bytes())
                   .ok());
  EXPECT_FALSE(
      DecodePiece({Transform::kPlanes, 4, Codec::kLz4}, stored.bytes(), {}, out.mutable_bytes())
          .ok());
  for (uint32_t bad_len : {0u, 3u, 5u, 0xffffffffu}) {
    Buffer bad(stored.bytes());
    std::memcpy(bad.data() + 1, &bad_len, 4);
    EXPECT_FALSE(DecodePiece(sub4, bad.bytes(), base.bytes(), out.mutable_bytes()).ok());
  }
  for (uint32_t bad_factor : {0x00000000u, 0x00000001u, 0x7f800000u, 0x7fc00000u}) {
    Buffer bad(stored.bytes());
    std::memcpy(bad.data() + 5, &bad_factor, 4);
    EXPECT_FALSE(DecodePiece(sub4, bad.bytes(), base.bytes(), out.mutable_bytes()).ok());
  }
}

// Weights (fp32: width 4, or bf16: width 2) N(0, 0.02) and the same after an optimizer step:
// each moves by about `step` (times a factor in [0.5, 1.5), either sign) whatever its size, as
// Adam's do; every 997th base element a special value (zero, subnormal, Inf, NaN). n elements
// and a `tail` of stray bytes.
std::pair<Buffer, Buffer> SteppedWeights(uint8_t width, size_t n, float step, size_t tail,
                                         uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  const uint32_t specials[] = {0x00000000, 0x80000000, 0x00000001, 0x7f800000, 0x7fc00000};
  Buffer base(n * width + tail), raw(n * width + tail);
  for (size_t i = 0; i < n; ++i) {
    const float w = d(rng);
    const float moved = w + (rng() & 1 ? step : -step) * u(rng);
    uint32_t a, b;
    std::memcpy(&a, &w, 4);
    std::memcpy(&b, &moved, 4);
    if (i % 997 == 0) a = specials[(i / 997) % std::size(specials)];
    if (width == 2) {  // bf16: the top half
      const auto ha = static_cast<uint16_t>(a >> 16), hb = static_cast<uint16_t>(b >> 16);
      std::memcpy(base.data() + 2 * i, &ha, 2);
      std::memcpy(raw.data() + 2 * i, &hb, 2);
    } else {
      std::memcpy(base.data() + 4 * i, &a, 4);
      std::memcpy(raw.data() + 4 * i, &b, 4);
    }
  }
  for (size_t k = n * width; k < base.size(); ++k) {
    base.data()[k] = static_cast<std::byte>(rng());
    raw.data()[k] = static_cast<std::byte>(rng());
  }
  return {std::move(base), std::move(raw)};
}

// Where the split segment (0x43) starts in a sub container (first, or after the factor's), or
// SIZE_MAX.
size_t SplitSegmentAt(const Buffer& stored) {
  for (size_t at : {size_t{0}, size_t{9}}) {
    if (stored.size() > at && static_cast<uint8_t>(stored.data()[at]) == 0x43) return at;
  }
  return SIZE_MAX;
}

TEST(PieceCodecTest, PlanesSplitByTheBaseMagnitudeForWeightUpdatesAndRoundTrip) {
  for (uint8_t width : {4, 2}) {
    for (size_t tail : {size_t{0}, size_t{1}, size_t{width - 1u}}) {
      SCOPED_TRACE("width " + std::to_string(width) + " tail " + std::to_string(tail));
      auto [base, raw] = SteppedWeights(width, 256 << 10, 2e-4f, tail, 41 + width);
      EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), width, &base);
      ASSERT_EQ(p.encoding.transform, Transform::kSub);
      EXPECT_NE(SplitSegmentAt(p.stored), SIZE_MAX);
      ExpectRoundTrip(p, raw, &base);
      // Smaller than sub without the split (which EncodePieceAs writes), by a margin.
      Buffer unsplit = EncodePieceAs(CodecSpec{}, raw.bytes(), Transform::kSub, width, &base);
      EXPECT_EQ(SplitSegmentAt(unsplit), SIZE_MAX);
      EXPECT_LT(p.stored.size() * 20, unsplit.size() * 19)
          << p.stored.size() << " vs " << unsplit.size();
    }
  }
}

TEST(PieceCodecTest, PlanesAreNotSplitWhereTheChangeDoesNotFollowTheBase) {
  // Changes of random size (the difference's bits do not depend on the base's magnitude), and
  // pieces too small to pay for the tables.
  const size_t n = 256 << 10;
  std::mt19937 rng(43);
  std::vector<float> a = Weights(n, 44), b(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, &a[i], 4);
    x += static_cast<uint32_t>(rng() % 4096) - 2048;
    std::memcpy(&b[i], &x, 4);
  }
  Buffer base = ToBuffer(a.data(), n * 4), raw = ToBuffer(b.data(), n * 4);
  EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), 4, &base);
  ASSERT_EQ(p.encoding.transform, Transform::kSub);
  EXPECT_EQ(SplitSegmentAt(p.stored), SIZE_MAX);
  ExpectRoundTrip(p, raw, &base);
  auto [small_base, small_raw] = SteppedWeights(4, 4096, 2e-4f, 0, 45);
  EncodedPiece q = EncodePiece(CodecSpec{}, small_raw.bytes(), 4, &small_base);
  EXPECT_EQ(SplitSegmentAt(q.stored), SIZE_MAX);
  ExpectRoundTrip(q, small_raw, &small_base);
}

TEST(PieceCodecTest, MalformedSplitSegmentsAreCorruption) {
  auto [base, raw] = SteppedWeights(4, 64 << 10, 2e-4f, 3, 47);
  EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), 4, &base);
  const size_t at = SplitSegmentAt(p.stored);
  ASSERT_NE(at, SIZE_MAX);
  Buffer out(raw.size());
  ASSERT_TRUE(DecodePiece(p.encoding, p.stored.bytes(), base.bytes(), out.mutable_bytes()).ok());
  for (size_t cut = 0; cut < p.stored.size(); cut += 97) {
    EXPECT_FALSE(
        DecodePiece(p.encoding, p.stored.bytes().first(cut), base.bytes(), out.mutable_bytes())
            .ok());
  }
  // In a container of another width or transform.
  EXPECT_FALSE(DecodePiece({Transform::kSub, 8, Codec::kLz4}, p.stored.bytes(), base.bytes(),
                           out.mutable_bytes())
                   .ok());
  for (Transform t : {Transform::kXor, Transform::kPlanes}) {
    EXPECT_FALSE(
        DecodePiece({t, 4, Codec::kLz4}, p.stored.bytes(), base.bytes(), out.mutable_bytes()).ok());
  }
  // A bad length, bucket count, plane mask or thresholds (zero, not increasing).
  const uint8_t buckets = static_cast<uint8_t>(p.stored.data()[at + 5]);
  ASSERT_GE(buckets, 3);
  for (auto [offset, value] : {std::pair<size_t, uint8_t>{1, 0},
                               {1, 200},
                               {5, 0},
                               {5, 1},
                               {5, 9},
                               {6, 0},
                               {6, 0x10},
                               {6, 0x80},
                               {7, 0},
                               {8, static_cast<uint8_t>(p.stored.data()[at + 7])}}) {
    Buffer bad(p.stored.bytes());
    bad.data()[at + offset] = static_cast<std::byte>(value);
    EXPECT_FALSE(DecodePiece(p.encoding, bad.bytes(), base.bytes(), out.mutable_bytes()).ok())
        << offset << " " << int{value};
  }
  // Against another base the buckets hold other counts: an error or other bytes, never a
  // crash (the record's checksum and the chunk's hash reject wrong bytes).
  auto [other_base, other_raw] = SteppedWeights(4, 64 << 10, 2e-4f, 3, 48);
  (void)DecodePiece(p.encoding, p.stored.bytes(), other_base.bytes(), out.mutable_bytes());
}

// The fp16 bit pattern of x (mantissa truncated; subnormals below 2^-14, Inf above the range),
// without the compiler's _Float16, which not every compiler offers on x86-64.
uint16_t ToHalf(float x) {
  const uint32_t f = std::bit_cast<uint32_t>(x);
  const auto sign = static_cast<uint16_t>((f >> 16) & 0x8000);
  const float a = std::fabs(x);
  if (a < 6.103515625e-05f) return sign | static_cast<uint16_t>(std::lround(a * 16777216.0f));
  const int e = static_cast<int>((f >> 23) & 0xff) - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(e << 10) | static_cast<uint16_t>((f >> 13) & 0x3ff);
}

// Rotation (planes of fp32, bf16, fp16): fp32/bf16 weights N(0, 0.02) and fp16 weights, with
// NaN payloads, infinities, zeros of both signs, subnormals and the largest finite values
// sprinkled in; every length from empty to tails of each width.
Buffer SpecialWeights(uint8_t width, size_t size, uint32_t seed) {
  static const uint32_t kSpecials32[] = {0x7fc00000, 0x7f800001, 0xffc01234, 0x7f800000,
                                         0xff800000, 0x00000000, 0x80000000, 0x00000001,
                                         0x807fffff, 0x7f7fffff, 0xff7fffff, 0x00800000};
  static const uint16_t kSpecials16[] = {0x7e00, 0x7c01, 0xfe12, 0x7c00, 0xfc00, 0x0000,
                                         0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x7fc1};
  std::vector<float> w = Weights(size / 4 + 1, seed);
  Buffer out(size);
  for (size_t i = 0; i + width <= size; i += width) {
    const size_t e = i / width;
    if (width == 4) {
      const uint32_t v =
          e % 17 == 5 ? kSpecials32[e / 17 % 12] : std::bit_cast<uint32_t>(w[e % w.size()]);
      std::memcpy(out.data() + i, &v, 4);
    } else {
      // bf16 (the top half of an fp32) or, on odd seeds, fp16 of the same magnitude.
      const uint32_t f = std::bit_cast<uint32_t>(w[e % w.size()]);
      uint16_t h = static_cast<uint16_t>(f >> 16);
      if (seed % 2 == 1) h = ToHalf(w[e % w.size()]);
      if (e % 17 == 5) h = kSpecials16[e / 17 % 12];
      std::memcpy(out.data() + i, &h, 2);
    }
  }
  for (size_t k = size / width * width; k < size; ++k)
    out.data()[k] = static_cast<std::byte>(0xa5 + k);
  return out;
}

TEST(PieceCodecTest, RotatedPlanesRoundTripEveryFloatWidthSpecialValuesAndOddLengths) {
  for (uint8_t width : {2, 4}) {
    for (uint32_t seed : {1u, 2u}) {
      for (size_t size : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{7},
                          size_t{61}, size_t{4099}, size_t{(256 << 10) + 3}}) {
        SCOPED_TRACE("width " + std::to_string(width) + " seed " + std::to_string(seed) + " size " +
                     std::to_string(size));
        Buffer raw = SpecialWeights(width, size, seed);
        for (const char* spec : {"auto", "lz4", "none"}) {
          Buffer stored = EncodeRotatedPlanes(*CodecSpec::Parse(spec), raw.bytes(), width);
          ASSERT_GE(stored.size(), 5u);
          EXPECT_EQ(static_cast<uint8_t>(stored.data()[0]), 0x41);
          Buffer back(size);
          ASSERT_TRUE(DecodePiece({Transform::kPlanes, width, Codec::kLz4}, stored.bytes(), {},
                                  back.mutable_bytes())
                          .ok());
          ASSERT_TRUE(SameBytes(back.data(), raw.data(), size)) << spec;
        }
        ExpectRoundTrip(EncodePiece(CodecSpec{}, raw.bytes(), width, nullptr), raw, nullptr);
      }
    }
  }
}

TEST(PieceCodecTest, RotationIsChosenWhereItPaysOnly) {
  const size_t n = 256 << 10;
  // Weights (random sign): the rotated top plane is the 8-bit exponent, and it is smaller.
  for (uint8_t width : {2, 4}) {
    Buffer raw = SpecialWeights(width, n * width, 2);
    EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), width, nullptr);
    ASSERT_EQ(p.encoding.transform, Transform::kPlanes);
    EXPECT_EQ(static_cast<uint8_t>(p.stored.data()[0]), 0x41) << int{width};
    Buffer unrotated = EncodePieceAs(CodecSpec{}, raw.bytes(), Transform::kPlanes, width, nullptr);
    EXPECT_LT(p.stored.size(), unrotated.size()) << int{width};
    ExpectRoundTrip(p, raw, nullptr);
  }
  // Adam's exp_avg_sq (all positive): the sign costs nothing where it is, so no rotation.
  auto [moment, unused] = DecayingMoment(n, 24);
  EncodedPiece q = EncodePiece(CodecSpec{}, moment.bytes(), 4, nullptr);
  ASSERT_EQ(q.encoding.transform, Transform::kPlanes);
  EXPECT_NE(static_cast<uint8_t>(q.stored.data()[0]), 0x41);
  ExpectRoundTrip(q, moment, nullptr);
  // Integers of a few bits: nothing to gain either.
  std::vector<int32_t> ints(n);
  for (size_t i = 0; i < n; ++i) ints[i] = static_cast<int32_t>(i % 37);
  Buffer ib = ToBuffer(ints.data(), n * 4);
  EncodedPiece r = EncodePiece(CodecSpec{}, ib.bytes(), 4, nullptr);
  EXPECT_TRUE(r.stored_raw() || static_cast<uint8_t>(r.stored.data()[0]) != 0x41);
  ExpectRoundTrip(r, ib, nullptr);
}

TEST(PieceCodecTest, MalformedRotationSegmentsAreCorruption) {
  Buffer raw = SpecialWeights(4, 4099, 3);
  Buffer stored = EncodeRotatedPlanes(CodecSpec{}, raw.bytes(), 4);
  Buffer out(raw.size());
  const PieceEncoding planes4{Transform::kPlanes, 4, Codec::kLz4};
  ASSERT_TRUE(DecodePiece(planes4, stored.bytes(), {}, out.mutable_bytes()).ok());
  for (size_t cut = 0; cut < stored.size(); cut += 37) {
    EXPECT_FALSE(DecodePiece(planes4, stored.bytes().first(cut), {}, out.mutable_bytes()).ok());
  }
  // In a container of a width without rotation, or of a delta.
  for (uint8_t width : {1, 3, 8}) {
    EXPECT_FALSE(DecodePiece({Transform::kPlanes, width, Codec::kLz4}, stored.bytes(), {},
                             out.mutable_bytes())
                     .ok());
  }
  for (Transform t : {Transform::kXor, Transform::kSub}) {
    EXPECT_FALSE(
        DecodePiece({t, 4, Codec::kLz4}, stored.bytes(), raw.bytes(), out.mutable_bytes()).ok());
  }
  for (uint32_t bad_len : {1u, 4u, 0xffffffffu}) {
    Buffer bad(stored.bytes());
    std::memcpy(bad.data() + 1, &bad_len, 4);
    EXPECT_FALSE(DecodePiece(planes4, bad.bytes(), {}, out.mutable_bytes()).ok());
  }
}

// Records written before the rotation existed (planes containers of commit 2640bad, encoded by
// EncodePiece(CodecSpec{}, ...) from OldFormatInput): they must keep decoding bit for bit.
std::vector<std::byte> OldFormatInput(uint8_t width, size_t elements) {
  uint32_t s = 0x9e3779b9u;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s;
  };
  std::vector<std::byte> out(elements * width + width - 1);
  for (size_t i = 0; i < elements; ++i) {
    const uint32_t r = next();
    const uint32_t e = 118 + (r & 3) + ((r >> 2) & 3) + ((r >> 4) & 1);  // a skewed exponent
    uint32_t v = (r & 0x80000000u) | (e << 23) | (next() & 0x7f0000u);
    if (i % 61 == 7) v = 0x7fc00001u;   // NaN with a payload
    if (i % 61 == 19) v = 0x80000000u;  // -0
    if (i % 61 == 31) v = 0xff800000u;  // -Inf
    if (i % 61 == 43) v = 0x00000003u;  // subnormal
    if (width == 2) {
      const uint16_t h = static_cast<uint16_t>(v >> 16);
      std::memcpy(&out[i * 2], &h, 2);
    } else {
      std::memcpy(&out[i * 4], &v, 4);
    }
  }
  for (int k = 0; k < width - 1; ++k) out[elements * width + k] = static_cast<std::byte>(0xa0 + k);
  return out;
}

Buffer FromHex(std::string_view hex) {
  Buffer out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out.data()[i] =
        static_cast<std::byte>(std::stoi(std::string(hex.substr(2 * i, 2)), nullptr, 16));
  }
  return out;
}

TEST(PieceCodecTest, RecordsOfTheOldPlanesFormatStillDecode) {
  // fp32, 256 elements + a 3-byte tail: planes 0 and 1 lz4, 2 raw, 3 Huffman.
  const char* kFp32 =
      "011b00000012000100120107000f02000a1f031e00050f3d00a4500100000000010b0000001f000100e7500000"
      "00000000000100002e8389fb5a982fc01de7b6e90e4fead0a4270f00bbf33dce1afebf13e4ee3e8063059a9b97"
      "573f687b74f10017670d1962346cb6e47bec5e1f98b00261ef24d14d4eb092c011c5ae5458db52ab18c9020025"
      "0f0aefe6f3067cf0492980ab858132cd6ecbcc5f8ff000d5640872e9e420f76082c39f41de46693ef0315344d4"
      "5853c0b6a18ed0d3b4365aadf12400f99d1d47ded8e72d0f460780efea67033bcc359570c29500073d4302f5fb"
      "864de20811925bf06725e61b5406832d9889c0caa14b04640c072cc677d9008987b2cf0e63264db74e94807020"
      "c295ecec063636939e004d1c299462296ff8cf2caa59e2e5be02d93d576a05a063ffc08cdeac7803f5000000ff"
      "060000000000000000000000000000000000000000000000000000000040330300000000000000000000000000"
      "000000000000000000000000000000000000600600000000000000000000000000000000000000000000000000"
      "0000004023040000000000000000000000000000000000000000000000000000000000000060190000001a0000"
      "001b000000f62df66b9f600bf92c083ea4df9d026ef6499d603bddd06301427e6f5d51433fcb6d9bb5ffa293ad"
      "350f542b664192e231ad017eb5a6486dbec119b7c7fd335931bd99c7d41e63bb973bd5d5c06b225784fdd5159c"
      "45ff5e6724557ddc8c7aa59dd64cb196bc3d070003000000a0a1a2";
  // bf16, 384 elements + a 1-byte tail: plane 0 raw, plane 1 Huffman.
  const char* kBf16 =
      "00800100002e8389fb5a982fc01de7b6e90e4fead0a4270f00bbf33dce1afebf13e4ee3e8063059a9b97573f68"
      "7b74f10017670d1962346cb6e47bec5e1f98b00261ef24d14d4eb092c011c5ae5458db52ab18c90200250f0aef"
      "e6f3067cf0492980ab858132cd6ecbcc5f8ff000d5640872e9e420f76082c39f41de46693ef0315344d45853c0"
      "b6a18ed0d3b4365aadf12400f99d1d47ded8e72d0f460780efea67033bcc359570c29500073d4302f5fb864de2"
      "0811925bf06725e61b5406832d9889c0caa14b04640c072cc677d9008987b2cf0e63264db74e94807020c295ec"
      "ec063636939e004d1c299462296ff8cf2caa59e2e5be02d93d576a05a063ffc08cdeac78dcd855176e0828004e"
      "0aa08aa9310d4fc4ec5f80bbee17e0c53e2023a0f7d90060552160782283d532b2fcd9f4a681468e20e0eed926"
      "6987c0faec5b49b0c0ba472c9b2d006fde6cc9c764f224b941d380753e3ae08cc57d48347549001a0123d10c6d"
      "1955b778a9741b26ec4fbe6ff01f61c80bf2c02b93b4f3505c6cf1417e0328010000ff06000000000000000000"
      "000000000000000000000000000000000000004033040000000000000000000000000000000000000000000000"
      "000000000000000060060000000000000000000000000000000000000000000000000000000040320300000000"
      "00000000000000000000000000000000000000000000000000000060270000002800000026000000762ff66b57"
      "c991ec67251b37d26f862466ef59bc1bdbcb6d682e51e4b767149cf05906d8b37f2295ad739e049d329748d27a"
      "1cb05f9d4324d86fe21d43d37f664f193af338d8e3d8a6db0aa3495e03ca9628f68751522bfc94194988c7ec88"
      "1218708658977da917b2d17eb6e458177ebc2232d20350dbf4ee82227b25c46b359630fe8230f176ff398f1ca2"
      "3e3994300a496469daebbd1243ea050001000000a0";
  for (auto [width, elements, hex] :
       {std::tuple<uint8_t, size_t, const char*>{4, 256, kFp32}, {2, 384, kBf16}}) {
    const std::vector<std::byte> expected = OldFormatInput(width, elements);
    Buffer stored = FromHex(hex);
    Buffer out(expected.size());
    ASSERT_TRUE(DecodePiece({Transform::kPlanes, width, Codec::kLz4}, stored.bytes(), {},
                            out.mutable_bytes())
                    .ok())
        << int{width};
    EXPECT_TRUE(SameBytes(out.data(), expected.data(), expected.size())) << int{width};
  }
}

// Adam's second moment of a linear layer: a gradient that is an outer product of a row scale
// and a column scale, squared and averaged, times noise; `rows` x `cols` fp32 (width 4) or
// bf16 (width 2), the whole read from element `skip` on (a piece that starts inside a row), and
// `tail` stray bytes.
Buffer RowColumnMoment(uint8_t width, size_t rows, size_t cols, size_t skip, size_t tail,
                       uint32_t seed, bool signed_values = false) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<float> scale(0.0f, 1.5f), noise(0.0f, 0.7f);
  std::vector<float> r(rows), c(cols);
  for (float& x : r) x = scale(rng);
  for (float& x : c) x = scale(rng);
  const size_t n = rows * cols - skip;
  Buffer out(n * width + tail);
  for (size_t i = 0; i < n; ++i) {
    const size_t e = i + skip;
    float v = 1e-6f * r[e / cols] * c[e % cols] * noise(rng);
    if (signed_values && rng() % 2 == 1) v = -v;
    const uint32_t f = std::bit_cast<uint32_t>(v);
    if (width == 4) {
      std::memcpy(out.data() + i * 4, &f, 4);
    } else {
      const auto h = static_cast<uint16_t>(f >> 16);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  for (size_t k = 0; k < tail; ++k) out.data()[n * width + k] = static_cast<std::byte>(0x5a + k);
  return out;
}

// Where the top plane's model segment (0x42) starts in a planes container, or SIZE_MAX.
size_t ModelSegmentAt(const Buffer& stored) {
  size_t at = 0;
  if (stored.size() > 5 && static_cast<uint8_t>(stored.data()[0]) == 0x41) at = 5;
  return stored.size() > at && static_cast<uint8_t>(stored.data()[at]) == 0x42 ? at : SIZE_MAX;
}

TEST(PieceCodecTest, RowColumnModelIsChosenForMomentsAndRoundTrips) {
  for (uint8_t width : {2, 4}) {
    for (auto [rows, cols, skip] : {std::tuple<size_t, size_t, size_t>{700, 384, 0},
                                    {200, 1536, 1000},
                                    {4000, 64, 17},
                                    {300, 1000, 999}}) {
      for (bool signed_values : {false, true}) {
        SCOPED_TRACE("width " + std::to_string(width) + " cols " + std::to_string(cols) + " skip " +
                     std::to_string(skip) + (signed_values ? " signed" : ""));
        Buffer raw = RowColumnMoment(width, rows, cols, skip, width - 1, 5, signed_values);
        EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), width, nullptr);
        ASSERT_EQ(p.encoding.transform, Transform::kPlanes);
        const size_t at = ModelSegmentAt(p.stored);
        ASSERT_NE(at, SIZE_MAX);
        uint32_t period;
        std::memcpy(&period, p.stored.data() + at + 5, 4);
        EXPECT_EQ(period, cols);
        ExpectRoundTrip(p, raw, nullptr);
        // Smaller than the planes without the model (rotated as the piece is).
        Buffer without =
            at == 5 ? EncodeRotatedPlanes(CodecSpec{}, raw.bytes(), width)
                    : EncodePieceAs(CodecSpec{}, raw.bytes(), Transform::kPlanes, width, nullptr);
        // The exponent is 8 of 16 or 32 bits: the model saves ~1 bit of them here.
        EXPECT_LT(p.stored.size(), without.size() * (width == 2 ? 96 : 98) / 100);
      }
    }
  }
}

TEST(PieceCodecTest, RowColumnModelIsNotUsedWithoutRowsOrForDeltasAndOtherCodecs) {
  // Weights: independent elements, no rows in the bytes.
  std::vector<float> w = Weights(256 << 10, 3);
  std::vector<uint16_t> bf16(w.size());
  for (size_t i = 0; i < w.size(); ++i)
    bf16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(w[i]) >> 16);
  for (uint8_t width : {2, 4}) {
    Buffer raw =
        width == 4 ? ToBuffer(w.data(), w.size() * 4) : ToBuffer(bf16.data(), bf16.size() * 2);
    EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), width, nullptr);
    ASSERT_EQ(p.encoding.transform, Transform::kPlanes);
    EXPECT_EQ(ModelSegmentAt(p.stored), SIZE_MAX) << int{width};
  }
  Buffer raw = RowColumnMoment(4, 700, 384, 0, 0, 6);
  // lz4 and zstd keep their trials and never model.
  EncodedPiece q = EncodePiece(*CodecSpec::Parse("lz4"), raw.bytes(), 4, nullptr);
  EXPECT_TRUE(q.stored_raw() || q.encoding.transform == Transform::kPlain ||
              ModelSegmentAt(q.stored) == SIZE_MAX);
  // Deltas have no model.
  Buffer base = RowColumnMoment(4, 700, 384, 0, 0, 7);
  EncodedPiece d = EncodePiece(CodecSpec{}, raw.bytes(), 4, &base);
  ASSERT_EQ(d.encoding.transform, Transform::kSub);
  EXPECT_EQ(ModelSegmentAt(d.stored), SIZE_MAX);
  ExpectRoundTrip(d, raw, &base);
}

TEST(PieceCodecTest, MalformedModelSegmentsAreCorruption) {
  Buffer raw = RowColumnMoment(2, 100, 384, 0, 1, 8, true);
  EncodedPiece p = EncodePiece(CodecSpec{}, raw.bytes(), 2, nullptr);
  const size_t at = ModelSegmentAt(p.stored);
  ASSERT_NE(at, SIZE_MAX);
  Buffer out(raw.size());
  ASSERT_TRUE(DecodePiece(p.encoding, p.stored.bytes(), {}, out.mutable_bytes()).ok());
  for (size_t cut = 0; cut < p.stored.size(); cut += 29) {
    EXPECT_FALSE(
        DecodePiece(p.encoding, p.stored.bytes().first(cut), {}, out.mutable_bytes()).ok());
  }
  // Another width, a delta, or an output of another length.
  for (uint8_t width : {1, 3, 4, 8}) {
    Buffer other(raw.size() / width * width);
    EXPECT_FALSE(DecodePiece({Transform::kPlanes, width, Codec::kLz4}, p.stored.bytes(), {},
                             other.mutable_bytes())
                     .ok());
  }
  for (Transform t : {Transform::kXor, Transform::kSub}) {
    EXPECT_FALSE(DecodePiece({t, 2, Codec::kLz4}, p.stored.bytes().subspan(at), raw.bytes(),
                             out.mutable_bytes())
                     .ok());
  }
  Buffer shorter(raw.size() - 2);
  EXPECT_FALSE(DecodePiece(p.encoding, p.stored.bytes(), {}, shorter.mutable_bytes()).ok());
  // A bad length, period or phase.
  for (auto [offset, value] : {std::pair<size_t, uint32_t>{1, 7},
                               {1, 0xffffffffu},
                               {1, 0},
                               {5, 0},
                               {5, 1},
                               {5, 200},
                               {5, 385},
                               {5, 0xffffffffu},
                               {9, 384},
                               {9, 0xffffffffu}}) {
    Buffer bad(p.stored.bytes());
    std::memcpy(bad.data() + at + offset, &value, 4);
    EXPECT_FALSE(DecodePiece(p.encoding, bad.bytes(), {}, out.mutable_bytes()).ok())
        << offset << " " << value;
  }
}

// A record of the row/column model as the encoder of this commit writes it (EncodePiece(
// CodecSpec{}, ...) of ModelFormatInput: bf16, 64 columns, 80 rows from column 5 on, a 1-byte
// tail): it must keep decoding bit for bit.
std::vector<std::byte> ModelFormatInput() {
  std::vector<std::byte> out((80 * 64 - 5) * 2 + 1);
  uint32_t s = 12345;
  for (size_t i = 0; i + 1 < out.size(); i += 2) {
    s = s * 1103515245u + 12345u;
    const size_t e = i / 2 + 5;
    const uint32_t row = static_cast<uint32_t>(e / 64) * 2654435761u >> 30;
    const uint32_t exponent = 100 + (e % 64) % 5 + row + ((s >> 16) % 31 == 0);
    const auto h = static_cast<uint16_t>(exponent << 7);
    std::memcpy(&out[i], &h, 2);
  }
  out.back() = static_cast<std::byte>(0xee);
  return out;
}

TEST(PieceCodecTest, RecordsOfTheRowColumnModelStillDecode) {
  // Rotated (0x41), the model (0x42: period 64, phase 5, 64 column and 81 row terms), plane 0
  // lz4, plane 1 (the residual) Huffman, the tail raw.
  const char* kBf16 =
      "410000000042980000004000000005000000666768696a666668696a666768696a6667686969666768686a6667"
      "68696a666768696a666768696a666768696a6667686969666768696a666767686a66666869fe00fe01fffe00ff"
      "0100fe01fffe00ff0100fe00ff0100fe01fffe00ff0100fe01fffe00fe01fffe00ff0100fe01fffe00ff0100fe"
      "01ff0100fe01fffe00ff0100fe01fffe00ff01fffe00ff0100fe01011e0000001f000100ffffffffffffffffff"
      "fffffffffffffffffffff5500000000000038e0200000111a0000000a0000000a0000000024004000010300102"
      "400400401030110240040040103009024044000110300102410400401030410240840002103001024004000010"
      "3001224804000010300102400c010110300d024004008810300102500400001030010240040001103001024204"
      "000450300102400400001030011240050040503001024004000010700102400400011030110240140100143001"
      "024004000010300102400500009030010480080000306042048008040020700204800800002060020480080040"
      "206402048008010020600204800800002060020480080000206002048088000024600204800800002160020480"
      "082001206002048008080020700204800800002060020690094000206802048008000020654204804800202060"
      "020490080000206002848028000020600204800c02002060020480280000216002068108000020600208001100"
      "4040c004480011000040c0840821112008c0c006080011120040c004080011120040c044084031000040c00408"
      "0011000040c004080091000040c004080111002040c044080011040040c004080011000041c004080031008040"
      "c814080011000040c004080011000040c004080011012844c004080011000040c004690011400040c0040c0011"
      "000044c004080011000040c804280011002040c004100022000180a01910002200008080091000220002808009"
      "9000a200008080091020220000808009100023000080a009304032000080800990002200808080091000220002"
      "808809100326000080800910022200009080091000224000a0800d140022000080840910802200008080291000"
      "22000080800910002a000088c41910286300008080091020220000808009100022000080a00910002200008080"
      "090001000000ee";
  const std::vector<std::byte> expected = ModelFormatInput();
  Buffer stored = FromHex(kBf16);
  Buffer out(expected.size());
  ASSERT_TRUE(
      DecodePiece({Transform::kPlanes, 2, Codec::kLz4}, stored.bytes(), {}, out.mutable_bytes())
          .ok());
  EXPECT_TRUE(SameBytes(out.data(), expected.data(), expected.size()));
}

// Every vector level (baseline SSE2, AVX2, AVX-512: whichever this CPU has) writes the same bytes
// for every layout of the plane loops, and reads what any level wrote.
TEST(PieceCodecTest, EveryVectorLevelWritesAndReadsTheSameBytes) {
  struct Case {
    std::string name;
    Buffer raw, base;
    uint8_t width;
  };
  std::vector<Case> cases;
  {
    auto [base, raw] = DecayingMoment((64 << 10) + 5, 31);  // scaled sub, a tail of 1..3 bytes
    Buffer tail_raw = ToBuffer(raw.data(), raw.size() - 2);
    Buffer tail_base = ToBuffer(base.data(), base.size() - 2);
    cases.push_back({"fp32 scaled sub", std::move(tail_raw), std::move(tail_base), 4});
  }
  cases.push_back({"fp32 moment", RowColumnMoment(4, 300, 1000, 999, 3, 8, true), Buffer(), 4});
  cases.push_back({"bf16 moment", RowColumnMoment(2, 700, 384, 0, 1, 9), Buffer(), 2});
  // Rotated planes (random signs), whole rounds of 32 elements and a rest of 1..31 and a tail.
  cases.push_back({"fp32 weights", SpecialWeights(4, (64 << 10) * 4 + 29 * 4 + 3, 3), Buffer(), 4});
  cases.push_back({"bf16 weights", SpecialWeights(2, (64 << 10) * 2 + 17 * 2 + 1, 4), Buffer(), 2});
  for (uint8_t width : {4, 2}) {  // planes split by the base's magnitude
    auto [base, raw] = SteppedWeights(width, (64 << 10) + 7, 2e-4f, width - 1, 5);
    cases.push_back(
        {"split width " + std::to_string(width), std::move(raw), std::move(base), width});
  }
  std::mt19937_64 rng(12);
  for (uint8_t width : {1, 2, 3, 4, 8}) {
    std::vector<uint8_t> a(100003), b(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<uint8_t>(rng() % 5);
      b[i] = static_cast<uint8_t>(a[i] + (rng() % 4 == 0));
    }
    cases.push_back({"delta width " + std::to_string(width), ToBuffer(b.data(), b.size()),
                     ToBuffer(a.data(), a.size()), width});
  }
  const CodecVectorLevel widest = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Buffer* base = c.base.empty() ? nullptr : &c.base;
    std::vector<std::pair<PieceEncoding, Buffer>> written;  // per level: auto, then xor
    for (auto level :
         {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2, CodecVectorLevel::kAvx512}) {
      CapCodecVectorLevelForTesting(level);
      EncodedPiece p = EncodePiece(CodecSpec{}, c.raw.bytes(), c.width, base);
      ASSERT_FALSE(p.stored_raw());
      if (c.name.starts_with("split")) {
        EXPECT_NE(SplitSegmentAt(p.stored), SIZE_MAX);
      }
      written.push_back({p.encoding, std::move(p.stored)});
      if (base != nullptr) {
        written.emplace_back(
            PieceEncoding{Transform::kXor, c.width, Codec::kLz4},
            EncodePieceAs(CodecSpec{}, c.raw.bytes(), Transform::kXor, c.width, base));
      }
    }
    const size_t per_level = base != nullptr ? 2 : 1;
    for (size_t k = per_level; k < written.size(); ++k) {
      const auto& [enc, stored] = written[k];
      const auto& [first_enc, first] = written[k % per_level];
      EXPECT_EQ(enc.transform, first_enc.transform);
      ASSERT_EQ(stored.size(), first.size());
      EXPECT_TRUE(SameBytes(stored.data(), first.data(), first.size()));
    }
    for (auto level :
         {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2, CodecVectorLevel::kAvx512}) {
      CapCodecVectorLevelForTesting(level);
      for (size_t k = 0; k < per_level; ++k) {
        Buffer back(c.raw.size());
        ASSERT_TRUE(DecodePiece(written[k].first, written[k].second.bytes(),
                                base ? base->bytes() : Bytes{}, back.mutable_bytes())
                        .ok());
        EXPECT_TRUE(SameBytes(back.data(), c.raw.data(), c.raw.size()));
      }
    }
  }
  CapCodecVectorLevelForTesting(widest);
}

// Appends a segment stored raw (codec none): the codec byte, the LE32 length, the bytes.
void PutRawSegment(const std::vector<uint8_t>& bytes, std::vector<uint8_t>* out) {
  out->push_back(0);
  for (int k = 0; k < 4; ++k) out->push_back(static_cast<uint8_t>(bytes.size() >> (8 * k)));
  out->insert(out->end(), bytes.begin(), bytes.end());
}

// The encoder splits into 4 buckets; a container may hold 2..8, and the decoder finds each
// element's bucket with loops made per number of thresholds. Containers built here from given
// planes, split by the container's own rule (the base element's magnitude byte at or above each
// threshold), decode at every vector level to what the same planes give unsplit: every bucket
// count with spread thresholds and with consecutive ones from 1, widths 4 and 2, lengths with
// and without vector rounds, a rest after them and a tail.
TEST(PieceCodecTest, SplitContainersOfEveryBucketCountDecodeAsTheirPlanes) {
  struct RestoreCap {
    CodecVectorLevel was = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
    ~RestoreCap() { CapCodecVectorLevelForTesting(was); }
  } restore;
  std::mt19937_64 rng(21);
  for (uint8_t width : {4, 2}) {
    for (size_t elements : {size_t{(16 << 10) + 45}, size_t{64}, size_t{31}, size_t{1}}) {
      for (uint8_t tail : {uint8_t{0}, static_cast<uint8_t>(width - 1)}) {
        const size_t size = elements * width + tail;
        // planes: plane s at s * elements, then the tail
        std::vector<uint8_t> base(size), planes(size);
        for (auto& b : base) b = static_cast<uint8_t>(rng());
        for (auto& b : planes) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> unsplit;
        for (size_t s = 0; s <= width; ++s) {
          const size_t from = s * elements, to = s < width ? from + elements : size;
          PutRawSegment({planes.begin() + from, planes.begin() + to}, &unsplit);
        }
        const Buffer base_bytes = ToBuffer(base.data(), base.size());
        auto decode = [&](const std::vector<uint8_t>& container, Buffer* out) {
          return DecodePiece({Transform::kSub, width, Codec::kNone},
                             ToBuffer(container.data(), container.size()).bytes(),
                             base_bytes.bytes(), out->mutable_bytes());
        };
        Buffer expected(size);
        ASSERT_TRUE(decode(unsplit, &expected).ok());
        for (size_t buckets = 2; buckets <= 8; ++buckets) {
          for (bool consecutive : {false, true}) {
            SCOPED_TRACE(std::to_string(width) + " bytes, " + std::to_string(elements) +
                         " elements, " + std::to_string(buckets) + " buckets" +
                         (consecutive ? " from 1" : ""));
            std::vector<uint8_t> thresholds;  // strictly increasing in 1..255
            for (size_t b = 1; b < buckets; ++b) {
              thresholds.push_back(static_cast<uint8_t>(consecutive ? b : b * 255 / 7));
            }
            const uint8_t mask = buckets % 2 == 0 ? static_cast<uint8_t>(1u << (width - 1))
                                                  : static_cast<uint8_t>(0b11 << (width - 2));
            std::vector<uint8_t> c = {0x43, static_cast<uint8_t>(1 + buckets), 0,   0,
                                      0,    static_cast<uint8_t>(buckets),     mask};
            c.insert(c.end(), thresholds.begin(), thresholds.end());
            for (size_t s = 0; s <= width; ++s) {
              const size_t from = s * elements, to = s < width ? from + elements : size;
              if (s == width || (mask >> s & 1) == 0) {
                PutRawSegment({planes.begin() + from, planes.begin() + to}, &c);
                continue;
              }
              for (size_t bucket = 0; bucket < buckets; ++bucket) {
                std::vector<uint8_t> bytes;
                for (size_t i = 0; i < elements; ++i) {
                  // The magnitude byte: the 8 bits below the sign of the little-endian element.
                  const uint32_t top =
                      uint32_t{base[i * width + width - 1]} << 8 | base[i * width + width - 2];
                  const uint8_t magnitude = static_cast<uint8_t>(top >> 7);
                  size_t in = 0;
                  for (uint8_t t : thresholds) in += magnitude >= t;
                  if (in == bucket) bytes.push_back(planes[from + i]);
                }
                PutRawSegment(bytes, &c);
              }
            }
            for (auto level : {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2,
                               CodecVectorLevel::kAvx512}) {
              CapCodecVectorLevelForTesting(level);
              SCOPED_TRACE("level in use " +
                           std::to_string(static_cast<int>(CodecVectorLevelInUse())));
              Buffer out(size);
              ASSERT_TRUE(decode(c, &out).ok());
              EXPECT_TRUE(SameBytes(out.data(), expected.data(), size));
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ckptfs
