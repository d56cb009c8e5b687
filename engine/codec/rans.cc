#include "engine/codec/rans.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "engine/codec/huffman.h"
#include "engine/codec/huffman_decoder.h"
#include "engine/codec/vector_level.h"
#include "engine/util/coding.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs {
namespace {

constexpr uint32_t kScale = uint32_t{1} << kRansScaleBits;  // frequencies sum to this
constexpr uint32_t kMask = kScale - 1;
constexpr uint32_t kLow = uint32_t{1} << 15;  // states live in [kLow, 2^31)
constexpr int kStates = kRansStates;
constexpr size_t kBitmapBytes = 32;
constexpr size_t kStateBytes = 4 * kStates;

// Quantises a histogram to frequencies that sum to kScale, each present symbol at least 1 and
// every frequency below kScale (a lone symbol gets a companion of frequency 1). Returns the
// number of symbols with a frequency.
int Normalise(const uint32_t counts[256], uint32_t freq[256]) {
  uint64_t n = 0;
  int present = 0, lone = 0;
  for (int s = 0; s < 256; ++s) {
    n += counts[s];
    if (counts[s] > 0) {
      ++present;
      lone = s;
    }
  }
  std::fill(freq, freq + 256, 0u);
  if (present == 0) return 0;
  if (present == 1) {
    freq[lone] = kScale - 1;
    freq[(lone + 1) & 255] = 1;
    return 2;
  }
  int64_t sum = 0;
  int largest = 0;
  for (int s = 0; s < 256; ++s) {
    if (counts[s] == 0) continue;
    const uint64_t f = (uint64_t{counts[s]} * kScale + n / 2) / n;
    freq[s] = static_cast<uint32_t>(std::max<uint64_t>(1, f));
    sum += freq[s];
    if (counts[s] > counts[largest]) largest = s;
  }
  // Rounding leaves the sum a little off: the difference goes to (or comes from) the most
  // frequent symbols, whose cost per unit of frequency is the smallest.
  int64_t diff = int64_t{kScale} - sum;
  while (diff != 0) {
    if (diff > 0) {
      freq[largest] += static_cast<uint32_t>(diff);
      diff = 0;
    } else {
      int top = -1;
      for (int s = 0; s < 256; ++s) {
        if (freq[s] > 1 && (top < 0 || freq[s] > freq[top])) top = s;
      }
      const uint32_t take = static_cast<uint32_t>(std::min<int64_t>(-diff, freq[top] - 1));
      freq[top] -= take;
      diff += take;
    }
  }
  return present;
}

size_t HeaderBytes(int present) { return kBitmapBytes + 2 * size_t(present) + kStateBytes; }

// What encoding one symbol takes: the state bound at or above which a word goes out first, and
// the division x / freq as a multiply by a 32-bit reciprocal and a shift (Granlund and
// Montgomery; Giesen's rans_byte: exact for every x < 2^31, where states live), folded into
// x' = x + bias + q * complement = (x / freq) * kScale + x % freq + start.
struct EncSymbol {
  uint32_t reciprocal;
  uint32_t shift;
  uint32_t x_max;
  uint32_t bias;
  uint32_t complement;
};

void EncSymbols(const uint32_t freq[256], EncSymbol sym[256]) {
  uint32_t start = 0;
  for (int s = 0; s < 256; ++s) {
    const uint32_t f = freq[s];
    EncSymbol& e = sym[s];
    if (f == 0) {
      e = {};
      continue;
    }
    e.x_max = ((kLow >> kRansScaleBits) << 16) * f;
    e.complement = kScale - f;
    if (f == 1) {
      // q = x - 1 (x >= kLow > 0), so x' = x + bias + (x - 1)(kScale - 1) = x kScale + start.
      e.reciprocal = UINT32_MAX;
      e.shift = 0;
      e.bias = start + kScale - 1;
    } else {
      uint32_t bits = 0;
      while (f > (uint32_t{1} << bits)) ++bits;
      e.reciprocal = static_cast<uint32_t>(((uint64_t{1} << (bits + 31)) + f - 1) / f);
      e.shift = bits - 1;
      e.bias = start;
    }
    start += f;
  }
}

inline uint32_t EncodeOne(uint32_t x, const EncSymbol& e) {
  const uint32_t q = static_cast<uint32_t>((uint64_t{x} * e.reciprocal) >> 32) >> e.shift;
  return x + e.bias + q * e.complement;
}

// The decoder's position: the next word, the end of the words, the states.
struct Stream {
  const uint8_t* w;
  const uint8_t* end;
  uint32_t* x;  // kStates
};

#if defined(__x86_64__)

// Whole rounds of kStates symbols decoded as vectors of states (lane j of vector c is state
// 16c + j, or 8c + j with AVX2): the table lookups as gathers, and the words spread to the lanes
// that read them in lane order (the order the scalar decoder reads them in). Only the word
// pointer links the vectors, so their gathers overlap (with 32 states, two vectors of 16, bf16
// deltas decoded ~20% slower here). Decodes while a round's words can be loaded without a bounds
// check; returns the symbols decoded. The same bytes as the scalar loop.
// GCC 12's AVX-512 intrinsics start from a deliberately undefined vector (_mm512_undefined_*),
// which -Wmaybe-uninitialized reports in every caller.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The AVX-512 decoders' renormalisation of 16 states: those below kLow read the next words from
// *w, in lane order (spread to them by vpexpandd), and *w moves past the words read.
__attribute__((target("avx512f"), always_inline)) inline __m512i RenormaliseAvx512(
    __m512i next, const uint8_t** w) {
  const __mmask16 reads = _mm512_cmplt_epu32_mask(next, _mm512_set1_epi32(kLow));
  const __m512i words =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(*w)));
  *w += 2 * __builtin_popcount(reads);
  return _mm512_mask_or_epi32(next, reads, _mm512_slli_epi32(next, 16),
                              _mm512_maskz_expand_epi32(reads, words));
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi2"))) CKPTFS_NOT_CLONED size_t
DecodeRoundsAvx512(const uint32_t* t, Stream* s, uint8_t* out, size_t n) {
  const __m512i mask = _mm512_set1_epi32(kMask);
  __m512i x[4];
  for (int c = 0; c < 4; ++c) x[c] = _mm512_load_si512(s->x + 16 * c);
  const uint8_t* w = s->w;
  size_t i = 0;
  for (; i + kStates <= n && s->end - w >= 2 * kStates; i += kStates) {
    for (int c = 0; c < 4; ++c) {
      const __m512i slot = _mm512_and_si512(x[c], mask);
      const __m512i e = _mm512_i32gather_epi32(slot, t, 4);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 16 * c), _mm512_cvtepi32_epi8(e));
      const __m512i next = _mm512_add_epi32(
          _mm512_mullo_epi32(_mm512_srli_epi32(e, 20), _mm512_srli_epi32(x[c], kRansScaleBits)),
          _mm512_and_si512(_mm512_srli_epi32(e, 8), mask));
      x[c] = RenormaliseAvx512(next, &w);
    }
  }
  for (int c = 0; c < 4; ++c) _mm512_store_si512(s->x + 16 * c, x[c]);
  s->w = w;
  return i;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// For each mask of the 8 lanes that read a word: per lane, which of the next 8 words it reads.
