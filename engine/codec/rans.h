// engine/codec/rans.h
//
// An order-0 rANS coder (range asymmetric numeral systems, Duda; the interleaved form of
// Giesen's rans_word) for byte strings of low entropy: the high planes of deltas and the
// exponent planes of float tensors. Where Huffman spends at least one bit on every byte, and up
// to ~0.5 bit more than the entropy on a plane of 1-2 bits (the top plane of a training step's
// delta is mostly zeros), rANS codes each symbol with its probability quantised to 1/4096: within
// ~0.1% of the entropy. It decodes one symbol per table lookup, where Huffman's table gives up to
// four on such planes, so PutSegment (piece_codec.cc) takes it only where it is smaller by enough
// to pay for that (docs/engine.md, "rANS").
//
//   Buffer out(plane.size());
//   size_t n = RansEncodeTo(plane, out.data(), out.size());   // 0: did not shrink or fit
//   Status st = RansDecode(Bytes(out.data(), n), back);         // back: exactly plane.size()
//
// Format (integers little-endian): a bitmap of the symbols present (32 bytes, symbol s in bit
// s % 8 of byte s / 8); the frequency of each present symbol in increasing symbol order (LE16
// each, 1..4095, summing to 4096); the 64 final states (LE32 each); the 16-bit renormalisation
// words (LE16) in the order the decoder reads them. Symbol i is coded by state i % 64. A plane
// of one symbol gets a second one, absent from the input, of frequency 1 (every frequency is
// below 4096).
//
// RansDecode returns Corruption for a malformed table, a state out of range, a stream that ends
// early or has words left over, or states that do not end where the encoder started them. A
// stream with flipped bits inside can still decode to wrong bytes of the right length: the
// callers' checksums (record XXH3, chunk SHA-256) catch those, as for Huffman, lz4 and zstd.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

inline constexpr int kRansScaleBits = 12;
inline constexpr int kRansStates = 64;
// No encoding is smaller: the bitmap, two frequencies and the states.
inline constexpr size_t kRansMinEncodedBytes = 32 + 2 * 2 + 4 * kRansStates;

// The size RansEncodeTo would give an input of that histogram, within a few bytes (the
// renormalisation words are estimated from the entropy under the quantised frequencies);
// SIZE_MAX for an empty one. No coding: for choosing between encodings.
size_t RansEncodedSize(const uint32_t counts[256]);

// Encodes `in` (non-empty) straight into dst: returns the encoded size, or 0 (dst unspecified)
// when the result would not be smaller than `in` or would not fit in `capacity` bytes.
// `counts`: the histogram of `in` (ByteHistogram, huffman.h), when the caller has it; null:
// computed here.
size_t RansEncodeTo(Bytes in, std::byte* dst, size_t capacity, const uint32_t* counts = nullptr);

// Decodes `stored` into `out`, which must hold exactly the encoded input's length.
Status RansDecode(Bytes stored, MutableBytes out);

// A Huffman-coded input (HuffmanEncode's output) and where it decodes to: exactly its length.
struct HuffmanInput {
  Bytes stored;
  MutableBytes out;
};

// RansDecode(rans, rans_out), and HuffmanDecode(in.stored, in.out) for each of `huffman` in
// order (the first given `prefetch`): the same bytes; Corruption where either would give it.
// Where the CPU has AVX-512 VBMI and the rANS table its ranked form, they are decoded in one
// loop, the rANS decode going on from one Huffman input to the next: rANS in the vector units
// and Huffman in the integer ones overlap on one core (a bf16 delta's high plane and its low
// plane's buckets: ~20% faster than one after the other on Zen 4).
Status RansDecodeWithHuffman(Bytes rans, MutableBytes rans_out,
                             std::span<const HuffmanInput> huffman, Bytes prefetch = {});

}  // namespace ckptfs
