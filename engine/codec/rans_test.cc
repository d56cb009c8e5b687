#include "engine/codec/rans.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/codec/huffman.h"
#include "engine/codec/vector_level.h"
#include "engine/util/test_buffers.h"

namespace ckptfs {
namespace {

// A plane like the top plane of a training step's delta: mostly zeros, some small values.
Buffer DeltaTop(size_t n, double p_zero, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::geometric_distribution<int> g(0.5);
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) {
    const int v = u(rng) < p_zero ? 0 : std::min(255, 1 + g(rng));
    b.data()[i] = static_cast<std::byte>(v);
  }
  return b;
}

size_t Encode(const Buffer& in, Buffer* enc) {
  enc->Resize(in.size());
  const size_t n = RansEncodeTo(in.bytes(), enc->data(), enc->size());
  enc->Resize(n);
  return n;
}

void ExpectRoundTrip(const Buffer& in) {
  Buffer enc;
  if (Encode(in, &enc) == 0) return;  // did not shrink: nothing to decode
  EXPECT_LT(enc.size(), in.size());
  Buffer back(in.size());
  ASSERT_TRUE(RansDecode(enc.bytes(), back.mutable_bytes()).ok()) << in.size();
  ASSERT_EQ(0, std::memcmp(back.data(), in.data(), in.size())) << in.size();
}

double EntropyBytes(const Buffer& in) {
  uint32_t counts[256];
  ByteHistogram(in.bytes(), counts);
  return HistogramEntropyBits(counts) * static_cast<double>(in.size()) / 8;
}

TEST(RansTest, RoundTripsEverySizeAndShape) {
  for (size_t n : {1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100, 1000, 4099, 65536, 262147}) {
    for (double spread : {0.0, 0.3, 1.0, 3.0, 20.0}) {
      SCOPED_TRACE(std::to_string(n) + " spread " + std::to_string(spread));
      ExpectRoundTrip(SkewedBuffer(n, spread, static_cast<uint32_t>(n)));
    }
    for (double p_zero : {0.5, 0.9, 0.999}) ExpectRoundTrip(DeltaTop(n, p_zero, 7));
  }
}

TEST(RansTest, StoresWithinAFewTenthsOfAPercentOfTheEntropy) {
  for (double p_zero : {0.6, 0.8, 0.95}) {
    const Buffer in = DeltaTop(1 << 19, p_zero, 11);
    Buffer enc;
    ASSERT_GT(Encode(in, &enc), 0u);
    const double entropy = EntropyBytes(in);
    EXPECT_LT(static_cast<double>(enc.size()), entropy * 1.005 + 400) << p_zero;  // + header
    // Huffman spends at least a bit per byte: on such planes rANS is the smaller.
    EXPECT_LT(enc.size(), HuffmanEncodedSize(in.bytes())) << p_zero;
    // The estimate the codec chooses by is close to the size written.
    uint32_t counts[256];
    ByteHistogram(in.bytes(), counts);
    EXPECT_NEAR(static_cast<double>(RansEncodedSize(counts)), static_cast<double>(enc.size()),
                64.0);
  }
}

TEST(RansTest, ConstantInputCostsAlmostNothing) {
  Buffer in(80000);
  std::memset(in.data(), 0x3f, in.size());
  Buffer enc;
  ASSERT_GT(Encode(in, &enc), 0u);
  EXPECT_LE(enc.size(), 300u);  // the table and the 64 states
  ExpectRoundTrip(in);
  std::memset(in.data(), 0xff, in.size());  // the companion symbol wraps to 0
  ExpectRoundTrip(in);
}

TEST(RansTest, EveryByteValueAndRareSymbols) {
  // All 256 symbols, most of them once: rounding gives them frequency 1 and takes it back from
  // the frequent ones.
  std::vector<uint8_t> v(200000, 0);
  for (int s = 0; s < 256; ++s) v[static_cast<size_t>(s) * 700] = static_cast<uint8_t>(s);
  for (size_t i = 1; i < v.size(); i += 3) v[i] = 1;
  ExpectRoundTrip(Buffer(Bytes(reinterpret_cast<const std::byte*>(v.data()), v.size())));
}

TEST(RansTest, RefusesWhatDoesNotShrinkOrFit) {
  const Buffer noise = RandomBuffer(100000, 5);
  Buffer enc(noise.size());
  EXPECT_EQ(0u, RansEncodeTo(noise.bytes(), enc.data(), enc.size()));
  const Buffer in = DeltaTop(100000, 0.9, 3);
  ASSERT_GT(Encode(in, &enc), 0u);
  Buffer small(enc.size() - 1);
  EXPECT_EQ(0u, RansEncodeTo(in.bytes(), small.data(), small.size()));
  Buffer exact(enc.size());
  EXPECT_EQ(enc.size(), RansEncodeTo(in.bytes(), exact.data(), exact.size()));
}

TEST(RansTest, RoundTripsRandomDistributions) {
  // Random alphabets and skews: every frequency from 1 to 4095 turns up, which exercises the
  // encoder's reciprocal division against the decoder's multiply.
  std::mt19937 rng(21);
  for (int trial = 0; trial < 300; ++trial) {
    const int symbols = 2 + static_cast<int>(rng() % 255);
    const double skew = std::uniform_real_distribution<double>(0.2, 3.0)(rng);
    std::vector<double> weights(static_cast<size_t>(symbols));
    for (int s = 0; s < symbols; ++s) weights[static_cast<size_t>(s)] = std::pow(s + 1.0, -skew);
    std::discrete_distribution<int> d(weights.begin(), weights.end());
    const uint8_t offset = static_cast<uint8_t>(rng());
    Buffer in(1 + rng() % 20000);
    for (size_t i = 0; i < in.size(); ++i) {
      in.data()[i] = static_cast<std::byte>(static_cast<uint8_t>(d(rng) + offset));
    }
    SCOPED_TRACE(std::to_string(trial));
    ExpectRoundTrip(in);
  }
}

// A skewed plane of exactly `symbols` distinct values (0 mostly, the others spread evenly).
Buffer WithSymbols(size_t n, int symbols, uint32_t seed) {
  std::mt19937 rng(seed);
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) {
    const int v = i < static_cast<size_t>(symbols) ? static_cast<int>(i)
                  : rng() % 4 != 0                 ? 0
                                                   : static_cast<int>(rng() % symbols);
    b.data()[i] = static_cast<std::byte>(v * 255 / std::max(1, symbols - 1));
  }
  return b;
}