struct WordPermutations {
  alignas(32) uint32_t index[256][8];
  WordPermutations() {
    for (int m = 0; m < 256; ++m) {
      int k = 0;
      for (int lane = 0; lane < 8; ++lane) index[m][lane] = m >> lane & 1 ? k++ : 0;
    }
  }
};

__attribute__((target("avx2,bmi2"))) CKPTFS_NOT_CLONED size_t DecodeRoundsAvx2(const uint32_t* t,
                                                                               Stream* s,
                                                                               uint8_t* out,
                                                                               size_t n) {
  static const WordPermutations perms;
  const __m256i mask = _mm256_set1_epi32(kMask);
  const __m256i low_bytes =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i halves = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
  __m256i x[8];
  for (int c = 0; c < 8; ++c)
    x[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(s->x + 8 * c));
  const uint8_t* w = s->w;
  size_t i = 0;
  for (; i + kStates <= n && s->end - w >= 2 * kStates; i += kStates) {
    for (int c = 0; c < 8; ++c) {
      const __m256i slot = _mm256_and_si256(x[c], mask);
      const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(t), slot, 4);
      const __m256i syms = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(e, low_bytes), halves);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i + 8 * c), _mm256_castsi256_si128(syms));
      const __m256i next = _mm256_add_epi32(
          _mm256_mullo_epi32(_mm256_srli_epi32(e, 20), _mm256_srli_epi32(x[c], kRansScaleBits)),
          _mm256_and_si256(_mm256_srli_epi32(e, 8), mask));
      const __m256i reads = _mm256_cmpeq_epi32(_mm256_srli_epi32(next, 15), _mm256_setzero_si256());
      const int m = _mm256_movemask_ps(_mm256_castsi256_ps(reads));
      const __m256i words =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
      const __m256i spread = _mm256_permutevar8x32_epi32(
          words, _mm256_load_si256(reinterpret_cast<const __m256i*>(perms.index[m])));
      x[c] = _mm256_blendv_epi8(next, _mm256_or_si256(_mm256_slli_epi32(next, 16), spread), reads);
      w += 2 * __builtin_popcount(static_cast<unsigned>(m));
    }
  }
  for (int c = 0; c < 8; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(s->x + 8 * c), x[c]);
  s->w = w;
  return i;
}

// The symbol tables of the vector encoders, gathered by symbol. Where at most kRankedSymbols
// symbols are present (the planes rANS takes have 6-45), also the same entries by rank (the
// symbol's place among those present), for EncodeRoundsAvx512 to look up with permutes: a
// gather of 16 lanes takes ~6 ns on this VM's Zen 4 (2.6 G lanes/s at most, two per symbol),
// a permute about a cycle.
inline constexpr int kRankedSymbols = 64;
struct EncTables {
  alignas(64) uint32_t reciprocal[256];
  alignas(64) uint32_t packed[256];  // bias (bits 0-12), complement (13-24), shift (25-28)
  alignas(64) uint32_t ranked_reciprocal[kRankedSymbols];
  alignas(64) uint32_t ranked_packed[kRankedSymbols];
  alignas(64) uint8_t rank[256];  // 0 for absent symbols
  int present = 0;
};

void MakeEncTables(const EncSymbol sym[256], EncTables* t) {
  t->present = 0;
  for (int s = 0; s < 256; ++s) {
    t->reciprocal[s] = sym[s].reciprocal;
    t->packed[s] = sym[s].bias | sym[s].complement << 13 | sym[s].shift << 25;
    t->rank[s] = 0;
    if (sym[s].x_max == 0) continue;  // absent
    if (t->present < kRankedSymbols) {
      t->rank[s] = static_cast<uint8_t>(t->present);
      t->ranked_reciprocal[t->present] = t->reciprocal[s];
      t->ranked_packed[t->present] = t->packed[s];
    }
    ++t->present;
  }
}

