#include "engine/codec/codec.h"

#include <gtest/gtest.h>

#include <random>

namespace ckptfs {
namespace {

Buffer Compressible(size_t n) {
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) b.data()[i] = std::byte(static_cast<uint8_t>((i / 64) % 7));
  return b;
}

Buffer Random(size_t n) {
  std::mt19937 rng(7);
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) b.data()[i] = std::byte(static_cast<uint8_t>(rng()));
  return b;
}

class CodecRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(CodecRoundTrip, CompressibleShrinksAndDecodes) {
  CodecSpec spec = *CodecSpec::Parse(GetParam());
  Buffer raw = Compressible(1 << 20), stored;
  Codec used = Compress(spec, raw.bytes(), &stored);
  if (spec.codec != Codec::kNone) {
    EXPECT_EQ(used, spec.codec);
    EXPECT_LT(stored.size(), raw.size() / 4);
  }
  Buffer back(raw.size());
  ASSERT_TRUE(Decompress(used, stored.bytes(), back.mutable_bytes()).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), raw.data(), raw.size()));
}

TEST_P(CodecRoundTrip, IncompressibleIsStoredRaw) {
  CodecSpec spec = *CodecSpec::Parse(GetParam());
  Buffer raw = Random(100000), stored;
  EXPECT_EQ(Compress(spec, raw.bytes(), &stored), Codec::kNone);
  EXPECT_EQ(stored.size(), raw.size());
}

INSTANTIATE_TEST_SUITE_P(All, CodecRoundTrip, ::testing::Values("none", "lz4", "zstd", "zstd:9"));

TEST(Codec, DamagedInputIsCorruptionNotWrongBytes) {
  for (const char* name : {"lz4", "zstd"}) {
    CodecSpec spec = *CodecSpec::Parse(name);
    Buffer raw = Compressible(1 << 16), stored;
    Codec used = Compress(spec, raw.bytes(), &stored);
    Buffer back(raw.size());
    // Truncated input and a wrong expected length both fail.
    EXPECT_TRUE(Decompress(used, stored.bytes().first(stored.size() / 2), back.mutable_bytes())
                    .IsCorruption())
        << name;
    Buffer longer(raw.size() + 1);
    EXPECT_TRUE(Decompress(used, stored.bytes(), longer.mutable_bytes()).IsCorruption()) << name;
  }
}

TEST(Codec, ParseRejectsUnknownNamesAndLevels) {
  EXPECT_FALSE(CodecSpec::Parse("gzip").ok());
  EXPECT_FALSE(CodecSpec::Parse("lz4:3").ok());
  EXPECT_FALSE(CodecSpec::Parse("zstd:99").ok());
  EXPECT_FALSE(CodecSpec::Parse("zstd:x").ok());
  EXPECT_EQ(CodecSpec::Parse("zstd:7")->level, 7);
  EXPECT_EQ(CodecSpec::Parse("zstd")->ToString(), "zstd:3");
  EXPECT_FALSE(CodecSpec::Parse("auto+none").ok());
  EXPECT_FALSE(CodecSpec::Parse("auto+auto").ok());
  EXPECT_FALSE(CodecSpec::Parse("auto:3").ok());
}

TEST(Codec, AutoIsTheDefaultAndEverySpecRoundTripsThroughItsName) {
  EXPECT_EQ(CodecSpec{}.ToString(), "auto");
  EXPECT_TRUE(CodecSpec::Parse("auto")->entropy);
  EXPECT_FALSE(CodecSpec::Parse("lz4")->entropy);
  for (const char* name : {"auto", "lz4", "none", "zstd:3", "zstd:19", "auto+zstd:1"}) {
    EXPECT_EQ(CodecSpec::Parse(name)->ToString(), name);
  }
  EXPECT_EQ(CodecSpec::Parse("auto+lz4")->ToString(), "auto");
}

}  // namespace
}  // namespace ckptfs