TEST(RansTest, EveryVectorLevelWritesAndReadsTheSameBytes) {
  const CodecVectorLevel before = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
  std::vector<Buffer> inputs;
  for (size_t n : {size_t{3001}, size_t{4097}, size_t{1} << 19, (size_t{1} << 19) + 63}) {
    inputs.push_back(DeltaTop(n, 0.7, static_cast<uint32_t>(n)));
  }
  // Around the AVX-512 encoder's limit for looking entries up by rank (64 symbols present).
  for (int symbols : {32, 33, 63, 64, 65, 200}) inputs.push_back(WithSymbols(100000, symbols, 7));
  for (const Buffer& in : inputs) {
    const size_t n = in.size();
    std::vector<Buffer> encoded;
    for (CodecVectorLevel level :
         {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2, CodecVectorLevel::kAvx512}) {
      CapCodecVectorLevelForTesting(level);
      Buffer enc;
      ASSERT_GT(Encode(in, &enc), 0u);
      encoded.push_back(std::move(enc));
      for (const Buffer& e : encoded) {  // every level reads what every level wrote
        Buffer back(in.size());
        ASSERT_TRUE(RansDecode(e.bytes(), back.mutable_bytes()).ok());
        ASSERT_EQ(0, std::memcmp(back.data(), in.data(), in.size())) << n;
      }
    }
    for (const Buffer& e : encoded) {
      ASSERT_EQ(e.size(), encoded[0].size());
      EXPECT_EQ(0, std::memcmp(e.data(), encoded[0].data(), e.size())) << n;
    }
  }
  CapCodecVectorLevelForTesting(before);
}

