// engine/codec/huffman_decoder.h
//
// HuffmanDecode (huffman.h) in its parts, for a decoder that interleaves Huffman decoding with
// other work in one loop (RansDecodeWithHuffman, rans.h: the vector rANS decoder and this one's
// integer lookups overlap on one core). Not for other callers: HuffmanDecode is the interface.
//
//   HuffmanDecoder d;
//   CKPTFS_RETURN_IF_ERROR(HuffmanStartDecode(stored, out, &d));  // header, table
//   // The caller may decode rounds of its own, its state in locals:
//   uint64_t left[kHuffmanStreams];
//   HuffmanLoadWindows(d, left);
//   for (size_t r = 0, n = HuffmanRoundsLeft(d); r < n; ++r)
//     for (int k = 0; k < kHuffmanStreams; ++k)
//       HuffmanRound(d.single, d.data, &pos[k], &out[k], &left[k]);  // or d.multi if set
//   ... positions and outputs back into d.pos and d.out
//   CKPTFS_RETURN_IF_ERROR(HuffmanFinishDecode(&d, prefetch));  // the rest, the end checks
//
// The bytes and the statuses are HuffmanDecode's whatever rounds the caller decodes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/codec/huffman.h"
#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

inline constexpr int kHuffmanStreams = 4;
inline constexpr uint32_t kHuffmanTableMask = (1u << kHuffmanMaxBits) - 1;

// An entry of the multi-symbol table: the symbols that the next kHuffmanMaxBits bits start with
// (up to 4, as many as fit whole), their total bit count, and the first symbol's code length.
// `bits` is the lowest byte of the entry read as a little-endian uint64: the decoder shifts its
// bit window by the whole entry (a 64-bit shift uses only the count's low 6 bits, and bits <=
// 11), so that the next lookup waits for the load, the mask and one shift only.
struct HuffmanEntry {
  uint8_t bits;
  uint8_t count;
  uint8_t first_bits;
  uint8_t unused;
  uint32_t symbols;
};

// A decode in progress: the 4 streams' positions in bits from `data` and their output runs.
struct HuffmanDecoder {
  // The single-symbol table (per value of the next kHuffmanMaxBits bits: the code length in
  // bits 0-7, the symbol in 8-15): the calling thread's, valid until its next Huffman decode.
  const uint16_t* single = nullptr;
  // The multi-symbol table where it decodes this input (the cost model's choice, or the
  // tests'), else null: the calling thread's, as `single`.
  const HuffmanEntry* multi = nullptr;
  const uint8_t* data = nullptr;
  size_t data_size = 0;
  size_t begin[kHuffmanStreams] = {};
  size_t end_bits[kHuffmanStreams] = {};
  size_t pos[kHuffmanStreams] = {};
  uint8_t* out[kHuffmanStreams] = {};
  uint8_t* out_end[kHuffmanStreams] = {};
};

// Reads the header of `stored` and builds the single-symbol table; `out` receives the decoded
// bytes (exactly the encoded input's length). Corruption as HuffmanDecode.
Status HuffmanStartDecode(Bytes stored, MutableBytes out, HuffmanDecoder* d);

// Decodes what the caller's rounds left and checks that every stream ends where its length says.
Status HuffmanFinishDecode(HuffmanDecoder* d, Bytes prefetch);

// The bytes a round stores per stream with table `Table`: a byte per lookup with the
// single-symbol table (uint16_t), 4 per lookup with the multi-symbol one (up to 4 symbols each).
template <typename Table>
inline constexpr size_t kHuffmanOutPerRound = std::is_same_v<Table, HuffmanEntry> ? 16 : 4;

// How many rounds (4 lookups, at most 44 bits) a stream at bit `pos` of `data` (`data_size`
// bytes) writing at `out` has room for: input (8-byte loads within `data`) and output (up to
// `out_end`, `out_per_round` bytes stored a round).
inline size_t HuffmanStreamRounds(size_t data_size, size_t pos, const uint8_t* out,
                                  const uint8_t* out_end, size_t out_per_round) {
  // (pos / 8 > data_size - 8 let pos be up to 7 bits past (data_size - 8) * 8, and room_in
  // below then wrapped around: 8-byte loads past the record. ASan found it.)
  if (data_size < 8 || pos > (data_size - 8) * 8) return 0;
  const size_t room_in = ((data_size - 8) * 8 - pos) / 44 + 1;
  const size_t room_out = static_cast<size_t>(out_end - out) / out_per_round;
  return room_in < room_out ? room_in : room_out;
}

