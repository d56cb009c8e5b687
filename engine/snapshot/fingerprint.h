// engine/snapshot/fingerprint.h
//
// The block fingerprint of the snapshot engine: how it tells, without copying, that a block of
// a tensor equals the same block of the previous snapshot. One definition for both backends:
// the CPU path (FingerprintBlock below) and the CUDA kernel (cuda/fingerprint.cu) include this
// header and must agree bit for bit (tests/snapshot and the CUDA tests check it).
//
// Definition, for a block of `len` bytes:
//   w[i]  = the i-th little-endian 64-bit word of the block, the last one zero-padded
//           (i = 0 .. ceil(len / 8) - 1)
//   lo    = sum over i of Mix(w[i] ^ (i * kKeyLo + kSeedLo))   (mod 2^64)
//   hi    = sum over i of Mix(w[i] ^ (i * kKeyHi + kSeedHi))   (mod 2^64)
//   fp    = { Mix(lo ^ len), Mix(hi + len * kKeyLo) }
// where Mix is MurmurHash3's 64-bit finaliser (a bijection). Each word's term depends on its
// value and its position; the terms are added, so a GPU sums them in any order. It is not a
// cryptographic hash: it detects the changes training makes (any change of any bit changes a
// term), and the chunk id of stored bytes is still their SHA-256.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CKPTFS_FP_HD __host__ __device__ __forceinline__
#else
#define CKPTFS_FP_HD inline
#endif

namespace ckptfs::snapshot {

struct Fingerprint {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const Fingerprint& a, const Fingerprint& b) {
    return a.lo == b.lo && a.hi == b.hi;
  }
};

inline constexpr uint64_t kFpKeyLo = 0x9E3779B97F4A7C15ull;
inline constexpr uint64_t kFpKeyHi = 0xC2B2AE3D27D4EB4Full;
inline constexpr uint64_t kFpSeedLo = 0x243F6A8885A308D3ull;
inline constexpr uint64_t kFpSeedHi = 0x13198A2E03707344ull;

CKPTFS_FP_HD uint64_t FpMix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

CKPTFS_FP_HD uint64_t FpTermLo(uint64_t word, uint64_t i) {
  return FpMix(word ^ (i * kFpKeyLo + kFpSeedLo));
}
CKPTFS_FP_HD uint64_t FpTermHi(uint64_t word, uint64_t i) {
  return FpMix(word ^ (i * kFpKeyHi + kFpSeedHi));
}

CKPTFS_FP_HD Fingerprint FpFinish(uint64_t sum_lo, uint64_t sum_hi, uint64_t len) {
  Fingerprint fp;
  fp.lo = FpMix(sum_lo ^ len);
  fp.hi = FpMix(sum_hi + len * kFpKeyLo);
  return fp;
}

// The fingerprint of `len` bytes at `data` (any alignment), on the CPU.
inline Fingerprint FingerprintBlock(const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t words = len / 8;
  uint64_t lo = 0, hi = 0;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    lo += FpTermLo(w, i);
    hi += FpTermHi(w, i);
  }
  if (len % 8 != 0) {
    uint64_t w = 0;
    std::memcpy(&w, p + words * 8, len % 8);
    lo += FpTermLo(w, words);
    hi += FpTermHi(w, words);
  }
  return FpFinish(lo, hi, len);
}

}  // namespace ckptfs::snapshot
