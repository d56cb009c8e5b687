#include "engine/codec/huffman.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/codec/vector_level.h"
#include "engine/util/test_buffers.h"

namespace ckptfs {
namespace {

constexpr HuffmanDecodeTable kTables[] = {
    HuffmanDecodeTable::kAuto, HuffmanDecodeTable::kSingleSymbol, HuffmanDecodeTable::kMultiSymbol};

// Sets HuffmanDecode's table for the scope.
class ScopedTable {
 public:
  explicit ScopedTable(HuffmanDecodeTable t) : before_(SetHuffmanDecodeTableForTesting(t)) {}
  ~ScopedTable() { SetHuffmanDecodeTableForTesting(before_); }

 private:
  HuffmanDecodeTable before_;
};

// Decoded with each table: the same bytes.
void ExpectRoundTrip(const Buffer& in) {
  Buffer enc;
  if (!HuffmanEncode(in.bytes(), &enc)) return;  // did not shrink: nothing to decode
  EXPECT_LT(enc.size(), in.size());
  for (HuffmanDecodeTable table : kTables) {
    ScopedTable scoped(table);
    Buffer back(in.size());
    ASSERT_TRUE(HuffmanDecode(enc.bytes(), back.mutable_bytes()).ok())
        << in.size() << " table " << static_cast<int>(table);
    ASSERT_EQ(0, std::memcmp(back.data(), in.data(), in.size()))
        << in.size() << " table " << static_cast<int>(table);
  }
}

TEST(ByteHistogramTest, CountsEveryByteAtEveryVectorLevel) {
  std::vector<Buffer> inputs;
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{4095}, size_t{4161}, size_t{100003}}) {
    inputs.push_back(RandomBuffer(n, static_cast<uint32_t>(n)));
    inputs.push_back(SkewedBuffer(n, 0.5, static_cast<uint32_t>(n) + 1));
    Buffer zeros(n);  // all zeros, then zeros with a few bytes set
    if (n > 0) std::memset(zeros.data(), 0, n);
    inputs.push_back(Buffer(zeros.bytes()));
    for (size_t i = 0; i < n; i += 97) zeros.data()[i] = static_cast<std::byte>(i % 251 + 1);
    inputs.push_back(std::move(zeros));
  }
  const CodecVectorLevel before = CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
  for (const Buffer& in : inputs) {
    uint32_t expected[256] = {};
    for (size_t i = 0; i < in.size(); ++i) ++expected[static_cast<uint8_t>(in.data()[i])];
    for (CodecVectorLevel level :
         {CodecVectorLevel::kBaseline, CodecVectorLevel::kAvx2, CodecVectorLevel::kAvx512}) {
      CapCodecVectorLevelForTesting(level);
      uint32_t counts[256];
      ByteHistogram(in.bytes(), counts);
      ASSERT_EQ(0, std::memcmp(counts, expected, sizeof(counts))) << in.size();
    }
  }
  CapCodecVectorLevelForTesting(before);
}

TEST(HuffmanTest, RoundTripsEverySizeAndShape) {
  for (size_t n : {1, 2, 3, 4, 5, 7, 15, 16, 17, 63, 64, 65, 100, 1000, 4099, 65536, 262147}) {
    for (double spread : {0.0, 0.3, 1.0, 3.0, 20.0}) {
      SCOPED_TRACE(std::to_string(n) + " spread " + std::to_string(spread));
      ExpectRoundTrip(SkewedBuffer(n, spread, static_cast<uint32_t>(n)));
    }
  }
}

TEST(HuffmanTest, FitsExactlyItsSizeWithOrWithoutTheCallersHistogram) {
  for (size_t n : {5, 1000, 65536, 262147}) {
    for (double spread : {0.3, 3.0, 20.0}) {
      SCOPED_TRACE(std::to_string(n) + " spread " + std::to_string(spread));
      const Buffer in = SkewedBuffer(n, spread, static_cast<uint32_t>(n) + 7);
      Buffer enc;
      if (!HuffmanEncode(in.bytes(), &enc)) continue;
      // The estimate is at most 3 bytes over (each stream's last byte).
      EXPECT_GE(HuffmanEncodedSize(in.bytes()), enc.size());
      EXPECT_LE(HuffmanEncodedSize(in.bytes()), enc.size() + 3);
      uint32_t counts[256];
      ByteHistogram(in.bytes(), counts);
      Buffer out(n);
      // The same bytes from the caller's histogram, in exactly their room and not in less.
      ASSERT_EQ(HuffmanEncodeTo(in.bytes(), out.data(), enc.size(), counts), enc.size());
      EXPECT_EQ(0, std::memcmp(out.data(), enc.data(), enc.size()));
      // Where it does not fit, dst keeps what was there (a caller may hold other bytes there).
      std::memset(out.data(), 0x5a, out.size());
      EXPECT_EQ(HuffmanEncodeTo(in.bytes(), out.data(), enc.size() - 1, counts), 0u);
      EXPECT_EQ(HuffmanEncodeTo(in.bytes(), out.data(), enc.size() - 1), 0u);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.data()[i], std::byte{0x5a}) << i;
    }
  }
}

TEST(HuffmanTest, ConstantInputCostsOneBitPerByte) {
  Buffer in(80000);
  std::memset(in.data(), 0x3f, in.size());
  Buffer enc;
  ASSERT_TRUE(HuffmanEncode(in.bytes(), &enc));
  EXPECT_LE(enc.size(), in.size() / 8 + 64);
  ExpectRoundTrip(in);
}

