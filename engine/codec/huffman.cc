#include "engine/codec/huffman.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/codec/huffman_decoder.h"
#include "engine/codec/vector_level.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr int kStreams = kHuffmanStreams;
constexpr uint32_t kTableSize = 1u << kHuffmanMaxBits;
constexpr uint32_t kTableMask = kTableSize - 1;
constexpr size_t kStreamLengthBytes = 4 * (kStreams - 1);

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian host
  return v;
}
inline void Store64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // little-endian host: p[0] in the low byte
  return v;
}

// Input run k of n bytes cut into kStreams runs.
inline size_t RunSize(size_t n) { return (n + kStreams - 1) / kStreams; }
inline size_t RunBegin(size_t n, int k) { return std::min(n, RunSize(n) * k); }
inline size_t RunEnd(size_t n, int k) { return std::min(n, RunSize(n) * (k + 1)); }

// Limits the lengths w[0..n) (2 <= n <= 256) of a complete code to kHuffmanMaxBits, keeping it
// complete: the codes above the limit are cut to it, the lightest codes below it lengthened until
// the code fits again, then the heaviest shortened while the room left allows. Kraft sums are
// counted in units of 2^-kHuffmanMaxBits. Both loops end: every code at the limit sums to n <=
// 256, below a full code's 2^kHuffmanMaxBits, so lengthening gets the sum there or under; and
// what is left to fill is a multiple of the unit of the longest code, which is longer than 1
// bit (n >= 2) and can be shortened by that much, so each pass shortens one. Replaced rebuilding
// with halved counts until the tree was shallow (two or three builds per segment on the planes
// of deltas, whose zero runs' run lengths have a geometric tail; docs/engine.md).
void LimitLengths(uint64_t w[], int n) {
  constexpr int kMax = kHuffmanMaxBits;
  constexpr int64_t kFull = int64_t{1} << kMax;
  int64_t kraft = 0;
  for (int i = 0; i < n; ++i) {
    w[i] = std::min<uint64_t>(w[i], kMax);
    kraft += int64_t{1} << (kMax - w[i]);
  }
  while (kraft > kFull) {
    for (int i = 0; i < n && kraft > kFull; ++i) {  // lightest first
      if (w[i] >= static_cast<uint64_t>(kMax)) continue;
      kraft -= int64_t{1} << (kMax - w[i] - 1);
      ++w[i];
    }
  }
  while (kraft < kFull) {
    for (int i = n - 1; i >= 0 && kraft < kFull; --i) {  // heaviest first
      const int64_t gain = int64_t{1} << (kMax - w[i]);
      if (w[i] > 1 && kraft + gain <= kFull) {
        kraft += gain;
        --w[i];
      }
    }
  }
}

// Code lengths of a Huffman code for `counts`, at most kHuffmanMaxBits each (LimitLengths). The
// code is always complete: a lone symbol gets a 1-bit code and a 1-bit partner that never occurs.
// No allocation: the symbols sorted by count, then Moffat and Katajainen's in-place computation
// of minimum-redundancy lengths ("In-place calculation of minimum-redundancy codes", 1995).
void BuildLengths(const uint64_t counts[256], uint8_t len[256]) {
  std::memset(len, 0, 256);
  // count << 8 | symbol: sorted as one integer, by count and ties by symbol (deterministic), at
  // half the cost of sorting (count, symbol) pairs. Counts are below 2^32 (inputs are).
  uint64_t order[256];
  int n = 0;
  for (int s = 0; s < 256; ++s) {
    if (counts[s] > 0) order[n++] = counts[s] << 8 | static_cast<uint64_t>(s);
  }
  if (n <= 1) {
    const int s = n == 0 ? 0 : static_cast<int>(order[0] & 0xff);
    len[s] = 1;
    len[s ^ 1] = 1;
    return;
  }
  std::sort(order, order + n);
  uint64_t w[256];
  for (int i = 0; i < n; ++i) w[i] = order[i] >> 8;
  // Pass 1, left to right: combine the two lightest of leaves and internal nodes; internal
  // nodes keep their weight until used, then the index of their parent.
  w[0] += w[1];
  int root = 0, leaf = 2;
  for (int next = 1; next < n - 1; ++next) {
    if (leaf >= n || w[root] < w[leaf]) {
      w[next] = w[root];
      w[root++] = next;
    } else {
      w[next] = w[leaf++];
    }
    if (leaf >= n || (root < next && w[root] < w[leaf])) {
      w[next] += w[root];
      w[root++] = next;
    } else {
      w[next] += w[leaf++];
    }
  }
  // Pass 2, right to left: depths of internal nodes.
  w[n - 2] = 0;
  for (int next = n - 3; next >= 0; --next) w[next] = w[w[next]] + 1;
  // Pass 3, right to left: depths of leaves.
  int avail = 1, used = 0, depth = 0;
  root = n - 2;
  int next = n - 1;
  while (avail > 0) {
    while (root >= 0 && w[root] == static_cast<uint64_t>(depth)) {
      ++used;
      --root;
    }
    while (avail > used) {
      w[next--] = depth;
      --avail;
    }
    avail = 2 * used;
    ++depth;
    used = 0;
  }
  // w[i] is now the length of the i-th lightest symbol; w[0] is the longest.
  if (w[0] > static_cast<uint64_t>(kHuffmanMaxBits)) LimitLengths(w, n);
  for (int i = 0; i < n; ++i) len[order[i] & 0xff] = static_cast<uint8_t>(w[i]);
}