// out[i] = rank[in[i]] for i < n, 64 bytes a step with AVX-512 VBMI's byte permutes (the 256
// ranks as four vectors of 64).
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void RanksVbmi(const uint8_t rank[256],
                                                                      const uint8_t* in, size_t n,
                                                                      uint8_t* out) {
  const __m512i r0 = _mm512_load_si512(rank), r1 = _mm512_load_si512(rank + 64);
  const __m512i r2 = _mm512_load_si512(rank + 128), r3 = _mm512_load_si512(rank + 192);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i s = _mm512_loadu_si512(in + i);
    const __m512i low = _mm512_permutex2var_epi8(r0, s, r1);   // symbols 0-127
    const __m512i high = _mm512_permutex2var_epi8(r2, s, r3);  // 128-255
    _mm512_storeu_si512(out + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(s), low, high));
  }
  for (; i < n; ++i) out[i] = rank[in[i]];
}

// Whole rounds encoded as four vectors of 16 states (states 48..63 first, 0..15 last, as the
// scalar loop goes: backwards), from the group that ends at `g` down, while a round's words fit
// above `lowest`: the symbols' reciprocals and packed bias / complement / shift as gathers, the
// words of the states that write one compressed into lane order and stored below *w. The same bytes
// as the scalar loop; returns where it stopped (a multiple of kStates).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Entry `index` (< 64, per lane) of a table of 64 held as four vectors.
__attribute__((target("avx512f"), always_inline)) inline __m512i Lookup64(const __m512i* table,
                                                                          __m512i index) {
  const __m512i low = _mm512_permutex2var_epi32(table[0], index, table[1]);
  const __m512i high = _mm512_permutex2var_epi32(table[2], index, table[3]);
  return _mm512_mask_blend_epi32(_mm512_test_epi32_mask(index, _mm512_set1_epi32(32)), low, high);
}

// kRanked: `p` holds the symbols' ranks (RanksVbmi) and the entries come from the ranked
// tables by permutes; otherwise `p` holds the symbols and the entries are gathered.
template <bool kRanked>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi2"))) size_t EncodeRoundsAvx512(
    const EncTables& t, const uint8_t* p, size_t g, uint32_t* x_io, uint8_t** w_io,
    const uint8_t* lowest) {
  __m512i ranked_rcp[4], ranked_packed[4];
  if constexpr (kRanked) {
    for (int q = 0; q < 4; ++q) {
      ranked_rcp[q] = _mm512_load_si512(t.ranked_reciprocal + 16 * q);
      ranked_packed[q] = _mm512_load_si512(t.ranked_packed + 16 * q);
    }
  }
  __m512i x[4];
  for (int c = 0; c < 4; ++c) x[c] = _mm512_load_si512(x_io + 16 * c);
  const __m512i low13 = _mm512_set1_epi32(0x1fff);
  const __m512i mask12 = _mm512_set1_epi32(kMask);
  const __m512i scale = _mm512_set1_epi32(kScale);
  uint8_t* w = *w_io;
  // A round writes at most 2 * kStates bytes, and each vector's store reaches 32 bytes below its
  // words.
  for (; g > 0 && w - lowest >= 2 * kStates + 32; g -= kStates) {
    for (int c = 3; c >= 0; --c) {
      const __m512i sy = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + g - kStates + 16 * c)));
      __m512i rcp, packed;
      if constexpr (kRanked) {
        rcp = Lookup64(ranked_rcp, sy);
        packed = Lookup64(ranked_packed, sy);
      } else {
        rcp = _mm512_i32gather_epi32(sy, t.reciprocal, 4);
        packed = _mm512_i32gather_epi32(sy, t.packed, 4);
      }
      const __m512i bias = _mm512_and_si512(packed, low13);
      const __m512i complement = _mm512_and_si512(_mm512_srli_epi32(packed, 13), mask12);
      const __m512i shift = _mm512_srli_epi32(packed, 25);
      const __m512i x_max =
          _mm512_slli_epi32(_mm512_sub_epi32(scale, complement), 19);  // freq << 19
      __m512i v = x[c];
      const __mmask16 out = _mm512_cmpge_epu32_mask(v, x_max);
      // The words compressed into lane order, rotated to the top lanes and stored as 32 bytes
      // ending at *w (a masked store of just the words is slow on this CPU): the bytes below
      // them are room the stream has not used yet.
      const int count = __builtin_popcount(out);
      const __m512i rotate = _mm512_and_si512(
          _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(count)),
          _mm512_set1_epi32(15));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w - 32),
                          _mm512_cvtepi32_epi16(_mm512_permutexvar_epi32(
                              rotate, _mm512_maskz_compress_epi32(out, v))));
      w -= 2 * count;
      v = _mm512_mask_srli_epi32(v, out, v, 16);
      // q = mulhi(v, rcp) >> shift, the even and odd lanes' 64-bit products put back together.
      const __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(v, rcp), 32);
      const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(v, 32), _mm512_srli_epi64(rcp, 32));
      const __m512i q = _mm512_srlv_epi32(_mm512_mask_blend_epi32(0xAAAA, even, odd), shift);
      x[c] = _mm512_add_epi32(_mm512_add_epi32(v, bias), _mm512_mullo_epi32(q, complement));
    }
  }
  for (int c = 0; c < 4; ++c) _mm512_store_si512(x_io + 16 * c, x[c]);
  *w_io = w;
  return g;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// For each mask of the 8 lanes that write a word: the lanes, in order, gathered to the top of
