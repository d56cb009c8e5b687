#include "engine/format/dtype.h"

#include <array>

namespace ckptfs {
namespace {

struct DTypeInfo {
  DType type;
  uint8_t size;
  bool floating;
  std::string_view name;         // torch
  std::string_view safetensors;  // "" when none
  std::string_view numpy;        // "" when none
};

// In enumerator order.
constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {DType::kF64, 8, true, "float64", "F64", "<f8"},
    {DType::kF32, 4, true, "float32", "F32", "<f4"},
    {DType::kF16, 2, true, "float16", "F16", "<f2"},
    {DType::kBF16, 2, true, "bfloat16", "BF16", ""},
    {DType::kF8E4M3, 1, true, "float8_e4m3fn", "F8_E4M3", ""},
    {DType::kF8E5M2, 1, true, "float8_e5m2", "F8_E5M2", ""},
    {DType::kI64, 8, false, "int64", "I64", "<i8"},
    {DType::kI32, 4, false, "int32", "I32", "<i4"},
    {DType::kI16, 2, false, "int16", "I16", "<i2"},
    {DType::kI8, 1, false, "int8", "I8", "|i1"},
    {DType::kU64, 8, false, "uint64", "U64", "<u8"},
    {DType::kU32, 4, false, "uint32", "U32", "<u4"},
    {DType::kU16, 2, false, "uint16", "U16", "<u2"},
    {DType::kU8, 1, false, "uint8", "U8", "|u1"},
    {DType::kBool, 1, false, "bool", "BOOL", "|b1"},
    {DType::kC64, 8, false, "complex64", "C64", "<c8"},
    {DType::kC128, 16, false, "complex128", "", "<c16"},
}};

constexpr bool InEnumeratorOrder() {
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (static_cast<size_t>(kInfo[i].type) != i) return false;
  }
  return true;
}
static_assert(InEnumeratorOrder());

const DTypeInfo& Info(DType t) { return kInfo[static_cast<size_t>(t)]; }

struct Alias {
  std::string_view name;
  DType type;
};
constexpr Alias kTorchAliases[] = {
    {"double", DType::kF64}, {"float", DType::kF32},    {"half", DType::kF16},
    {"long", DType::kI64},   {"int", DType::kI32},      {"short", DType::kI16},
    {"cfloat", DType::kC64}, {"cdouble", DType::kC128},
};

}  // namespace

size_t ElementSize(DType t) { return Info(t).size; }
std::string_view DTypeName(DType t) { return Info(t).name; }
std::string_view SafetensorsName(DType t) { return Info(t).safetensors; }
std::string_view NumpyDescr(DType t) { return Info(t).numpy; }
bool IsFloating(DType t) { return Info(t).floating; }

std::optional<DType> DTypeFromName(std::string_view torch_name) {
  for (const DTypeInfo& i : kInfo) {
    if (i.name == torch_name) return i.type;
  }
  for (const Alias& a : kTorchAliases) {
    if (a.name == torch_name) return a.type;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  if (name.empty()) return std::nullopt;
  for (const DTypeInfo& i : kInfo) {
    if (i.safetensors == name) return i.type;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromNumpyDescr(std::string_view descr) {
  if (descr.size() < 2) return std::nullopt;
  const std::string_view kind = descr.substr(1);
  for (const DTypeInfo& i : kInfo) {
    if (i.numpy.empty() || i.numpy.substr(1) != kind) continue;
    const char order = descr[0];
    if (order == i.numpy[0] || order == '=' || (i.size == 1 && order == '<')) return i.type;
  }
  return std::nullopt;
}

}  // namespace ckptfs
