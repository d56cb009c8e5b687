#include "engine/views/convert.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace ckptfs {
namespace {

bool IsConvertible(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Any floating element as fp64 (exact for all four types).
double ToDouble(DType from, const std::byte* p) {
  switch (from) {
    case DType::kF64:
      return Load<double>(p);
    case DType::kF32:
      return Load<float>(p);
    case DType::kF16:
      return Fp16ToFp32(Load<uint16_t>(p));
    default:
      return Bf16ToFp32(Load<uint16_t>(p));
  }
}

// Any floating element as fp32: exact except from fp64, which rounds (as static_cast does).
float ToFloat(DType from, const std::byte* p) { return static_cast<float>(ToDouble(from, p)); }

}  // namespace

bool ConvertsTo(DType from, DType to) {
  return from != to && IsConvertible(from) && IsConvertible(to);
}

uint16_t Fp32ToBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounding_bias = ((u >> 16) & 1) + 0x7FFF;
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

uint16_t Fp32ToFp16(float f) {
  // fp16_ieee_from_fp32_value (Maratyszcza/FP16): the rounding is done by the FPU.
  const float scale_to_inf = std::bit_cast<float>(uint32_t{0x77800000});   // 0x1.0p+112
  const float scale_to_zero = std::bit_cast<float>(uint32_t{0x08800000});  // 0x1.0p-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float Bf16ToFp32(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

float Fp16ToFp32(uint16_t h) {
  // fp16_ieee_to_fp32_value: exact.
  const uint32_t w = uint32_t{h} << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = std::bit_cast<float>(uint32_t{0x7800000});  // 0x1.0p-112
  const float normalized = std::bit_cast<float>((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? std::bit_cast<uint32_t>(denormalized)
                                          : std::bit_cast<uint32_t>(normalized));
  return std::bit_cast<float>(result);
}

void ConvertElements(DType from, DType to, const std::byte* src, size_t n, std::byte* dst) {
  const size_t in = ElementSize(from), out = ElementSize(to);
  if (from == to) {
    std::memcpy(dst, src, n * in);
    return;
  }
  if (from == DType::kF32 && to == DType::kBF16) {  // the common case, kept tight
    for (size_t i = 0; i < n; ++i) Store(dst + 2 * i, Fp32ToBf16(Load<float>(src + 4 * i)));
    return;
  }
  if (from == DType::kF32 && to == DType::kF16) {
    for (size_t i = 0; i < n; ++i) Store(dst + 2 * i, Fp32ToFp16(Load<float>(src + 4 * i)));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const std::byte* s = src + i * in;
    std::byte* d = dst + i * out;
    switch (to) {
      case DType::kF64:
        Store(d, ToDouble(from, s));
        break;
      case DType::kF32:
        Store(d, ToFloat(from, s));
        break;
      case DType::kF16:
        Store(d, Fp32ToFp16(ToFloat(from, s)));
        break;
      default:
        Store(d, Fp32ToBf16(ToFloat(from, s)));
        break;
    }
  }
}

}  // namespace ckptfs