// the vector (the rest below them), so that the words end where the stream's free room ends.
struct WordCompressions {
  alignas(32) uint32_t index[256][8];
  WordCompressions() {
    for (int m = 0; m < 256; ++m) {
      const int count = __builtin_popcount(static_cast<unsigned>(m));
      int k = 8 - count;
      for (int lane = 0; lane < 8; ++lane) index[m][lane] = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (m >> lane & 1) index[m][k++] = static_cast<uint32_t>(lane);
      }
    }
  }
};

// EncodeRoundsAvx512 with AVX2: eight vectors of 8 states; a vector's words are compressed to
// the top of 16 bytes by a permutation and stored as a whole at *w - 16, whose bytes below the
// words are room the stream has not used yet. The same bytes as the scalar loop.
__attribute__((target("avx2,bmi2"))) size_t EncodeRoundsAvx2(const EncTables& t, const uint8_t* p,
                                                             size_t g, uint32_t* x_io,
                                                             uint8_t** w_io,
                                                             const uint8_t* lowest) {
  static const WordCompressions compress;
  __m256i x[8];
  for (int c = 0; c < 8; ++c) {
    x[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(x_io + 8 * c));
  }
  const __m256i low13 = _mm256_set1_epi32(0x1fff);
  const __m256i mask12 = _mm256_set1_epi32(kMask);
  const __m256i scale = _mm256_set1_epi32(kScale);
  // The low 16 bits of each 32-bit lane, packed into the low 8 bytes of each 128-bit half.
  const __m256i words16 =
      _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9,
                       12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  uint8_t* w = *w_io;
  // A round writes at most 2 * kStates bytes, and each vector's store reaches 16 bytes below
  // its words.
  for (; g > 0 && w - lowest >= 2 * kStates + 16; g -= kStates) {
    for (int c = 7; c >= 0; --c) {
      const __m256i sy = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + g - kStates + 8 * c)));
      const __m256i rcp = _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.reciprocal), sy, 4);
      const __m256i packed = _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.packed), sy, 4);
      const __m256i bias = _mm256_and_si256(packed, low13);
      const __m256i complement = _mm256_and_si256(_mm256_srli_epi32(packed, 13), mask12);
      const __m256i shift = _mm256_srli_epi32(packed, 25);
      const __m256i x_max = _mm256_slli_epi32(_mm256_sub_epi32(scale, complement), 19);
      __m256i v = x[c];
      // States and bounds are below 2^31: a signed compare is the unsigned one.
      const __m256i out = _mm256_xor_si256(_mm256_cmpgt_epi32(x_max, v), _mm256_set1_epi32(-1));
      const int m = _mm256_movemask_ps(_mm256_castsi256_ps(out));
      const __m256i top = _mm256_permutevar8x32_epi32(
          v, _mm256_load_si256(reinterpret_cast<const __m256i*>(compress.index[m])));
      const __m256i halves = _mm256_shuffle_epi8(top, words16);
      const __m128i packed16 =
          _mm256_castsi256_si128(_mm256_permute4x64_epi64(halves, 0x08));  // halves' low qwords
      _mm_storeu_si128(reinterpret_cast<__m128i*>(w - 16), packed16);
      w -= 2 * __builtin_popcount(static_cast<unsigned>(m));
      v = _mm256_blendv_epi8(v, _mm256_srli_epi32(v, 16), out);
      const __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(v, rcp), 32);
      const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(v, 32), _mm256_srli_epi64(rcp, 32));
      const __m256i q = _mm256_srlv_epi32(_mm256_blend_epi32(even, odd, 0xAA), shift);
      x[c] = _mm256_add_epi32(_mm256_add_epi32(v, bias), _mm256_mullo_epi32(q, complement));
    }
  }
  for (int c = 0; c < 8; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(x_io + 8 * c), x[c]);
  *w_io = w;
  return g;
}

// The decoder's tables by rank: per bucket of 16 slots the rank of its first slot's symbol, or
// 0x80 where the bucket holds more than two symbols (its lanes are gathered from the full
// table); per rank the symbol's start slot (bits 0-11), frequency (12-23) and value (24-31), and
// its end slot (start + frequency). Ranks number only the symbols that own a slot of some bucket
// of one or two symbols, in symbol order: clusters of rare symbols do not take ranks, so that
// most planes need at most 32 (one permute per lookup). `ranks`: how many.
struct RankedDecTables {
  alignas(64) uint32_t packed[kRankedSymbols];
  alignas(64) uint32_t end[kRankedSymbols];
  alignas(64) uint8_t bucket[256];
  int ranks = 0;
};

