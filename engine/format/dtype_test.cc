#include "engine/format/dtype.h"

#include <gtest/gtest.h>

#include <string>

namespace ckptfs {
namespace {

TEST(DTypeTest, NamesRoundTripInEveryFormat) {
  for (size_t i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    SCOPED_TRACE(std::string(DTypeName(t)));
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
    if (!SafetensorsName(t).empty()) {
      EXPECT_EQ(DTypeFromSafetensorsName(SafetensorsName(t)), t);
    }
    if (!NumpyDescr(t).empty()) {
      EXPECT_EQ(DTypeFromNumpyDescr(NumpyDescr(t)), t);
      // The descr's size is the element size.
      EXPECT_EQ(std::stoul(std::string(NumpyDescr(t).substr(2))), ElementSize(t));
    }
  }
}

TEST(DTypeTest, MatchesTheFormats) {
  EXPECT_EQ(ElementSize(DType::kBF16), 2u);
  EXPECT_EQ(ElementSize(DType::kC128), 16u);
  EXPECT_EQ(ElementSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeName(DType::kBF16), "bfloat16");
  EXPECT_EQ(SafetensorsName(DType::kBF16), "BF16");
  EXPECT_EQ(SafetensorsName(DType::kBool), "BOOL");
  EXPECT_EQ(SafetensorsName(DType::kC128), "");
  EXPECT_EQ(NumpyDescr(DType::kF16), "<f2");
  EXPECT_EQ(NumpyDescr(DType::kBool), "|b1");
  EXPECT_EQ(NumpyDescr(DType::kBF16), "");
  EXPECT_EQ(DTypeFromName("half"), DType::kF16);
  EXPECT_EQ(DTypeFromName("long"), DType::kI64);
  EXPECT_EQ(DTypeFromName("Float"), std::nullopt);
  EXPECT_EQ(DTypeFromSafetensorsName(""), std::nullopt);
  EXPECT_EQ(DTypeFromSafetensorsName("f32"), std::nullopt);
  EXPECT_EQ(DTypeFromNumpyDescr("=f4"), DType::kF32);
  EXPECT_EQ(DTypeFromNumpyDescr("<u1"), DType::kU8);
  EXPECT_EQ(DTypeFromNumpyDescr(">f4"), std::nullopt);  // big-endian: not ours
  EXPECT_EQ(DTypeFromNumpyDescr("|f4"), std::nullopt);
  EXPECT_TRUE(IsFloating(DType::kBF16));
  EXPECT_TRUE(IsFloating(DType::kF8E5M2));
  EXPECT_FALSE(IsFloating(DType::kC64));
  EXPECT_FALSE(IsFloating(DType::kI8));
}

}  // namespace
}  // namespace ckptfs
