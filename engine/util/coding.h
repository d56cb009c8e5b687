// engine/util/coding.h
//
// Fixed-width integer encoding for on-disk structures. Records and catalog values are
// little-endian; catalog keys are big-endian so that LMDB's byte order sorts them numerically.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace ckptfs {

template <typename T>
inline void PutLE(void* dst, T v) {
  static_assert(std::endian::native == std::endian::little, "ckptfs assumes a little-endian CPU");
  std::memcpy(dst, &v, sizeof(T));
}
template <typename T>
inline T GetLE(const void* src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  return v;
}
inline void PutBE64(void* dst, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(dst, &v, 8);
}
inline uint64_t GetBE64(const void* src) {
  uint64_t v;
  std::memcpy(&v, src, 8);
  return __builtin_bswap64(v);
}
inline void PutBE32(void* dst, uint32_t v) {
  v = __builtin_bswap32(v);
  std::memcpy(dst, &v, 4);
}
inline uint32_t GetBE32(const void* src) {
  uint32_t v;
  std::memcpy(&v, src, 4);
  return __builtin_bswap32(v);
}

}  // namespace ckptfs