// Fills `r` from the frequencies of the present symbols; false where more than kRankedSymbols
// symbols would need a rank.
bool MakeRankedDecTables(const uint32_t freq[256], RankedDecTables* r) {
  // The present symbols in order with their end slots; then which ones own a slot of a bucket
  // of at most two symbols.
  uint8_t symbol[256];
  uint32_t end[256];
  int present = 0;
  for (uint32_t s = 0, at = 0; s < 256; ++s) {
    if (freq[s] == 0) continue;
    at += freq[s];
    symbol[present] = static_cast<uint8_t>(s);
    end[present++] = at;
  }
  bool needed[256] = {};
  int first[256];  // per bucket: the index of its first slot's symbol, -1 for more than two
  for (int b = 0, owner = 0; b < 256; ++b) {
    while (end[owner] <= 16u * b) ++owner;
    int last = owner;
    while (end[last] <= 16u * b + 15) ++last;
    first[b] = last - owner > 1 ? -1 : owner;
    if (first[b] >= 0) needed[owner] = needed[last] = true;
  }
  int rank_of[256];
  int ranks = 0;
  for (int k = 0; k < present; ++k) {
    if (!needed[k]) continue;
    if (ranks == kRankedSymbols) return false;
    const uint32_t start = end[k] - freq[symbol[k]];
    r->packed[ranks] = start | freq[symbol[k]] << 12 | uint32_t{symbol[k]} << 24;
    r->end[ranks] = end[k];
    rank_of[k] = ranks++;
  }
  r->ranks = ranks;
  for (int q = ranks; q < kRankedSymbols; ++q) r->packed[q] = r->end[q] = 0;  // never chosen
  for (int b = 0; b < 256; ++b) {
    r->bucket[b] = static_cast<uint8_t>(first[b] < 0 ? 0x80 : rank_of[first[b]]);
  }
  return true;
}

// Entry `index` of a table by rank held as four vectors: one permute where at most 32 ranks
// exist (k32), else Lookup64. Only the index's low 6 bits count.
template <bool k32>
__attribute__((target("avx512f"), always_inline)) inline __m512i LookupRank(const __m512i* table,
                                                                            __m512i index) {
  if constexpr (k32) return _mm512_permutex2var_epi32(table[0], index, table[1]);
  return Lookup64(table, index);
}

// DecodeRoundsAvx512 without gathers, for planes whose symbols need at most kRankedSymbols ranks
// (a delta's high planes have 6-45 symbols): each state's slot is mapped to its symbol's rank by
// the bucket of 16 slots it falls in (VBMI's byte permutes, each vector's 16 states on their own:
// gathering a round's 64 bucket indices into one vector saved permutes but chained the four
// vectors through its inserts and extracts, and decoded ~15% slower on an Intel Xeon of 2023) and
// one step to the next rank where the slot is at or past the first one's end; the symbol's start,
// frequency and value then come from the ranked table held in registers. Buckets that hold more
// than two symbols (clusters of rare ones) are left to a gather of just that vector (~12% of the
// vectors of the trajectories' bf16 weight deltas). The same bytes as the scalar loop.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Up to `max_rounds` rounds as above (fewer where the words or `n` run out); `beside(c)` runs
// before vector c of every round: another decoder's work for the core to overlap with this
// one's (RansDecodeWithHuffman), inlined into the loop. Returns the symbols decoded.
template <bool k32, typename Beside>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,bmi2"),
               always_inline)) inline size_t
RankedRounds(const uint32_t* t, const RankedDecTables& r, Stream* s, uint8_t* out, size_t n,
             size_t max_rounds, Beside&& beside) {
  const __m512i mask = _mm512_set1_epi32(kMask);
  const __m512i b0 = _mm512_load_si512(r.bucket), b1 = _mm512_load_si512(r.bucket + 64);
  const __m512i b2 = _mm512_load_si512(r.bucket + 128), b3 = _mm512_load_si512(r.bucket + 192);
  __m512i packed[4], ends[4];
  for (int q = 0; q < 4; ++q) {
    packed[q] = _mm512_load_si512(r.packed + 16 * q);
    ends[q] = _mm512_load_si512(r.end + 16 * q);
  }
  __m512i x[4];
  for (int c = 0; c < 4; ++c) x[c] = _mm512_load_si512(s->x + 16 * c);
  const uint8_t* w = s->w;
  size_t i = 0;
  for (size_t round = 0; round < max_rounds && i + kStates <= n && s->end - w >= 2 * kStates;
       ++round, i += kStates) {
    for (int c = 0; c < 4; ++c) {
      beside(c);
      const __m512i slot = _mm512_and_si512(x[c], mask);
      // The bucket of each of the vector's slots: its 16 bucket indices as bytes, looked up in
      // the 256-byte table (two permutes of 128 bytes and a blend on the index's top bit).
      const __m512i idx = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(_mm512_srli_epi32(slot, 4)));
      const __m512i first =
          _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), _mm512_permutex2var_epi8(b0, idx, b1),
                                 _mm512_permutex2var_epi8(b2, idx, b3));
      // The rank (bit 7 marks a bucket of more than two symbols; LookupRank ignores it).
      __m512i rank = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(first));
      const __mmask16 complex = _mm512_test_epi32_mask(rank, _mm512_set1_epi32(0x80));
      const __mmask16 past = _mm512_cmpge_epu32_mask(slot, LookupRank<k32>(ends, rank));
      rank = _mm512_mask_add_epi32(rank, past, rank, _mm512_set1_epi32(1));
      __m512i p = LookupRank<k32>(packed, rank);
      if (complex != 0) {
        // Those lanes from the full table (symbol, offset in the symbol, frequency), repacked.
        const __m512i e = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), complex, slot, t, 4);
        const __m512i start =
            _mm512_sub_epi32(slot, _mm512_and_si512(_mm512_srli_epi32(e, 8), mask));
        p = _mm512_mask_or_epi32(
            p, complex, _mm512_or_si512(start, _mm512_slli_epi32(_mm512_srli_epi32(e, 20), 12)),
            _mm512_slli_epi32(e, 24));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 16 * c),
                       _mm512_cvtepi32_epi8(_mm512_srli_epi32(p, 24)));
      const __m512i freq = _mm512_and_si512(_mm512_srli_epi32(p, 12), mask);
      const __m512i next =
          _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32(x[c], kRansScaleBits)),
                           _mm512_sub_epi32(slot, _mm512_and_si512(p, mask)));
      x[c] = RenormaliseAvx512(next, &w);
    }
  }
  for (int c = 0; c < 4; ++c) _mm512_store_si512(s->x + 16 * c, x[c]);
  s->w = w;
  return i;
}

