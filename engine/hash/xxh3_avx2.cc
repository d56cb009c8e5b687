// engine/hash/xxh3_avx2.cc
//
// XXH3-64 with xxHash's AVX2 kernel, for Checksum64 (chunk_id.cc) on CPUs that have AVX2:
// Debian's libxxhash is built for the x86-64 baseline (SSE2), ~9 GB/s per core here on a record
// in cache, this ~18 GB/s; both give the same hash (xxHash's vector kernels are exact).
// Compiled with -mavx2 (engine/CMakeLists.txt), so it must include nothing but xxhash.h (and
// xxh3_two_parts.h, which includes nothing):
// XXH_INLINE_ALL makes every xxHash function static here, and no other inline function is
// compiled for AVX2 where a baseline caller could be linked to it.
#if defined(__x86_64__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include "engine/hash/xxh3_two_parts.h"

namespace ckptfs::hash_internal {

unsigned long long Xxh3Avx2(const void* a, size_t a_len, const void* b, size_t b_len) {
  return Xxh3TwoParts(a, a_len, b, b_len);
}

}  // namespace ckptfs::hash_internal
#endif
