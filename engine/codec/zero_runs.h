// engine/codec/zero_runs.h
//
// Zero runs (segment codec 5): a coder for byte planes that are mostly zeros, the high planes of
// a training step's deltas (2-5% of their bytes nonzero). The plane is stored as the lengths of
// the runs of zeros before each nonzero byte and the nonzero bytes themselves, each of the two
// streams Huffman-coded (huffman.h) or raw. On such planes it stores about what order-0 rANS
// does (the run lengths carry the zeros' clustering, which an order-0 coder does not see) and
// decodes at memset speed plus a few cycles per nonzero byte, where rANS spends a table lookup
// on every byte (docs/engine.md, "Zero runs").
//
//   size_t n = ZeroRunsEncodeTo(plane, dst, capacity);   // 0: dense, empty, or does not fit
//   Status st = ZeroRunsDecode({dst, n}, out);             // out: exactly the plane's size
//
// Format: LE32 R (run symbols), then two streams, each a mode byte (0 raw, 1 Huffman), an LE32
// stored length and its bytes: the R run symbols, then the values. A run symbol r < 255 stands
// for r zeros followed by the next value; 255 for 255 zeros and no value (runs of 255 and more).
// The values (one per run symbol below 255) are the nonzero bytes in order; whatever the runs
// and values leave of the plane at its end is zeros.
#pragma once

#include <cstddef>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

// What an encoding found in its plane: how the nonzero bytes lie, for a caller choosing between
// coders (a block codec beats the zero runs only where nonzero bytes come in long stretches).
struct ZeroRunsShape {
  size_t values = 0;    // nonzero bytes
  size_t adjacent = 0;  // of them, those right after another nonzero byte (or at the start)
};

// Encodes `in` into dst (at most `capacity` bytes). Returns the stored size, or 0 when `in` is
// empty (or over 4 GiB), when the encoding would not fit in `capacity`, or when `in` has more
// than a quarter of its bytes nonzero (then the run lengths cost more than an order-0 coder: the
// scan stops there). `shape`, if given, is filled where the stored size is not 0.
size_t ZeroRunsEncodeTo(Bytes in, std::byte* dst, size_t capacity, ZeroRunsShape* shape = nullptr);

// Decodes `stored` into `out`, which must be exactly the plane's size. Corruption when the
// header, a stream or the run lengths do not describe exactly out.size() bytes.
Status ZeroRunsDecode(Bytes stored, MutableBytes out);

}  // namespace ckptfs
