#include "engine/codec/vector_level.h"

#include <gtest/gtest.h>

namespace ckptfs {
namespace {

TEST(CodecVectorLevelTest, TheCapLimitsTheLevelInUseAndIsRestored) {
  const CodecVectorLevel widest = CodecVectorLevelInUse();
  const CodecVectorLevel before = CapCodecVectorLevelForTesting(CodecVectorLevel::kBaseline);
  EXPECT_EQ(CodecVectorLevelInUse(), CodecVectorLevel::kBaseline);
  EXPECT_EQ(CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx2), CodecVectorLevel::kBaseline);
  EXPECT_LE(CodecVectorLevelInUse(), CodecVectorLevel::kAvx2);
  EXPECT_LE(CodecVectorLevelInUse(), widest);
  CapCodecVectorLevelForTesting(before);
  EXPECT_EQ(CodecVectorLevelInUse(), widest);
#if !defined(__x86_64__)
  EXPECT_EQ(widest, CodecVectorLevel::kBaseline);
#endif
}

}  // namespace
}  // namespace ckptfs