// Canonical codes for `len`, bit-reversed so that the first code bit is the lowest.
void CanonicalCodes(const uint8_t len[256], uint16_t code[256]) {
  uint32_t count[kHuffmanMaxBits + 1] = {};
  for (int s = 0; s < 256; ++s) count[len[s]] += len[s] > 0;
  uint32_t next[kHuffmanMaxBits + 2] = {};
  uint32_t c = 0;
  for (int l = 1; l <= kHuffmanMaxBits; ++l) {
    c = (c + count[l - 1] * (l > 1)) << 1;
    next[l] = c;
  }
  for (int s = 0; s < 256; ++s) {
    const int l = len[s];
    if (l == 0) continue;
    uint32_t v = next[l]++;
    uint32_t r = 0;
    for (int b = 0; b < l; ++b) r |= ((v >> b) & 1) << (l - 1 - b);
    code[s] = static_cast<uint16_t>(r);
  }
}

// The state of one stream being written: codes pending in `acc`, the next byte at `dst`, and
// the end of the room for the stream's bytes (at least its length).
struct StreamWriter {
  uint64_t acc = 0;
  unsigned bits = 0;
  uint8_t* dst;
  uint8_t* end;

  inline void Put(const uint32_t table[256], uint8_t s) {
    const uint32_t e = table[s];
    acc |= static_cast<uint64_t>(e & 0xffff) << bits;
    bits += e >> 16;
  }
  // An 8-byte store: only while 8 bytes of the stream are left (the bytes past the pending
  // ones are written again later).
  inline void Flush() {
    Store64(dst, acc);
    dst += bits >> 3;
    acc >>= bits & 56;
    bits &= 7;
  }
  inline void FlushBytes() {
    for (; bits >= 8; bits -= 8, acc >>= 8) *dst++ = static_cast<uint8_t>(acc);
  }
  inline void Finish() {
    FlushBytes();
    if (bits > 0) *dst++ = static_cast<uint8_t>(acc);
    bits = 0;
  }
};