// How many rounds every stream of `d` has room for.
inline size_t HuffmanRoundsLeft(const HuffmanDecoder& d) {
  const size_t out_per_round =
      d.multi ? kHuffmanOutPerRound<HuffmanEntry> : kHuffmanOutPerRound<uint16_t>;
  size_t rounds = SIZE_MAX;
  for (int k = 0; k < kHuffmanStreams; ++k) {
    const size_t room =
        HuffmanStreamRounds(d.data_size, d.pos[k], d.out[k], d.out_end[k], out_per_round);
    rounds = room < rounds ? room : rounds;
  }
  return rounds;
}

// Asks for the next cache line of `prefetch` (bytes the caller reads after the decode: a delta's
// base) from memory, which is idle while the decoder looks codes up: once per round.
inline void HuffmanPrefetchNext(Bytes* prefetch) {
  if (prefetch->empty()) return;
  __builtin_prefetch(prefetch->data());
  *prefetch = prefetch->subspan(prefetch->size() < 64 ? prefetch->size() : 64);
}

// A stream's window: 8 bytes from bit `at`, shifted to it, with bit 63 as a marker: a round reads
// at most bits 0-54 of it (44 bits of codes and an 11-bit index), and after the round's shifts
// its leading zeros count the bits used.
inline uint64_t HuffmanWindow(const uint8_t* data, size_t at) {
  uint64_t v;
  std::memcpy(&v, data + (at >> 3), 8);  // little-endian host
  return v >> (at & 7) | uint64_t{1} << 63;
}

// Each stream's window at its position, for the first round's first lookup (what a round leaves
// of its window, at least 13 valid bits, starts the next one: its first lookup then need not
// wait for the round's own window, whose load waits for the last round's bit count).
inline void HuffmanLoadWindows(const HuffmanDecoder& d, uint64_t left[kHuffmanStreams]) {
  for (int k = 0; k < kHuffmanStreams; ++k) left[k] = HuffmanWindow(d.data, d.pos[k]);
}

// 4 symbols of a stream from the single-symbol table `t`: `left` holds the codes (what the last
// round left of its window), `b` the stream's window at its position; stores the symbols at
// out[0..3] and returns b shifted past them (its leading zeros: the bits used).
__attribute__((always_inline)) inline uint64_t HuffmanSingleLookups(const uint16_t* t,
                                                                    uint64_t left, uint64_t b,
                                                                    uint8_t* out) {
  uint32_t e = t[left & kHuffmanTableMask];
  for (int j = 0;; ++j) {
    out[j] = static_cast<uint8_t>(e >> 8);
    b >>= e & 63;  // a 64-bit shift uses the count's low 6 bits: the code length
    if (j == 3) break;
    e = t[b & kHuffmanTableMask];
  }
  return b;
}

// The same from the multi-symbol table `t`: stores the symbols from *out on (16 bytes, of which
// the symbols decoded count) and advances *out past them.
__attribute__((always_inline)) inline uint64_t HuffmanMultiLookups(const HuffmanEntry* t,
                                                                   uint64_t left, uint64_t b,
                                                                   uint8_t** out) {
  uint64_t e;
  std::memcpy(&e, &t[left & kHuffmanTableMask], 8);  // little-endian host: bits in byte 0
  for (int j = 0;; ++j) {
    const auto symbols = static_cast<uint32_t>(e >> 32);
    std::memcpy(*out, &symbols, 4);
    *out += (e >> 8) & 0xff;
    b >>= e & 63;  // the next lookup waits for this mask, load and shift only
    if (j == 3) break;
    std::memcpy(&e, &t[b & kHuffmanTableMask], 8);
  }
  return b;
}

// One round of a stream at *pos (bits from `data`) writing at *out, both advanced; *left as
// above; `t` the single-symbol or the multi-symbol table. REQUIRES: a round left
// (HuffmanRoundsLeft). The caller keeps the streams' state in
// locals: through a HuffmanDecoder every byte stored could alias it, and the compiler would
// reload it after each one.
template <typename Table>
__attribute__((always_inline)) inline void HuffmanRound(const Table* t, const uint8_t* data,
                                                        size_t* pos, uint8_t** out,
                                                        uint64_t* left) {
  uint64_t b = HuffmanWindow(data, *pos);
  if constexpr (std::is_same_v<Table, HuffmanEntry>) {
    b = HuffmanMultiLookups(t, *left, b, out);
  } else {
    b = HuffmanSingleLookups(t, *left, b, *out);
    *out += 4;
  }
  *pos += static_cast<size_t>(__builtin_clzll(b));
  *left = b;
}

}  // namespace ckptfs
