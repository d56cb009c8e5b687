// engine/util/test_buffers.h
//
// Test data for the unit tests beside the code: RandomBuffer(n, seed) is n pseudo-random
// bytes, the same for the same seed (incompressible, so every chunk is stored as written);
// SkewedBuffer(n, spread, seed) n bytes around 120 with a normal spread (a plane an entropy
// coder shrinks: 0 gives one symbol, 20 about 6.4 bits per byte).
#pragma once

#include <algorithm>
#include <cmath>
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

inline Buffer SkewedBuffer(size_t n, double spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(120.0, spread);
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) {
    b.data()[i] = static_cast<std::byte>(static_cast<uint8_t>(std::lround(d(rng))));
  }
  return b;
}

}  // namespace ckptfs