// Writes the codes of the runs of `in` into the streams, interleaved (independent dependency
// chains run in parallel). Each stream's bytes are exactly its precomputed length. The fast loop
// keeps each stream's state in locals: held in the writers, every byte store through a
// uint8_t* could alias them and the compiler would reload them after each store. With kPairs it
// looks two symbols up at once in `pairs` (indexed by the two bytes as a little-endian uint16:
// both codes, the first in the low bits, | their total length << 24): the same bits, with half
// the lookups, shifts and adds.
template <bool kPairs>
inline void EncodeStreamsBody(const uint8_t* in, size_t n, const uint32_t table[256],
                              const uint32_t* pairs, StreamWriter w[]) {
  static_assert(kStreams == 4);
  const uint8_t* src[kStreams];
  size_t count[kStreams];
  for (int k = 0; k < kStreams; ++k) {
    src[k] = in + RunBegin(n, k);
    count[k] = RunEnd(n, k) - RunBegin(n, k);
  }
  // 4 codes of at most 11 bits fit beside the 7 pending bits of a 64-bit accumulator; the
  // 8-byte stores run while 8 bytes of every stream are left.
  size_t i = 0;
  {
    const uint8_t *s0 = src[0], *s1 = src[1], *s2 = src[2], *s3 = src[3];
    uint8_t *d0 = w[0].dst, *d1 = w[1].dst, *d2 = w[2].dst, *d3 = w[3].dst;
    uint64_t a0 = w[0].acc, a1 = w[1].acc, a2 = w[2].acc, a3 = w[3].acc;
    unsigned b0 = w[0].bits, b1 = w[1].bits, b2 = w[2].bits, b3 = w[3].bits;
    // A round adds at most 4 * 11 bits to at most 7 pending ones: it advances a stream by at
    // most 6 bytes and stores 8. Run as many rounds as every stream has room for, then recount.
    const size_t common = count[kStreams - 1];  // the last run is the shortest
    uint8_t* end[kStreams] = {w[0].end, w[1].end, w[2].end, w[3].end};
    auto put = [table](uint64_t& acc, unsigned& bits, uint8_t sym) {
      const uint32_t e = table[sym];
      acc |= static_cast<uint64_t>(e & 0xffff) << bits;
      bits += e >> 16;
    };
    auto put_pair = [pairs](uint64_t& acc, unsigned& bits, uint16_t two) {
      const uint32_t e = pairs[two];
      acc |= static_cast<uint64_t>(e & 0xffffff) << bits;
      bits += e >> 24;
    };
    auto flush = [](uint64_t& acc, unsigned& bits, uint8_t*& d) {
      Store64(d, acc);
      d += bits >> 3;
      acc >>= bits & 56;
      bits &= 7;
    };
    for (;;) {
      size_t rounds = (common - i) / 4;
      uint8_t* d[kStreams] = {d0, d1, d2, d3};
      for (int k = 0; k < kStreams; ++k) {
        const size_t room = static_cast<size_t>(end[k] - d[k]);
        rounds = std::min(rounds, room >= 8 ? (room - 8) / 6 : 0);
      }
      if (rounds == 0) break;
      for (size_t r = 0; r < rounds; ++r, i += 4) {
        if constexpr (kPairs) {
          for (int j = 0; j < 4; j += 2) {
            put_pair(a0, b0, Load16(s0 + i + j));
            put_pair(a1, b1, Load16(s1 + i + j));
            put_pair(a2, b2, Load16(s2 + i + j));
            put_pair(a3, b3, Load16(s3 + i + j));
          }
        } else {
          for (int j = 0; j < 4; ++j) {
            put(a0, b0, s0[i + j]);
            put(a1, b1, s1[i + j]);
            put(a2, b2, s2[i + j]);
            put(a3, b3, s3[i + j]);
          }
        }
        flush(a0, b0, d0);
        flush(a1, b1, d1);
        flush(a2, b2, d2);
        flush(a3, b3, d3);
      }
    }
    w[0] = {a0, b0, d0, w[0].end};
    w[1] = {a1, b1, d1, w[1].end};
    w[2] = {a2, b2, d2, w[2].end};
    w[3] = {a3, b3, d3, w[3].end};
  }
  for (int k = 0; k < kStreams; ++k) {
    for (size_t j = i; j < count[k]; ++j) {
      w[k].Put(table, src[k][j]);
      if (w[k].dst + 8 <= w[k].end) {
        w[k].Flush();
      } else {
        w[k].FlushBytes();
      }
    }
    w[k].Finish();
  }
}

// The same with BMI2 (vector_level.h): shifts by a count in any register (shlx) instead of cl
// leave the 4 streams' state in registers (~7% faster encoding of bf16 delta planes).
#if defined(__x86_64__)
CKPTFS_TARGET_AVX2 void EncodeStreamsBmi2(const uint8_t* in, size_t n, const uint32_t table[256],
                                          const uint32_t* pairs, StreamWriter w[]) {
  if (pairs != nullptr) return EncodeStreamsBody<true>(in, n, table, pairs, w);
  EncodeStreamsBody<false>(in, n, table, nullptr, w);
}
#endif
// `pairs`: the table of symbol pairs, or null to look symbols up one at a time.
void EncodeStreams(const uint8_t* in, size_t n, const uint32_t table[256], const uint32_t* pairs,
                   StreamWriter w[]) {
#if defined(__x86_64__)
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    return EncodeStreamsBmi2(in, n, table, pairs, w);
  }
#endif
  if (pairs != nullptr) return EncodeStreamsBody<true>(in, n, table, pairs, w);
  EncodeStreamsBody<false>(in, n, table, nullptr, w);
}

// The pair table of EncodeStreamsBody for a code of k symbols, or null where it would not pay:
// it is filled for the k * k pairs of symbols with a code (the others are never looked up), so
// only for k <= 128 and inputs of at least 8 * k * k bytes. (Measured on the delta planes of
// the trajectories: a plane of 1.1 bits per byte encodes at 1.1 -> 1.6 GB/s per core; with 256
// symbols the build and a 256 KiB table cost more than they save.) Per thread, 256 KiB.
const uint32_t* PairTable(const uint8_t len[256], const uint16_t code[256], int last, size_t n) {
  int used[256];
  size_t k = 0;
  for (int s = 0; s <= last; ++s) {
    if (len[s] > 0) used[k++] = s;
  }
  if (k > 128 || n < 8 * k * k) return nullptr;
  thread_local std::vector<uint32_t> pairs(size_t{1} << 16);
  uint32_t* table = pairs.data();
  for (size_t x = 0; x < k; ++x) {
    const int a = used[x];
    for (size_t y = 0; y < k; ++y) {
      const int b = used[y];
      table[a | b << 8] = (uint32_t{code[a]} | uint32_t{code[b]} << len[a]) |
                          static_cast<uint32_t>(len[a] + len[b]) << 24;
    }
  }
  return table;
}

