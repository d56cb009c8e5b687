// Tests of the element conversions against torch's own (views_testdata.py convert: specials,
// rounding ties, subnormals, overflow, NaNs, random values and random bit patterns) and of the
// exact round trips.
#include "engine/views/convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>

#include "engine/views/views_test_support.h"

namespace ckptfs {
namespace {

template <typename To, typename From>
To Convert1(DType from, DType to, From v) {
  To out;
  ConvertElements(from, to, reinterpret_cast<const std::byte*>(&v), 1,
                  reinterpret_cast<std::byte*>(&out));
  return out;
}

TEST(ConvertTest, WhatConverts) {
  EXPECT_TRUE(ConvertsTo(DType::kF32, DType::kBF16));
  EXPECT_TRUE(ConvertsTo(DType::kF64, DType::kF16));
  EXPECT_TRUE(ConvertsTo(DType::kBF16, DType::kF32));
  EXPECT_FALSE(ConvertsTo(DType::kF32, DType::kF32));
  EXPECT_FALSE(ConvertsTo(DType::kI64, DType::kBF16));
  EXPECT_FALSE(ConvertsTo(DType::kF32, DType::kI32));
  EXPECT_FALSE(ConvertsTo(DType::kBool, DType::kF16));
}

TEST(ConvertTest, HalfAndBfloatRoundTripExactly) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f16 = Fp16ToFp32(bits), bf16 = Bf16ToFp32(bits);
    if (!std::isnan(f16)) {
      ASSERT_EQ(Fp32ToFp16(f16), bits) << std::hex << h;
    }
    if (!std::isnan(bf16)) {
      ASSERT_EQ(Fp32ToBf16(bf16), bits) << std::hex << h;
    }
    // Up-conversion through ConvertElements is the same, and to fp64 exact too.
    ASSERT_EQ(std::bit_cast<uint32_t>(Convert1<float>(DType::kF16, DType::kF32, bits)),
              std::bit_cast<uint32_t>(f16));
    const double d = Convert1<double>(DType::kBF16, DType::kF64, bits);
    if (!std::isnan(bf16)) {
      ASSERT_EQ(d, static_cast<double>(bf16));
    }
  }
}

TEST(ConvertTest, EqualsTorch) {
  std::istringstream lines(testing::RunTestData("convert"));
  size_t floats = 0, doubles = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    if (line.rfind("d ", 0) == 0) {
      std::string tag, d, f, b, h;
      in >> tag >> d >> f >> b >> h;
      const double v = std::bit_cast<double>(std::stoull(d, nullptr, 16));
      EXPECT_EQ(std::bit_cast<uint32_t>(Convert1<float>(DType::kF64, DType::kF32, v)),
                std::stoul(f, nullptr, 16))
          << line;
      EXPECT_EQ(Convert1<uint16_t>(DType::kF64, DType::kBF16, v), std::stoul(b, nullptr, 16))
          << line;
      EXPECT_EQ(Convert1<uint16_t>(DType::kF64, DType::kF16, v), std::stoul(h, nullptr, 16))
          << line;
      ++doubles;
      continue;
    }
    std::string f, b, h;
    in >> f >> b >> h;
    const float v = std::bit_cast<float>(static_cast<uint32_t>(std::stoul(f, nullptr, 16)));
    const auto want_bf = static_cast<uint16_t>(std::stoul(b, nullptr, 16));
    const auto want_hf = static_cast<uint16_t>(std::stoul(h, nullptr, 16));
    if (std::isnan(v)) {
      // NaN payloads are not kept (torch's vectorised and scalar paths differ on them too):
      // a NaN stays a NaN.
      EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(v)))) << line;
      EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(v)))) << line;
      ++floats;
      continue;
    }
    EXPECT_EQ(Fp32ToBf16(v), want_bf) << line;
    EXPECT_EQ(Fp32ToFp16(v), want_hf) << line;
    EXPECT_EQ(Convert1<uint16_t>(DType::kF32, DType::kBF16, v), want_bf) << line;
    EXPECT_EQ(Convert1<uint16_t>(DType::kF32, DType::kF16, v), want_hf) << line;
    ++floats;
  }
  EXPECT_GT(floats, 4000u);
  EXPECT_GT(doubles, 500u);
}

TEST(ConvertTest, KnownRoundings) {
  // Ties go to even; fp16 overflows to infinity from 65520 on; the smallest subnormal stays.
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(-1e10f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(5.9604645e-08f), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::nanf("")) & 0x7E00, 0x7E00);
  EXPECT_EQ(Fp32ToBf16(std::nanf("")), 0x7FC0);
}

TEST(ConvertTest, ManyElementsUnaligned) {
  // ConvertElements reads and writes at any alignment.
  std::vector<float> in(1001);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.37f - 100.0f;
  std::vector<std::byte> src(in.size() * 4 + 1), dst(in.size() * 2 + 3);
  std::memcpy(src.data() + 1, in.data(), in.size() * 4);
  ConvertElements(DType::kF32, DType::kBF16, src.data() + 1, in.size(), dst.data() + 3);
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, dst.data() + 3 + 2 * i, 2);
    ASSERT_EQ(got, Fp32ToBf16(in[i])) << i;
  }
}

}  // namespace
}  // namespace ckptfs