template <bool k32>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,bmi2"), flatten))
CKPTFS_NOT_CLONED size_t
DecodeRoundsRankedVbmi(const uint32_t* t, const RankedDecTables& r, Stream* s, uint8_t* out,
                       size_t n) {
  return RankedRounds<k32>(t, r, s, out, n, SIZE_MAX, [](int) {});
}

// RankedRounds beside the rounds of a Huffman decode: before each of a round's 4 vectors (16
// symbols), a round of the Huffman decode's 4 streams (16 lookups in its table `ht`, the
// single-symbol or the multi-symbol one), while both have room; the Huffman streams' state in
// locals, as HuffmanRound asks. Returns the rANS symbols decoded; advances h's positions and
// outputs. `prefetch`: as HuffmanDecode's, a cache line of it asked for per round of Huffman.
template <bool k32, typename HuffmanTable>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,bmi2"), flatten))
CKPTFS_NOT_CLONED size_t
DecodeRoundsRankedVbmiWithHuffman(const uint32_t* t, const RankedDecTables& r, Stream* s,
                                  uint8_t* out, size_t n, const HuffmanTable* ht, HuffmanDecoder* h,
                                  Bytes* prefetch) {
  size_t i = 0;
  for (;;) {
    // HuffmanRoundsLeft counts 44 bits a round, more than most use: asked again after each run.
    const size_t rounds = HuffmanRoundsLeft(*h) / 4;
    if (rounds == 0) break;
    size_t pos[kHuffmanStreams];
    uint8_t* hout[kHuffmanStreams];
    uint64_t left[kHuffmanStreams];
    for (int k = 0; k < kHuffmanStreams; ++k) {
      pos[k] = h->pos[k];
      hout[k] = h->out[k];
    }
    HuffmanLoadWindows(*h, left);
    const uint8_t* data = h->data;
    const size_t done = RankedRounds<k32>(t, r, s, out + i, n - i, rounds, [&](int) {
      HuffmanPrefetchNext(prefetch);  // a cache line per round of Huffman, as HuffmanDecode asks
      for (int k = 0; k < kHuffmanStreams; ++k) {
        HuffmanRound(ht, data, &pos[k], &hout[k], &left[k]);
      }
    });
    for (int k = 0; k < kHuffmanStreams; ++k) {
      h->pos[k] = pos[k];
      h->out[k] = hout[k];
    }
    i += done;
    if (done < rounds * kStates) break;  // the rANS words or symbols ran out
  }
  return i;
}