// Whether `len` is a complete code of lengths 1..kHuffmanMaxBits (absent symbols: 0).
Status CheckLengths(const uint8_t len[256]) {
  uint32_t kraft = 0;
  for (int s = 0; s < 256; ++s) {
    if (len[s] > kHuffmanMaxBits) return Status::Corruption("huffman: code length out of range");
    if (len[s] > 0) kraft += kTableSize >> len[s];
  }
  if (kraft != kTableSize) return Status::Corruption("huffman: the code is not complete");
  return Status::OK();
}

// A table of one symbol per lookup: for each value of the next kHuffmanMaxBits bits, the code
// length (bits 0-7) and the symbol its code starts (8-15). DecodeRounds shifts its bit window by
// the whole entry (a 64-bit shift uses only the count's low 6 bits). Built by doubling: the
// first 2^l entries hold the table of the codes up to length l; two copies of it are the
// entries of those codes among 2^(l+1), where each code of length l + 1 takes one entry (a
// store per symbol and 4 KB copied, where a store per entry took ~6 us). REQUIRES: a complete
// code (CheckLengths), so that every entry is written.
void BuildSingleTable(const uint8_t len[256], uint16_t* single) {
  uint16_t code[256];
  CanonicalCodes(len, code);
  uint8_t by_length[256];  // the symbols with a code, by length and then by symbol
  uint32_t next[kHuffmanMaxBits + 2] = {};
  for (int s = 0; s < 256; ++s) next[len[s] + 1] += len[s] > 0;
  for (int l = 1; l <= kHuffmanMaxBits; ++l) next[l + 1] += next[l];
  for (int s = 0; s < 256; ++s) {
    if (len[s] > 0) by_length[next[len[s]]++] = static_cast<uint8_t>(s);
  }
  // next[l] is now the end of length l's symbols in by_length, and the start of l + 1's.
  single[0] = 0;
  uint32_t i = 0;
  for (uint32_t l = 1; l <= kHuffmanMaxBits; ++l) {
    std::memcpy(single + (1u << (l - 1)), single, sizeof(uint16_t) << (l - 1));
    for (; i < next[l]; ++i) {
      const uint8_t s = by_length[i];
      single[code[s]] = static_cast<uint16_t>(l | s << 8);
    }
  }
}

// The table of up to 4 symbols per lookup, from the single-symbol one.
void BuildMultiTable(const uint16_t* single, HuffmanEntry* table) {
  for (uint32_t idx = 0; idx < kTableSize; ++idx) {
    HuffmanEntry e{0, 0, static_cast<uint8_t>(single[idx] & 0xff), 0, 0};
    while (e.count < 4) {
      const uint16_t d = single[(idx >> e.bits) & kTableMask];
      const int l = d & 0xff;
      if (e.bits + l > kHuffmanMaxBits) break;
      e.symbols |= static_cast<uint32_t>(d >> 8) << (8 * e.count);
      e.bits = static_cast<uint8_t>(e.bits + l);
      ++e.count;
    }
    table[idx] = e;
  }
}

// How many symbols a lookup of the multi-symbol table yields on average, where each symbol
// occurs with probability 2^-length (what the code is built for): f_d(b), the symbols that up to
// d lookups' worth of symbols decode from b bits, is the sum over the lengths l <= b of
// P(length l) * (1 + f_{d-1}(b - l)).
double SymbolsPerLookup(const uint8_t len[256]) {
  double p[kHuffmanMaxBits + 1] = {};  // probability of a code of each length
  for (int s = 0; s < 256; ++s) {
    if (len[s] > 0) p[len[s]] += 1.0 / static_cast<double>(1u << len[s]);
  }
  double f[kHuffmanMaxBits + 1] = {};  // f_{d-1}, by budget
  for (int d = 0; d < 4; ++d) {
    double next[kHuffmanMaxBits + 1] = {};
    for (int b = 0; b <= kHuffmanMaxBits; ++b) {
      for (int l = 1; l <= b; ++l) next[b] += p[l] * (1.0 + f[b - l]);
    }
    std::copy(next, next + kHuffmanMaxBits + 1, f);
  }
  return f[kHuffmanMaxBits];
}