TEST(RansTest, MalformedStreamsAreCorruptionNeverACrash) {
  const Buffer in = DeltaTop(50000, 0.8, 9);
  Buffer enc;
  ASSERT_GT(Encode(in, &enc), 0u);
  Buffer back(in.size());
  // Every truncation, at every vector level (the vector loops run their last rounds over a
  // padded copy of the last words: a stream that reads into the padding is cut short).
  const CodecVectorLevel before = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
  for (CodecVectorLevel level :
       {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2, CodecVectorLevel::kAvx512}) {
    CapCodecVectorLevelForTesting(level);
    for (size_t len = 0; len < enc.size(); len += (len < 200 ? 1 : 97)) {
      EXPECT_FALSE(RansDecode(enc.bytes().first(len), back.mutable_bytes()).ok()) << len;
    }
    // The last words cut, and replaced by zeros: the same length, read past the real ones.
    for (size_t cut = 2; cut <= 130; cut += 2) {
      Buffer zeroed(enc.bytes());
      std::memset(zeroed.data() + enc.size() - cut, 0, cut);
      Buffer shorter_words(enc.bytes().first(enc.size() - cut));
      EXPECT_FALSE(RansDecode(shorter_words.bytes(), back.mutable_bytes()).ok()) << cut;
      (void)RansDecode(zeroed.bytes(), back.mutable_bytes());  // no crash; may decode
    }
  }
  CapCodecVectorLevelForTesting(before);
  // A longer stream, a wrong output length.
  Buffer longer(enc.size() + 2);
  std::memcpy(longer.data(), enc.data(), enc.size());
  std::memset(longer.data() + enc.size(), 0, 2);
  EXPECT_FALSE(RansDecode(longer.bytes(), back.mutable_bytes()).ok());
  Buffer shorter(in.size() - 1);
  EXPECT_FALSE(RansDecode(enc.bytes(), shorter.mutable_bytes()).ok());
  // Flipped bits anywhere: an error or bytes of the right length, never a crash; in the table
  // and the states always an error.
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    Buffer bad(enc.size());
    std::memcpy(bad.data(), enc.data(), enc.size());
    const size_t at = trial < 600 ? trial % 100 : rng() % bad.size();
    bad.data()[at] ^= static_cast<std::byte>(1u << (rng() % 8));
    (void)RansDecode(bad.bytes(), back.mutable_bytes());
  }
  Buffer bad_table(enc.size());
  std::memcpy(bad_table.data(), enc.data(), enc.size());
  bad_table.data()[33] ^= std::byte{0x40};  // a frequency: the sum is off
  EXPECT_FALSE(RansDecode(bad_table.bytes(), back.mutable_bytes()).ok());
}

// A rANS input decoded beside Huffman inputs (the planes of a delta: its high plane and its low
// plane's buckets) gives what each decoder gives alone: the bytes, and an error where either
// gives one. At every vector level (the loop that interleaves the two runs only with AVX-512
// VBMI) and with either Huffman table (it interleaves only the single-symbol one).
struct BesideCase {
  Buffer rans, rans_enc;
  std::vector<Buffer> huffman, huffman_enc;
};

// The buffers as a vector (an initializer list would copy them).
template <typename... B>
std::vector<Buffer> Buffers(B&&... b) {
  std::vector<Buffer> v;
  (v.push_back(std::forward<B>(b)), ...);
  return v;
}

BesideCase MakeBesideCase(Buffer rans, const std::vector<Buffer>& huffman) {
  BesideCase c;
  c.rans = std::move(rans);
  EXPECT_GT(Encode(c.rans, &c.rans_enc), 0u);
  for (const Buffer& h : huffman) {
    Buffer enc;
    EXPECT_TRUE(HuffmanEncode(h.bytes(), &enc));
    c.huffman.push_back(Buffer(h.bytes()));
    c.huffman_enc.push_back(std::move(enc));
  }
  return c;
}

// Decodes `rans` beside `huffman` (encoded inputs) into fresh buffers of the originals' sizes.
Status DecodeBeside(const BesideCase& c, const Buffer& rans, const std::vector<Buffer>& huffman,
                    Buffer* rans_out, std::vector<Buffer>* huffman_out) {
  *rans_out = Buffer(c.rans.size());
  huffman_out->clear();
  std::vector<HuffmanInput> inputs;
  for (size_t k = 0; k < huffman.size(); ++k) {
    huffman_out->emplace_back(c.huffman[k].size());
    inputs.push_back({huffman[k].bytes(), (*huffman_out)[k].mutable_bytes()});
  }
  return RansDecodeWithHuffman(rans.bytes(), rans_out->mutable_bytes(), inputs);
}

std::vector<BesideCase> BesideCases() {
  std::vector<BesideCase> cases;
  // A high plane with its low plane in 3 buckets, one of them short; shorter and longer than it.
  for (size_t n : {size_t{5000}, size_t{1} << 18, (size_t{1} << 18) + 63}) {
    cases.push_back(MakeBesideCase(
        DeltaTop(n, 0.8, 3), Buffers(SkewedBuffer(n / 2, 20.0, 4), SkewedBuffer(n / 3, 20.0, 5),
                                     SkewedBuffer(n / 6 + 1, 20.0, 6))));
    cases.push_back(MakeBesideCase(DeltaTop(n, 0.9, 7), Buffers(SkewedBuffer(n / 4, 20.0, 8))));
    cases.push_back(MakeBesideCase(DeltaTop(n / 3, 0.9, 9),
                                   Buffers(SkewedBuffer(n, 20.0, 10), SkewedBuffer(n, 1.0, 11))));
  }
  // None beside it; short codes (the multi-symbol table's inputs); more than 32 and more than 64
  // ranks (the ranked decoder's two forms, and none).
  cases.push_back(MakeBesideCase(DeltaTop(100000, 0.7, 12), Buffers()));
  cases.push_back(
      MakeBesideCase(DeltaTop(100000, 0.7, 13), Buffers(SkewedBuffer(100000, 0.3, 14))));
  for (int symbols : {40, 200}) {
    cases.push_back(
        MakeBesideCase(WithSymbols(100000, symbols, 15), Buffers(SkewedBuffer(100000, 20.0, 16))));
  }
  return cases;
}

