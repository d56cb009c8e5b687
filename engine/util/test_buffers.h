// engine/util/test_buffers.h
//
// Test data for the unit tests beside the code: RandomBuffer(n, seed) is n pseudo-random
// bytes, the same for the same seed (incompressible, so every chunk is stored as written).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>

#include "engine/util/buffer.h"

namespace ckptfs {

inline Buffer RandomBuffer(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  Buffer b(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return b;
}

}  // namespace ckptfs
