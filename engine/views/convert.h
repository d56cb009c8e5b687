// engine/views/convert.h
//
// Element conversions between floating types, bit-exact with torch's scalar conversions
// (c10::BFloat16, c10::Half), so that a precision view equals `t.to(torch.bfloat16)` /
// `t.half()`:
//
//   ConvertElements(DType::kF32, DType::kBF16, src, n, dst);   // n elements
//
// - fp32 -> bf16: round to nearest even; NaN becomes 0x7FC0 (c10's round_to_nearest_even).
// - fp32 -> fp16: IEEE round to nearest even, overflow to +-inf, subnormals kept; NaN becomes
//   sign | 0x7E00 (the FP16 library's fp16_ieee_from_fp32_value, which c10::Half uses).
// - fp64 -> fp16/bf16 goes through fp32 first, as torch does (double -> float -> half).
// - fp16/bf16 -> fp32 and fp32 -> fp64 are exact; fp64 -> fp32 is IEEE round to nearest.
// NaNs stay NaNs but their payloads are not kept bit for bit (torch's own vectorised and scalar
// paths disagree on them: 0xFFFF vs 0x7FC0 for bf16). Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/format/dtype.h"

namespace ckptfs {

// Whether a precision view converts elements of `from` when it targets `to`: both are
// fp64/fp32/fp16/bf16 and differ. Everything else passes unchanged.
bool ConvertsTo(DType from, DType to);

uint16_t Fp32ToBf16(float f);
uint16_t Fp32ToFp16(float f);
float Bf16ToFp32(uint16_t h);
float Fp16ToFp32(uint16_t h);

// Converts n elements of `from` at src (little-endian, any alignment) into n elements of `to`
// at dst. REQUIRES: ConvertsTo(from, to) or from == to.
void ConvertElements(DType from, DType to, const std::byte* src, size_t n, std::byte* dst);

}  // namespace ckptfs