TEST(RansTest, DecodesBesideHuffmanAsEachDecodesAlone) {
  const std::vector<BesideCase> cases = BesideCases();
  const CodecVectorLevel before = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
  for (CodecVectorLevel level :
       {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2, CodecVectorLevel::kAvx512}) {
    CapCodecVectorLevelForTesting(level);
    for (HuffmanDecodeTable table : {HuffmanDecodeTable::kAuto, HuffmanDecodeTable::kSingleSymbol,
                                     HuffmanDecodeTable::kMultiSymbol}) {
      const HuffmanDecodeTable table_before = SetHuffmanDecodeTableForTesting(table);
      for (size_t k = 0; k < cases.size(); ++k) {
        SCOPED_TRACE("case " + std::to_string(k) + " level " +
                     std::to_string(static_cast<int>(level)) + " table " +
                     std::to_string(static_cast<int>(table)));
        const BesideCase& c = cases[k];
        Buffer rans_out;
        std::vector<Buffer> huffman_out;
        ASSERT_TRUE(DecodeBeside(c, c.rans_enc, c.huffman_enc, &rans_out, &huffman_out).ok());
        ASSERT_EQ(0, std::memcmp(rans_out.data(), c.rans.data(), c.rans.size()));
        for (size_t h = 0; h < c.huffman.size(); ++h) {
          ASSERT_EQ(0, std::memcmp(huffman_out[h].data(), c.huffman[h].data(), c.huffman[h].size()))
              << h;
        }
      }
      SetHuffmanDecodeTableForTesting(table_before);
    }
  }
  CapCodecVectorLevelForTesting(before);
}

TEST(RansTest, DecodingBesideHuffmanFailsWhereEitherAloneFails) {
  const std::vector<BesideCase> cases = BesideCases();
  std::mt19937 rng(17);
  int failed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const BesideCase& c = cases[trial % cases.size()];
    Buffer rans(c.rans_enc.bytes());
    std::vector<Buffer> huffman;
    for (const Buffer& h : c.huffman_enc) huffman.emplace_back(h.bytes());
    // Flipped bits in one input, or one input cut short.
    const size_t victim = rng() % (huffman.size() + 1);
    Buffer& hit = victim == 0 ? rans : huffman[victim - 1];
    if (trial % 5 == 0) {
      hit = Buffer(hit.bytes().first(rng() % hit.size()));
    } else {
      for (int f = 0; f < 1 + trial % 3; ++f) {
        hit.data()[rng() % hit.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
      }
    }
    // Alone.
    Buffer alone(c.rans.size());
    std::vector<Buffer> alone_huffman;
    bool ok = RansDecode(rans.bytes(), alone.mutable_bytes()).ok();
    for (size_t h = 0; h < huffman.size(); ++h) {
      alone_huffman.emplace_back(c.huffman[h].size());
      ok = HuffmanDecode(huffman[h].bytes(), alone_huffman[h].mutable_bytes()).ok() && ok;
    }
    // Beside: the same verdict, and where it decodes, the same bytes.
    Buffer rans_out;
    std::vector<Buffer> huffman_out;
    const Status st = DecodeBeside(c, rans, huffman, &rans_out, &huffman_out);
    ASSERT_EQ(ok, st.ok()) << "trial " << trial << ": " << st.ToString();
    failed += !ok;
    if (!ok) continue;
    ASSERT_EQ(0, std::memcmp(rans_out.data(), alone.data(), alone.size())) << trial;
    for (size_t h = 0; h < huffman.size(); ++h) {
      ASSERT_EQ(
          0, std::memcmp(huffman_out[h].data(), alone_huffman[h].data(), alone_huffman[h].size()))
          << trial;
    }
  }
  EXPECT_GT(failed, 300);  // truncations at least fail
}

}  // namespace
}  // namespace ckptfs