// HuffmanDecode's table: kAuto but in tests.
std::atomic<HuffmanDecodeTable> g_decode_table{HuffmanDecodeTable::kAuto};

// Whether `n` symbols of this code decode faster with the multi-symbol table than with the
// single-symbol one. Measured on Zen 4 (docs/engine.md, "Huffman, one symbol per lookup"): a
// lookup takes about as long whatever it yields, ~2.5 cycles in the multi-symbol table and ~1.85
// in the single-symbol one (a 2-byte entry, a byte stored at a fixed place), and the multi-symbol
// table takes ~15,000 cycles more to build (a chain of lookups per entry). So the multi-symbol
// table pays for long inputs of short codes only: the top planes of first versions, not the
// low planes of deltas (~1 symbol per lookup) nor short segments. Cycles: of the time-stamp
// counter, the costs measured by timing both tables on every Huffman segment of engine_bench's
// bf16 and fp32 pieces.
bool UseMultiTable(const uint8_t len[256], size_t n) {
  switch (g_decode_table.load(std::memory_order_relaxed)) {
    case HuffmanDecodeTable::kSingleSymbol:
      return false;
    case HuffmanDecodeTable::kMultiSymbol:
      return true;
    case HuffmanDecodeTable::kAuto:
      break;
  }
  constexpr double kMultiLookupCycles = 2.5;
  constexpr double kSingleLookupCycles = 1.85;
  constexpr double kMultiBuildCycles = 15000;
  const double saved_per_symbol = kSingleLookupCycles - kMultiLookupCycles / SymbolsPerLookup(len);
  return static_cast<double>(n) * saved_per_symbol > kMultiBuildCycles;
}

// Decodes kCount streams interleaved: each round makes 4 lookups per stream (at most 44 bits)
// from one 8-byte load: in the multi-symbol table (HuffmanEntry: up to 16 bytes a round) or in the
// single-symbol one (uint16_t: 4 bytes a round). It runs as many rounds as every stream has room
// for, input and output. Advances pos[] and out[]. The state is kept in locals: in the arrays,
// every byte store could alias it and the compiler would reload it after each one.
template <int kCount, typename Table>
inline void DecodeRounds(const Table* t, const uint8_t* data, size_t data_size, size_t pos_io[],
                         uint8_t* out_io[], uint8_t* const out_end[], Bytes* prefetch) {
  size_t pos[kCount];
  uint8_t* out[kCount];
  for (int k = 0; k < kCount; ++k) {
    pos[k] = pos_io[k];
    out[k] = out_io[k];
  }
  for (;;) {
    size_t rounds = SIZE_MAX;
    for (int k = 0; k < kCount; ++k) {
      rounds = std::min(rounds, HuffmanStreamRounds(data_size, pos[k], out[k], out_end[k],
                                                    kHuffmanOutPerRound<Table>));
    }
    if (rounds == 0) break;
    uint64_t left[kCount];  // what the last round left of each stream's window (HuffmanRound)
    for (int k = 0; k < kCount; ++k) left[k] = HuffmanWindow(data, pos[k]);
    for (size_t r = 0; r < rounds; ++r) {
      HuffmanPrefetchNext(prefetch);  // a cache line per round (of 4 to 64 symbols per stream)
      for (int k = 0; k < kCount; ++k) HuffmanRound(t, data, &pos[k], &out[k], &left[k]);
    }
  }
  for (int k = 0; k < kCount; ++k) {
    pos_io[k] = pos[k];
    out_io[k] = out[k];
  }
}

// The fast part of HuffmanDecode: the 4 streams interleaved while all have room, then each on
// its own (a stream of long runs, 4 symbols per lookup, fills its output well before one of
// noise: the others then decoded a symbol at a time, 12% of bf16 delta decoding).
template <typename Table>
inline void DecodeFastBody(const Table* t, const uint8_t* data, size_t data_size, size_t pos[],
                           uint8_t* out[], uint8_t* const out_end[], Bytes prefetch) {
  DecodeRounds<kStreams>(t, data, data_size, pos, out, out_end, &prefetch);
  for (int k = 0; k < kStreams; ++k) {
    DecodeRounds<1>(t, data, data_size, pos + k, out + k, out_end + k, &prefetch);
  }
}

// The same with BMI2 (vector_level.h): shifts by a count in any register (shrx) and lzcnt.
#if defined(__x86_64__)
template <typename Table>
CKPTFS_TARGET_AVX2 CKPTFS_NOT_CLONED void DecodeFastBmi2(const Table* t, const uint8_t* data,
                                                         size_t data_size, size_t pos[],
                                                         uint8_t* out[], uint8_t* const out_end[],
                                                         Bytes prefetch) {
  DecodeFastBody(t, data, data_size, pos, out, out_end, prefetch);
}
#endif