// The rounds of DecodeRoundsRankedVbmiWithHuffman for the ranked tables' form and h's table.
size_t RankedRoundsWithHuffman(const uint32_t* t, const RankedDecTables& r, Stream* s, uint8_t* out,
                               size_t n, HuffmanDecoder* h, Bytes* prefetch) {
  if (h->multi != nullptr) {
    return r.ranks <= 32
               ? DecodeRoundsRankedVbmiWithHuffman<true>(t, r, s, out, n, h->multi, h, prefetch)
               : DecodeRoundsRankedVbmiWithHuffman<false>(t, r, s, out, n, h->multi, h, prefetch);
  }
  return r.ranks <= 32
             ? DecodeRoundsRankedVbmiWithHuffman<true>(t, r, s, out, n, h->single, h, prefetch)
             : DecodeRoundsRankedVbmiWithHuffman<false>(t, r, s, out, n, h->single, h, prefetch);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

size_t RansEncodedSize(const uint32_t counts[256]) {
  uint32_t freq[256];
  const int present = Normalise(counts, freq);
  if (present == 0) return SIZE_MAX;
  double bits = 0;
  for (int s = 0; s < 256; ++s) {
    if (counts[s] > 0)
      bits += counts[s] * (kRansScaleBits - std::log2(static_cast<double>(freq[s])));
  }
  // The final states hold ~8 of the bits each (they end between kLow and 2^31).
  bits = std::max(0.0, bits - 8.0 * kStates);
  return HeaderBytes(present) + 2 * static_cast<size_t>(std::ceil(bits / 16));
}

size_t RansEncodeTo(Bytes in, std::byte* dst_bytes, size_t capacity, const uint32_t* counts) {
  const size_t n = in.size();
  if (n == 0 || n > UINT32_MAX) return 0;
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  uint32_t own[256];
  if (counts == nullptr) {
    ByteHistogram(in, own);
    counts = own;
  }
  uint32_t freq[256];
  const int present = Normalise(counts, freq);
  const size_t header = HeaderBytes(present);
  const size_t limit = std::min(capacity, n - 1);  // the result must be smaller than the input
  if (limit <= header) return 0;
  EncSymbol sym[256];
  EncSymbols(freq, sym);

  auto* o = reinterpret_cast<uint8_t*>(dst_bytes);
  // Words go out backwards from the end; the decoder reads them forwards.
  uint8_t* const lowest = o + header;
  uint8_t* w = o + limit;
  alignas(64) uint32_t x[kStates];
  std::fill(x, x + kStates, kLow);
  // Returns false where a word would not fit (only checked where the caller has not made sure).
  auto put = [&](int lane, uint8_t s, bool check) {
    const EncSymbol& e = sym[s];
    uint32_t v = x[lane];
    if (v >= e.x_max) {
      if (check && w - lowest < 2) return false;
      w -= 2;
      PutLE<uint16_t>(w, static_cast<uint16_t>(v));
      v >>= 16;
    }
    x[lane] = EncodeOne(v, e);
    return true;
  };
  // The symbols after the last whole group of kStates, one at a time with a bounds check.
  const size_t whole = n / kStates * kStates;
  for (size_t i = n; i-- > whole;) {
    if (!put(static_cast<int>(i % kStates), p[i], true)) return 0;
  }
  // Whole groups while every state may write a word: without branches (whether a state writes
  // is data, ~1 in 10 symbols on the planes rANS takes: a branch on it mispredicts).
  size_t g = whole;
#if defined(__x86_64__)
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    EncTables tables;
    MakeEncTables(sym, &tables);
    if (CodecVectorLevelInUse() < CodecVectorLevel::kAvx512) {
      g = EncodeRoundsAvx2(tables, p, g, x, &w, lowest);
    } else if (CodecCpuHasAvx512Vbmi() && tables.present <= kRankedSymbols) {
      thread_local Buffer ranks;
      ranks.Resize(g);
      auto* r = reinterpret_cast<uint8_t*>(ranks.data());
      RanksVbmi(tables.rank, p, g, r);
      g = EncodeRoundsAvx512<true>(tables, r, g, x, &w, lowest);
    } else {
      g = EncodeRoundsAvx512<false>(tables, p, g, x, &w, lowest);
    }
  }
#endif
  for (; g > 0 && w - lowest >= 2 * kStates; g -= kStates) {
    const uint8_t* q = p + g - kStates;
    for (int lane = kStates - 1; lane >= 0; --lane) {
      const EncSymbol& e = sym[q[lane]];
      uint32_t v = x[lane];
      const bool out = v >= e.x_max;
      PutLE<uint16_t>(w - 2, static_cast<uint16_t>(v));
      w -= out ? 2 : 0;
      v = out ? v >> 16 : v;
      x[lane] = EncodeOne(v, e);
    }
  }
  // The rest, near the end of the room, with a bounds check per word.
  while (g > 0) {
    g -= kStates;
    for (int lane = kStates - 1; lane >= 0; --lane) {
      if (!put(lane, p[g + lane], true)) return 0;
    }
  }
  const size_t words = static_cast<size_t>(o + limit - w);
  std::memmove(lowest, w, words);

  std::memset(o, 0, kBitmapBytes);
  uint8_t* f = o + kBitmapBytes;
  for (int s = 0; s < 256; ++s) {
    if (freq[s] == 0) continue;
    o[s / 8] = static_cast<uint8_t>(o[s / 8] | 1u << (s % 8));
    PutLE<uint16_t>(f, static_cast<uint16_t>(freq[s]));
    f += 2;
  }
  for (int lane = 0; lane < kStates; ++lane) PutLE<uint32_t>(f + 4 * lane, x[lane]);
  return header + words;
}

