// engine/codec/vector_level.h
//
// The vector instructions the codec's hot loops (plane split and join, Huffman coding) use
// beyond the baseline of the build (x86-64: SSE2), chosen once at run time from the CPU: the
// loops are compiled a second and third time, for AVX2 (with BMI2) and AVX-512 (F, BW, VL, DQ),
// inside functions marked CKPTFS_TARGET_AVX2 / CKPTFS_TARGET_AVX512 (`flatten` inlines the
// loops into them, so the compiler vectorises them for the wider target). Every level writes
// and reads the same bytes; only the speed differs.
//
//   if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) return SplitAvx2(...);
//   return Split(...);  // the baseline
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace ckptfs {

enum class CodecVectorLevel : uint8_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

#if defined(__x86_64__)
#define CKPTFS_TARGET_AVX2 __attribute__((target("avx2,bmi2"), flatten))
#define CKPTFS_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi2"), flatten))
#endif

// For a decoder called with a thread_local table: GCC cloned such functions specialised to the
// caller's table, and the clone fetched the table's address (from %fs, or through
// __tls_get_addr) in every round of its loop, spilling the registers that held the state.
#if defined(__clang__)
#define CKPTFS_NOT_CLONED __attribute__((noinline))
#else
#define CKPTFS_NOT_CLONED __attribute__((noinline, noclone))
#endif

namespace codec_internal {
inline CodecVectorLevel DetectCpuVectorLevel() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2")) {
    return CodecVectorLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2")) {
    return CodecVectorLevel::kAvx2;
  }
#endif
  return CodecVectorLevel::kBaseline;
}
inline std::atomic<CodecVectorLevel> vector_level_cap{CodecVectorLevel::kAvx512};
}  // namespace codec_internal

// The widest level this CPU has (on other architectures: the baseline), under the tests' cap.
inline CodecVectorLevel CodecVectorLevelInUse() {
  static const CodecVectorLevel cpu = codec_internal::DetectCpuVectorLevel();
  return std::min(cpu, codec_internal::vector_level_cap.load(std::memory_order_relaxed));
}

// Extensions that some loops of the AVX-512 level use where the CPU has them (Zen 4, Ice Lake
// and later do): byte permutes (VBMI: rANS's lookups by rank) and byte compression (VBMI2:
// ByteHistogram's zero skipping). Only consulted at the AVX-512 level, so the tests' cap turns
// them off with it.
#if defined(__x86_64__)
#define CKPTFS_CPU_SUPPORTS(feature) __builtin_cpu_supports(feature)
#else
#define CKPTFS_CPU_SUPPORTS(feature) false
#endif
inline bool CodecCpuHasAvx512Vbmi() {
  static const bool has = CKPTFS_CPU_SUPPORTS("avx512vbmi");
  return has;
}
inline bool CodecCpuHasAvx512Vbmi2() {
  static const bool has = CKPTFS_CPU_SUPPORTS("avx512vbmi2");
  return has;
}
#undef CKPTFS_CPU_SUPPORTS

// For tests and engine_bench's --vector-level: uses at most `cap` from now on (in every
// thread); returns the previous cap.
inline CodecVectorLevel CapCodecVectorLevelForTesting(CodecVectorLevel cap) {
  return codec_internal::vector_level_cap.exchange(cap);
}

}  // namespace ckptfs