TEST(HuffmanTest, DeepTreesAreLimitedToTheMaximumLength) {
  // Geometric frequencies would give codes of up to 255 bits without limiting.
  std::vector<uint8_t> v;
  for (int s = 0; s < 40; ++s) {
    const size_t reps = size_t{1} << std::max(0, 20 - s);
    v.insert(v.end(), reps, static_cast<uint8_t>(s));
  }
  std::shuffle(v.begin(), v.end(), std::mt19937(3));
  ExpectRoundTrip(Buffer(Bytes(reinterpret_cast<const std::byte*>(v.data()), v.size())));
}

TEST(HuffmanTest, LimitedCodesStayNearTheEntropy) {
  // Distributions whose optimal codes run past the limit (geometric tails of several ratios,
  // as the run lengths of a sparse plane, and a Zipf law over every byte): the limited code is
  // complete (it decodes with each table) and within 2% of the order-0 entropy.
  std::mt19937 rng(4);
  for (double ratio : {0.5, 0.7, 0.9, 0.97}) {
    for (bool zipf : {false, true}) {
      std::vector<double> weights(256);
      for (int s = 0; s < 256; ++s) weights[s] = zipf ? 1.0 / (s + 1) : std::pow(ratio, s);
      std::discrete_distribution<int> draw(weights.begin(), weights.end());
      Buffer in(1 << 18);
      for (size_t i = 0; i < in.size(); ++i) in.data()[i] = static_cast<std::byte>(draw(rng));
      ExpectRoundTrip(in);
      uint32_t counts[256];
      ByteHistogram(in.bytes(), counts);
      const double bound = HistogramEntropyBits(counts) * static_cast<double>(in.size()) / 8;
      Buffer enc;
      ASSERT_TRUE(HuffmanEncode(in.bytes(), &enc));
      EXPECT_LT(static_cast<double>(enc.size()), bound * 1.02 + 200) << ratio << " " << zipf;
    }
  }
}

// The entropy PutSegment estimates for a plane: its sample's.
double SampledBits(Bytes in) {
  uint32_t counts[256];
  SampleHistogram(in, counts);
  return HistogramEntropyBits(counts);
}

TEST(HuffmanTest, RandomBytesDoNotShrink) {
  Buffer in(1 << 16);
  std::mt19937 rng(5);
  for (size_t i = 0; i < in.size(); ++i) in.data()[i] = static_cast<std::byte>(rng());
  Buffer enc;
  EXPECT_FALSE(HuffmanEncode(in.bytes(), &enc));
  EXPECT_GT(SampledBits(in.bytes()), 7.8);
  EXPECT_LT(SampledBits(SkewedBuffer(1 << 16, 1.0, 1).bytes()), 3.0);
}

TEST(HuffmanTest, TruncatedOrWrongLengthIsCorruption) {
  Buffer in = SkewedBuffer(50000, 2.0, 9);
  Buffer enc;
  ASSERT_TRUE(HuffmanEncode(in.bytes(), &enc));
  Buffer back(in.size());
  for (HuffmanDecodeTable table : kTables) {
    ScopedTable scoped(table);
    for (size_t cut = 0; cut < enc.size(); cut += 1 + cut / 8) {
      EXPECT_FALSE(HuffmanDecode(enc.bytes().first(cut), back.mutable_bytes()).ok()) << cut;
    }
    // Asking for more or fewer bytes than were encoded.
    Buffer longer(in.size() + 64), shorter(in.size() - 64);
    EXPECT_FALSE(HuffmanDecode(enc.bytes(), longer.mutable_bytes()).ok());
    EXPECT_FALSE(HuffmanDecode(enc.bytes(), shorter.mutable_bytes()).ok());
  }
}

TEST(HuffmanTest, CorruptedStreamsNeverCrashAndBadTablesAreRejected) {
  Buffer in = SkewedBuffer(30000, 2.0, 11);
  Buffer enc;
  ASSERT_TRUE(HuffmanEncode(in.bytes(), &enc));
  std::mt19937 rng(13);
  Buffer back(in.size());
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    ScopedTable scoped(kTables[trial % 3]);
    Buffer bad(enc.bytes());
    const int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f) {
      bad.data()[rng() % bad.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    }
    // Either Corruption or some bytes of the right length: never a crash or an overrun (the
    // record's XXH3 and the chunk's SHA-256 catch what decodes).
    rejected += !HuffmanDecode(bad.bytes(), back.mutable_bytes()).ok();
  }
  EXPECT_GT(rejected, 0);  // lengths and tables catch a share; checksums the rest
  // A table whose code lengths do not form a complete code.
  Buffer bad(enc.bytes());
  bad.data()[1] = static_cast<std::byte>(0xff);
  EXPECT_FALSE(HuffmanDecode(bad.bytes(), back.mutable_bytes()).ok());
}

// Streams that fill their output at different speeds (a run of one symbol decodes 4 symbols per
// lookup, noise 1): each stream is decoded to its end, whichever finishes first; truncations are
// still Corruption.
TEST(HuffmanTest, StreamsOfRunsAndOfNoiseRoundTrip) {
  for (size_t n : {size_t{4000}, size_t{65536}, size_t{262147}}) {
    for (int runs_in : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::to_string(n) + " runs in stream " + std::to_string(runs_in));
      Buffer in = SkewedBuffer(n, 20.0, static_cast<uint32_t>(n + runs_in));
      const size_t run = (n + 3) / 4;
      std::memset(in.data() + run * runs_in, 120, std::min(run, n - run * runs_in));
      ExpectRoundTrip(in);
      Buffer enc;
      ASSERT_TRUE(HuffmanEncode(in.bytes(), &enc));
      Buffer back(n);
      for (HuffmanDecodeTable table : kTables) {
        ScopedTable scoped(table);
        for (size_t cut = enc.size() - 64; cut < enc.size(); ++cut) {
          EXPECT_FALSE(HuffmanDecode(enc.bytes().first(cut), back.mutable_bytes()).ok()) << cut;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ckptfs