template <typename Table>
CKPTFS_NOT_CLONED void DecodeFast(const Table* t, const uint8_t* data, size_t data_size,
                                  size_t pos[], uint8_t* out[], uint8_t* const out_end[],
                                  Bytes prefetch) {
#if defined(__x86_64__)
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    return DecodeFastBmi2(t, data, data_size, pos, out, out_end, prefetch);
  }
#endif
  DecodeFastBody(t, data, data_size, pos, out, out_end, prefetch);
}

}  // namespace

namespace {
// c * log2(c) for the counts of sampled histograms (c < kCountLogs), computed once, as
// HistogramEntropyBits computes it for larger counts: the same doubles, so the same sums. The
// log2 calls were ~3% of encoding fp32 first versions (a few hundred per sampled plane).
constexpr uint32_t kCountLogs = 4096;
const double* CountLogs() {
  static const std::vector<double> table = [] {
    std::vector<double> t(kCountLogs, 0.0);
    for (uint32_t c = 1; c < kCountLogs; ++c) t[c] = c * std::log2(static_cast<double>(c));
    return t;
  }();
  return table.data();
}
}  // namespace

double HistogramEntropyBits(const uint32_t counts[256]) {
  const double* count_logs = CountLogs();
  double sum = 0;
  uint64_t m = 0;
  for (int s = 0; s < 256; ++s) {
    const uint32_t c = counts[s];
    if (c > 0) sum += c < kCountLogs ? count_logs[c] : c * std::log2(static_cast<double>(c));
    m += c;
  }
  if (m == 0) return 0;
  return std::log2(static_cast<double>(m)) - sum / static_cast<double>(m);
}

namespace {

// Counts p[0..n) into kCountTables tables, so that runs of one symbol (common in skewed planes)
// do not serialise on one counter: a table's counter is written again eight bytes on at the
// earliest. On the planes Huffman codes (the low planes of deltas, the exponents of first
// versions) eight tables count 3.5-3.6 GB/s per core on Zen 4, four 2.7-3.0 (docs/engine.md).
constexpr int kCountTables = 8;
void CountBytes(const uint8_t* p, size_t n, uint32_t c[kCountTables][256]) {
  size_t i = 0;
  for (; i + kCountTables <= n; i += kCountTables) {
    for (int k = 0; k < kCountTables; ++k) ++c[k][p[i + k]];
  }
  for (; i < n; ++i) ++c[0][p[i]];
}

// The tables of CountBytes summed into counts[256].
void SumTables(const uint32_t c[kCountTables][256], uint32_t counts[256]) {
  for (int s = 0; s < 256; ++s) {
    uint32_t sum = 0;
    for (int k = 0; k < kCountTables; ++k) sum += c[k][s];
    counts[s] = sum;
  }
}

// The histogram of p[0..n) into counts[256], every byte counted (no zero skipping).
void CountPlane(const uint8_t* p, size_t n, uint32_t counts[256]) {
  uint32_t c[kCountTables][256] = {};
  CountBytes(p, n, c);
  SumTables(c, counts);
}

#if defined(__x86_64__)
// The planes counted whole (a delta's high planes, by RansPays) are mostly zeros: 64 bytes a step,
// the zeros are counted by a compare and the others packed together (VBMI2's vpcompressb) into a
// block that is then counted as above. Returns the zeros.
__attribute__((target("avx512f,avx512bw,avx512vbmi2,bmi2"))) size_t CountBytesButZerosVbmi2(
    const uint8_t* p, size_t n, uint32_t c[kCountTables][256]) {
  constexpr size_t kBlock = 4096;
  alignas(64) uint8_t packed[kBlock + 64];
  size_t zeros = 0, i = 0;
  while (i + 64 <= n) {
    size_t fill = 0;
    for (; i + 64 <= n && fill <= kBlock - 64; i += 64) {
      const __m512i v = _mm512_loadu_si512(p + i);
      const __mmask64 nonzero = _mm512_test_epi8_mask(v, v);
      _mm512_storeu_si512(packed + fill, _mm512_maskz_compress_epi8(nonzero, v));
      const size_t k = static_cast<size_t>(__builtin_popcountll(nonzero));
      fill += k;
      zeros += 64 - k;
    }
    CountBytes(packed, fill, c);
  }
  CountBytes(p + i, n - i, c);
  return zeros;
}
#endif

}  // namespace

void ByteHistogram(Bytes in, uint32_t counts[256]) {
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
#if defined(__x86_64__)
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx512 && CodecCpuHasAvx512Vbmi2()) {
    uint32_t c[kCountTables][256] = {};
    const size_t zeros = CountBytesButZerosVbmi2(p, in.size(), c);
    SumTables(c, counts);
    counts[0] += static_cast<uint32_t>(zeros);
    return;
  }
