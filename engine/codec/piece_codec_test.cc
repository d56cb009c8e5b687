#include "engine/codec/piece_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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

Buffer ToBuffer(const void* data, size_t bytes) {
  return Buffer(Bytes(static_cast<const std::byte*>(data), bytes));
}

void ExpectRoundTrip(const EncodedPiece& p, const Buffer& original, const Buffer* base) {
  Buffer back(original.size());
  ASSERT_TRUE(DecodePiece(p.encoding, p.stored_raw() ? original.bytes() : p.stored.bytes(),
                          base ? base->bytes() : Bytes{}, back.mutable_bytes())
                  .ok());
  ASSERT_EQ(0, std::memcmp(back.data(), original.data(), original.size()));
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
      ASSERT_EQ(0, std::memcmp(back.data(), raw.data(), size))
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
  // Planes 0 and 1 (mantissa) raw, plane 3 (sign and exponent) Huffman.
  const std::byte* seg = a.stored.data();
  EXPECT_EQ(static_cast<Codec>(seg[0]), Codec::kNone);
  EXPECT_EQ(static_cast<Codec>(seg[5 + n]), Codec::kNone);
  size_t pos = 0;
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
      ASSERT_EQ(0, std::memcmp(back.data(), raw.data(), size)) << scale << " " << size;
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

}  // namespace
}  // namespace ckptfs
