// engine/hash/xxh3_two_parts.h
//
// XXH3-64 of a followed by b, streamed (no joined copy): the one body of Checksum64's two-part
// form, compiled twice, against libxxhash in chunk_id.cc and against xxHash's inline AVX2
// kernel in xxh3_avx2.cc. Include it after <xxhash.h> (with XXH_STATIC_LINKING_ONLY or
// XXH_INLINE_ALL, for XXH3_state_t); it includes nothing itself, so that the AVX2 file compiles
// no other inline function for AVX2.
#pragma once

namespace ckptfs::hash_internal {

static inline unsigned long long Xxh3TwoParts(const void* a, size_t a_len, const void* b,
                                              size_t b_len) {
  if (b_len == 0) return XXH3_64bits(a, a_len);
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, a, a_len);
  XXH3_64bits_update(&state, b, b_len);
  return XXH3_64bits_digest(&state);
}

}  // namespace ckptfs::hash_internal