#endif
  CountPlane(p, in.size(), counts);
}

size_t SampleHistogram(Bytes in, uint32_t counts[256], size_t sample) {
  std::fill(counts, counts + 256, 0u);
  if (in.empty() || sample == 0) return 0;
  const size_t stride = std::max<size_t>(1, in.size() / sample);
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  size_t n = 0;
  for (size_t i = 0; i < in.size(); i += stride, ++n) ++counts[p[i]];
  return n;
}

namespace {

// A code for a histogram of n bytes (non-empty): lengths, the last symbol with a code, the
// header's size, and the bits of all the codes.
struct Plan {
  uint8_t len[256];
  int last = 0;
  size_t header = 0;
  uint64_t bits = 0;
};

void MakePlan(const uint32_t counts[256], Plan* plan) {
  uint64_t wide[256];
  for (int s = 0; s < 256; ++s) wide[s] = counts[s];
  BuildLengths(wide, plan->len);
  plan->bits = 0;
  for (int s = 0; s < 256; ++s) {
    if (plan->len[s] > 0) plan->last = s;
    plan->bits += wide[s] * plan->len[s];
  }
  plan->header = 1 + (plan->last + 2) / 2 + kStreamLengthBytes;
}

}  // namespace

size_t HuffmanEncodedSize(Bytes in) {
  if (in.empty() || in.size() > UINT32_MAX) return SIZE_MAX;
  uint32_t counts[256];
  ByteHistogram(in, counts);
  return HuffmanEncodedSizeOfCounts(counts);
}

size_t HuffmanEncodedSizeOfCounts(const uint32_t counts[256]) {
  uint64_t n = 0;
  for (int s = 0; s < 256; ++s) n += counts[s];
  if (n == 0) return SIZE_MAX;
  Plan plan;
  MakePlan(counts, &plan);
  return plan.header + (plan.bits + 7) / 8 + (kStreams - 1);
}

size_t HuffmanEncodeTo(Bytes in, std::byte* dst_bytes, size_t capacity,
                       const uint32_t counts[256]) {
  const size_t n = in.size();
  if (n == 0 || n > UINT32_MAX) return 0;
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  uint32_t own[256];
  if (counts == nullptr) {  // counted whole: the planes coded here are seldom mostly zeros
    CountPlane(p, n, own);
    counts = own;
  }
  Plan plan;
  MakePlan(counts, &plan);
  // The streams' bytes add up to at least this much (and to at most 3 bytes more).
  const size_t least = plan.header + (plan.bits + 7) / 8;
  if (least >= n || least > capacity) return 0;
  uint16_t code[256] = {};
  CanonicalCodes(plan.len, code);
  uint32_t table[256];
  for (int s = 0; s < 256; ++s) table[s] = code[s] | static_cast<uint32_t>(plan.len[s]) << 16;

  // Each stream's length is known once it is written: the streams are written apart, then put
  // together behind the header. Nothing is written to dst before the size is known to fit: a
  // caller may hold another coder's bytes there. None is longer than all the codes' bytes, nor
  // than its run in codes of the longest length, so the room apart is at most 1.4 times the input
  // (per thread, kept for the next plane).
  const size_t most =
      std::min((plan.bits + 7) / 8, (RunSize(n) * kHuffmanMaxBits + 7) / 8) + 8;  // per stream
  thread_local Buffer apart;
  apart.Resize(kStreams * most);
  StreamWriter w[kStreams];
  uint8_t* begin[kStreams];
  for (int k = 0; k < kStreams; ++k) {
    begin[k] = w[k].dst = reinterpret_cast<uint8_t*>(apart.data()) + k * most;
    w[k].end = w[k].dst + most;
  }
  EncodeStreams(p, n, table, PairTable(plan.len, code, plan.last, n), w);
  size_t total = plan.header;
  size_t length[kStreams];
  for (int k = 0; k < kStreams; ++k) total += length[k] = static_cast<size_t>(w[k].dst - begin[k]);
  if (total >= n || total > capacity) return 0;
  auto* o = reinterpret_cast<uint8_t*>(dst_bytes);
  uint8_t* next = o + plan.header;
  for (int k = 0; k < kStreams; ++k) {
    std::memcpy(next, begin[k], length[k]);
    next += length[k];
  }
  o[0] = static_cast<uint8_t>(plan.last);
  for (int s = 0; s <= plan.last; s += 2) {
    o[1 + s / 2] = static_cast<uint8_t>(plan.len[s] | (s + 1 < 256 ? plan.len[s + 1] << 4 : 0));
  }
  for (int k = 0; k < kStreams - 1; ++k) {
    PutLE<uint32_t>(o + 1 + (plan.last + 2) / 2 + 4 * k, static_cast<uint32_t>(length[k]));
  }
  return total;
}

