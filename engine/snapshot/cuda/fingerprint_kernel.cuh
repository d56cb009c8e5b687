// engine/snapshot/cuda/fingerprint_kernel.cuh
//
// The block fingerprint of fingerprint.h as a CUDA kernel: one thread block per fingerprint
// block, threads striding over its 8-byte words (coalesced), the two sums reduced with warp
// shuffles. Bit-identical to FingerprintBlock (the sums are mod 2^64, so order does not matter).
#pragma once

#include <cstdint>

#include "engine/snapshot/fingerprint.h"

namespace ckptfs::snapshot {

inline constexpr int kFpThreads = 256;

__global__ void FingerprintKernel(const unsigned char* data, uint64_t nbytes, uint64_t block_bytes,
                                  Fingerprint* out) {
  const uint64_t b = blockIdx.x;
  const uint64_t start = b * block_bytes;
  const uint64_t len = nbytes - start < block_bytes ? nbytes - start : block_bytes;
  const unsigned char* p = data + start;
  const uint64_t words = len / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(p) & 7) == 0;
  uint64_t lo = 0, hi = 0;
  for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) {
    uint64_t w = 0;
    if (aligned) {
      w = __ldg(reinterpret_cast<const unsigned long long*>(p) + i);
    } else {
      for (int k = 0; k < 8; ++k) w |= static_cast<uint64_t>(p[i * 8 + k]) << (8 * k);
    }
    lo += FpTermLo(w, i);
    hi += FpTermHi(w, i);
  }
  if (threadIdx.x == 0 && len % 8 != 0) {
    uint64_t w = 0;
    for (uint64_t k = 0; k < len % 8; ++k) w |= static_cast<uint64_t>(p[words * 8 + k]) << (8 * k);
    lo += FpTermLo(w, words);
    hi += FpTermHi(w, words);
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo += __shfl_down_sync(0xffffffffu, lo, o);
    hi += __shfl_down_sync(0xffffffffu, hi, o);
  }
  __shared__ uint64_t s_lo[kFpThreads / 32], s_hi[kFpThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_lo[warp] = lo;
    s_hi[warp] = hi;
  }
  __syncthreads();
  if (warp == 0) {
    lo = lane < kFpThreads / 32 ? s_lo[lane] : 0;
    hi = lane < kFpThreads / 32 ? s_hi[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) {
      lo += __shfl_down_sync(0xffffffffu, lo, o);
      hi += __shfl_down_sync(0xffffffffu, hi, o);
    }
    if (lane == 0) out[b] = FpFinish(lo, hi, len);
  }
}

}  // namespace ckptfs::snapshot
