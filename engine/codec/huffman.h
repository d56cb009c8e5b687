// engine/codec/huffman.h
//
// A canonical Huffman coder for byte strings with a skewed distribution: the exponent plane of
// float tensors, the high planes of deltas. Made for speed on one core: the input is split into
// 4 streams that are decoded interleaved, with a table that yields up to 4 symbols per lookup.
//
//   Buffer out;
//   if (HuffmanEncode(plane, &out)) { ... out holds the encoded plane ... }
//   Status st = HuffmanDecode(out.bytes(), back);  // back: exactly plane.size() bytes
//
// Format (all integers little-endian): last symbol L (u8); the code length of symbols 0..L,
// 4 bits each (low nibble first; 0 = absent, at most kHuffmanMaxBits); the byte length of
// streams 0..2 (LE32 each; stream 3 is the rest); the 4 streams. The input is cut into 4 runs
// of ceil(n/4) bytes (the last one shorter); each stream holds its run's codes, the first
// code bit in the lowest bit of the first byte, padded with zero bits to a byte.
//
// HuffmanDecode returns Corruption for a malformed table (a code that is not complete), stream
// lengths that do not add up, or a stream that does not end exactly at its last byte. A stream
// with flipped bits inside can still decode to wrong bytes of the right length: the callers'
// checksums (record XXH3, chunk SHA-256) catch those, as they do for lz4 and zstd.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

inline constexpr int kHuffmanMaxBits = 11;

// The histogram of at most `sample` evenly spread bytes of `in`, into `counts`; returns the
// bytes sampled. Cheap: its HistogramEntropyBits estimates a plane's bits per byte (8 for random
// bytes, 0 for a constant), for deciding whether and how a plane is worth coding.
size_t SampleHistogram(Bytes in, uint32_t counts[256], size_t sample = 4096);

// Shannon entropy in bits per symbol of a byte histogram (0 for an empty one).
double HistogramEntropyBits(const uint32_t counts[256]);

// Counts the bytes of `in` into counts[256] (which it zeroes first).
void ByteHistogram(Bytes in, uint32_t counts[256]);

// Encodes `in` (non-empty) into `out`; returns false, leaving `out` unspecified, when the
// result would not be smaller than `in`.
bool HuffmanEncode(Bytes in, Buffer* out);

// The same, written straight to dst (for example into a container being assembled): returns
// the encoded size, or 0 (dst untouched) when it would not be smaller than `in` or not fit in
// `capacity` bytes. `counts`: the histogram of `in` (ByteHistogram), where the caller has it
// already; taken here otherwise.
size_t HuffmanEncodeTo(Bytes in, std::byte* dst, size_t capacity,
                       const uint32_t counts[256] = nullptr);

// The size HuffmanEncode(in) would have, at most 3 bytes over (each stream's last byte), without
// encoding: the histogram and the code only. SIZE_MAX for an empty input. For choosing between
// encodings cheaply.
size_t HuffmanEncodedSize(Bytes in);

// The same for an input of that histogram (of the whole input): for comparing with other coders
// from one histogram. SIZE_MAX for an empty histogram.
size_t HuffmanEncodedSizeOfCounts(const uint32_t counts[256]);

// Decodes `stored` into `out`, which must hold exactly the encoded input's length. `prefetch`:
// bytes the caller reads next (a delta's base), asked for from memory a cache line at a time
// while decoding, which leaves the memory idle otherwise; no effect on the result.
Status HuffmanDecode(Bytes stored, MutableBytes out, Bytes prefetch = {});

// Which lookup table HuffmanDecode uses: one symbol per lookup, or up to 4 (a table that costs
// more to build and yields more where codes are short). kAuto, the default, chooses per input by
// its length and code lengths; the others force one, for tests. The bytes decoded are the same.
enum class HuffmanDecodeTable : uint8_t { kAuto, kSingleSymbol, kMultiSymbol };
// Sets the choice for every thread; returns the previous one. For tests.
HuffmanDecodeTable SetHuffmanDecodeTableForTesting(HuffmanDecodeTable table);

}  // namespace ckptfs