bool HuffmanEncode(Bytes in, Buffer* out) {
  out->Resize(in.size());
  const size_t n = HuffmanEncodeTo(in, out->data(), in.size());
  if (n == 0) return false;
  out->Resize(n);
  return true;
}

HuffmanDecodeTable SetHuffmanDecodeTableForTesting(HuffmanDecodeTable table) {
  return g_decode_table.exchange(table);
}

Status HuffmanStartDecode(Bytes stored, MutableBytes out_bytes, HuffmanDecoder* d) {
  const auto* in = reinterpret_cast<const uint8_t*>(stored.data());
  const size_t size = stored.size();
  if (size < 1) return Status::Corruption("huffman: empty stream");
  const int last = in[0];
  const size_t nibble_bytes = (last + 2) / 2;
  const size_t header = 1 + nibble_bytes + kStreamLengthBytes;
  if (size < header) return Status::Corruption("huffman: header is truncated");
  uint8_t len[256] = {};
  for (int s = 0; s <= last; ++s) len[s] = (in[1 + s / 2] >> (4 * (s & 1))) & 0xf;
  CKPTFS_RETURN_IF_ERROR(CheckLengths(len));
  thread_local std::array<uint16_t, kTableSize> single;
  BuildSingleTable(len, single.data());
  d->single = single.data();

  // Streams: [begin, end) in bits from `data`, and the output run each fills.
  d->data = in + header;
  d->data_size = size - header;
  size_t at = 0;
  for (int k = 0; k < kStreams; ++k) {
    const size_t left = d->data_size - std::min(at, d->data_size);
    const size_t bytes = k < kStreams - 1 ? GetLE<uint32_t>(in + 1 + nibble_bytes + 4 * k) : left;
    if (bytes > left) return Status::Corruption("huffman: stream lengths exceed the record");
    d->begin[k] = d->pos[k] = at * 8;
    at += bytes;
    d->end_bits[k] = at * 8;
  }
  const size_t n = out_bytes.size();
  auto* out_base = reinterpret_cast<uint8_t*>(out_bytes.data());
  for (int k = 0; k < kStreams; ++k) {
    d->out[k] = out_base + RunBegin(n, k);
    d->out_end[k] = out_base + RunEnd(n, k);
  }
  d->multi = nullptr;
  if (UseMultiTable(len, n)) {
    thread_local std::array<HuffmanEntry, kTableSize> multi;
    BuildMultiTable(d->single, multi.data());
    d->multi = multi.data();
  }
  return Status::OK();
}

Status HuffmanFinishDecode(HuffmanDecoder* d, Bytes prefetch) {
  static_assert(sizeof(HuffmanEntry) == 8);
  if (d->multi != nullptr) {
    DecodeFast(d->multi, d->data, d->data_size, d->pos, d->out, d->out_end, prefetch);
  } else {
    DecodeFast(d->single, d->data, d->data_size, d->pos, d->out, d->out_end, prefetch);
  }
  // Tails, one symbol at a time with bounds-checked loads.
  const uint8_t* data = d->data;
  const size_t data_size = d->data_size;
  for (int k = 0; k < kStreams; ++k) {
    size_t pos = d->pos[k];
    while (d->out[k] < d->out_end[k]) {
      if (pos > d->end_bits[k]) break;
      uint64_t b = 0;
      const size_t byte = pos >> 3;
      if (byte + 8 <= data_size) {
        b = Load64(data + byte);
      } else if (byte < data_size) {
        std::memcpy(&b, data + byte, data_size - byte);
      }
      const uint16_t e = d->single[(b >> (pos & 7)) & kTableMask];
      *d->out[k]++ = static_cast<uint8_t>(e >> 8);
      pos += e & 0xff;
    }
    d->pos[k] = pos;
    // A stream must end in its last byte: not before it, not past it.
    const size_t begin = d->begin[k], end = d->end_bits[k];
    if (pos > end || (end > begin && pos + 8 <= end) || (end == begin && pos != begin)) {
      return Status::Corruption("huffman: a stream does not end where its length says");
    }
  }
  return Status::OK();
}

Status HuffmanDecode(Bytes stored, MutableBytes out, Bytes prefetch) {
  HuffmanDecoder d;
  CKPTFS_RETURN_IF_ERROR(HuffmanStartDecode(stored, out, &d));
  return HuffmanFinishDecode(&d, prefetch);
}

}  // namespace ckptfs
