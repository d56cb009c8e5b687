// engine/format/dtype.h
//
// The element types of tensors in checkpoint formats, and their names in each format:
//
//   DType t = DTypeFromSafetensorsName("BF16").value();   // kBF16
//   ElementSize(t);      // 2
//   DTypeName(t);        // "bfloat16" (torch's name, as in torch.bfloat16)
//   NumpyDescr(t);       // "": numpy has no bfloat16
//
// Every function is total over the enumerators; a format that has no name for a type gives "".
// The From* lookups take exactly the names the To* functions give (DTypeFromName also takes
// torch's aliases: "float", "half", "long", ...), and nullopt for anything else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ckptfs {

enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // torch.float8_e4m3fn, safetensors F8_E4M3
  kF8E5M2,  // torch.float8_e5m2, safetensors F8_E5M2
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
  kC64,   // complex64: two float32
  kC128,  // complex128: two float64
};
inline constexpr size_t kNumDTypes = static_cast<size_t>(DType::kC128) + 1;

// Bytes per element (1 for kBool).
size_t ElementSize(DType t);
// torch's name: "float32", "bfloat16", "int64", "bool", "complex64", ...
std::string_view DTypeName(DType t);
// The safetensors header's dtype: "F32", "BF16", "I64", "BOOL", ...; "" for kC128.
std::string_view SafetensorsName(DType t);
// The numpy (.npy header) descr, little-endian: "<f4", "<f2", "<i8", "|u1", "|b1", "<c8", ...;
// "" for kBF16 and the float8 types, which numpy lacks.
std::string_view NumpyDescr(DType t);
// Whether t is a real floating-point type (as torch.is_floating_point: not complex).
bool IsFloating(DType t);

std::optional<DType> DTypeFromName(std::string_view torch_name);
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);
// Also takes "=" and, for one-byte types, "<" as the byte order ("=f4", "<u1").
std::optional<DType> DTypeFromNumpyDescr(std::string_view descr);

}  // namespace ckptfs