namespace {

// A decode in progress: RansDecode's parts, which RansDecodeWithHuffman runs around its own loop.
struct RansDecoder {
  const uint32_t* table = nullptr;  // the calling thread's; valid until its next rANS decode
  alignas(64) uint32_t x[kStates];
  Stream s{};
  uint8_t* out = nullptr;
  size_t n = 0;
  size_t i = 0;  // symbols decoded
#if defined(__x86_64__)
  // Whether the ranked vector decoder runs here (AVX-512 VBMI, at most kRankedSymbols ranks),
  // and its tables.
  bool ranked_decoding = false;
  RankedDecTables ranked;
#endif
};

// Reads the header of `stored` and builds the decoding tables; `out` receives the symbols.
Status StartDecode(Bytes stored, MutableBytes out, RansDecoder* d) {
  const auto* in = reinterpret_cast<const uint8_t*>(stored.data());
  const size_t size = stored.size();
  if (size < kBitmapBytes) return Status::Corruption("rans: header is truncated");
  int present = 0;
  for (size_t b = 0; b < kBitmapBytes; ++b) present += __builtin_popcount(in[b]);
  const size_t header = HeaderBytes(present);
  if (size < header) return Status::Corruption("rans: header is truncated");

  // The decoding table: per slot of [0, kScale), the symbol (bits 0-7), the slot's offset from
  // the symbol's start (8-19) and the symbol's frequency (20-31).
  thread_local std::array<uint32_t, kScale> table;
  uint32_t start = 0;
  uint32_t freqs[256] = {};
  const uint8_t* f = in + kBitmapBytes;
  for (int s = 0; s < 256; ++s) {
    if (!(in[s / 8] >> (s % 8) & 1)) continue;
    const uint32_t freq = freqs[s] = GetLE<uint16_t>(f);
    f += 2;
    if (freq == 0 || freq >= kScale || start + freq > kScale) {
      return Status::Corruption("rans: bad frequency table");
    }
    for (uint32_t k = 0; k < freq; ++k) {
      table[start + k] = static_cast<uint32_t>(s) | k << 8 | freq << 20;
    }
    start += freq;
  }
  if (start != kScale) return Status::Corruption("rans: frequencies do not sum to the scale");
  d->table = table.data();
  for (int lane = 0; lane < kStates; ++lane) {
    d->x[lane] = GetLE<uint32_t>(f + 4 * lane);
    if (d->x[lane] < kLow || d->x[lane] >> 31 != 0) {
      return Status::Corruption("rans: a state is out of range");
    }
  }
  d->s = Stream{in + header, in + size, d->x};
  if ((d->s.end - d->s.w) % 2 != 0) return Status::Corruption("rans: odd stream length");
  d->out = reinterpret_cast<uint8_t*>(out.data());
  d->n = out.size();
  d->i = 0;
#if defined(__x86_64__)
  d->ranked_decoding = CodecVectorLevelInUse() >= CodecVectorLevel::kAvx512 &&
                       CodecCpuHasAvx512Vbmi() && MakeRankedDecTables(freqs, &d->ranked);
#endif
  return Status::OK();
}

// Decodes the rest: the vector rounds of the CPU's level, then a symbol at a time; checks that
// the words and the states end where the encoder began.
Status FinishDecode(RansDecoder* d) {
  uint8_t* const out = d->out;
  const size_t n = d->n;
  size_t i = d->i;
#if defined(__x86_64__)
  // The vector rounds of the CPU's level on `s`, from symbol i on; returns the symbols decoded.
  auto rounds = [&](Stream* s) -> size_t {
    if (d->ranked_decoding) {
      return d->ranked.ranks <= 32
                 ? DecodeRoundsRankedVbmi<true>(d->table, d->ranked, s, out + i, n - i)
                 : DecodeRoundsRankedVbmi<false>(d->table, d->ranked, s, out + i, n - i);
    }
    if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx512) {
      return DecodeRoundsAvx512(d->table, s, out + i, n - i);
    }
    if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
      return DecodeRoundsAvx2(d->table, s, out + i, n - i);
    }
    return 0;
  };
  i += rounds(&d->s);
  // They stop where a round's words (up to 2 * kStates bytes) could run past the stream's end,
  // which left ~2,000 symbols of a low-entropy plane to the loop below (~3% of decoding a late
  // step's bf16 weight deltas). The rest of the words, copied where 2 * kStates bytes of room
  // follow them, let the rounds run on to the last whole one; a stream that reads past its end
  // there is corrupt, as the loop below would find.
  const auto left = static_cast<size_t>(d->s.end - d->s.w);  // < 2 * kStates if n - i >= kStates
  if (n - i >= kStates && left < 2 * kStates &&
      CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    alignas(64) uint8_t words[4 * kStates] = {};
    std::memcpy(words, d->s.w, left);
    Stream padded{words, words + sizeof(words), d->x};
    i += rounds(&padded);
    const auto used = static_cast<size_t>(padded.w - words);
    if (used > left) return Status::Corruption("rans: the stream ends early");
    d->s.w += used;
  }
#endif
  const uint32_t* t = d->table;
  uint32_t* x = d->x;
  const uint8_t* w = d->s.w;
  const uint8_t* const end = d->s.end;
  // The rest (and everything without AVX2), a symbol at a time, with a bounds check per word.
  for (; i < n; ++i) {
    const int lane = static_cast<int>(i % kStates);
    const uint32_t v = x[lane];
    const uint32_t e = t[v & kMask];
    out[i] = static_cast<uint8_t>(e);
    uint32_t next = (e >> 20) * (v >> kRansScaleBits) + (e >> 8 & kMask);
    if (next < kLow) {
      if (end - w < 2) return Status::Corruption("rans: the stream ends early");
      next = next << 16 | GetLE<uint16_t>(w);
      w += 2;
    }
    x[lane] = next;
  }
  if (w != end) return Status::Corruption("rans: words left after the last symbol");
  for (int lane = 0; lane < kStates; ++lane) {
    if (x[lane] != kLow) return Status::Corruption("rans: a state does not end where it began");
  }
  return Status::OK();
}

}  // namespace

Status RansDecode(Bytes stored, MutableBytes out) {
  RansDecoder d;
  CKPTFS_RETURN_IF_ERROR(StartDecode(stored, out, &d));
  return FinishDecode(&d);
}

Status RansDecodeWithHuffman(Bytes rans, MutableBytes rans_out,
                             std::span<const HuffmanInput> huffman, Bytes prefetch) {
  RansDecoder d;
  CKPTFS_RETURN_IF_ERROR(StartDecode(rans, rans_out, &d));
  for (const HuffmanInput& in : huffman) {
    HuffmanDecoder h;
    CKPTFS_RETURN_IF_ERROR(HuffmanStartDecode(in.stored, in.out, &h));
#if defined(__x86_64__)
    if (d.ranked_decoding) {
      d.i +=
          RankedRoundsWithHuffman(d.table, d.ranked, &d.s, d.out + d.i, d.n - d.i, &h, &prefetch);
    }
#endif
    CKPTFS_RETURN_IF_ERROR(HuffmanFinishDecode(&h, prefetch));
    prefetch = {};
  }
  return FinishDecode(&d);
}

}  // namespace ckptfs
