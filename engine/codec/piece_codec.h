// engine/codec/piece_codec.h
//
// Encodings of one chunk ("piece") of tensor bytes, chosen per piece by size:
//
//   plain   the bytes, compressed by the block codec (codec.h)
//   planes  bytes regrouped by their position within the element (fp32: 4 planes, bf16/fp16:
//           2), each plane compressed on its own: exponent bytes compress, mantissa noise is
//           stored as it is
//   xor     bit patterns XOR-ed with the same piece of the previous version, then planes
//   sub     bit patterns minus the previous version's, as width-byte integers (mod 2^8w) in
//           zigzag form (the sign in the lowest bit), then planes: a small change of a float
//           leaves the high planes zero whatever its sign, and a carry does not smear over the
//           low bytes as it does with xor. For fp32 the base may first be scaled by a per-piece
//           factor (a prediction: Adam's moments decay by beta per step); the container then
//           starts with a segment of kind 0x40 that holds the factor (f32), and the residual
//           is taken against each base element times the factor (one IEEE single multiply;
//           the base itself where the base or the product is zero, subnormal, Inf or NaN)
//
// Planes of fp32, bf16 and fp16 (width 4 or 2) without a base may first rotate each element left
// by one bit (ZipNN's trick: the top plane then holds the whole 8-bit exponent of fp32/bf16 and
// the sign joins the noisy low plane), where a sample of the piece says that the planes' entropy
// drops; the container then starts with an empty segment of kind 0x41. With the entropy stage,
// the top plane (the exponent) of such a piece is then predicted by a row/column model where the
// bytes show rows (a tensor's row length, found in the piece itself: the codec is not told the
// shape) and the model pays on a trial: Adam's moments scale by row and by column, so their
// exponents are a column term plus a row term plus noise. The container then holds a segment of
// kind 0x42 (after 0x41, if any) with the row length, the phase and the terms, and the top
// plane holds the residual. Older containers never have it.
//
// Sub of width 2 or 4 may store planes split by the base's magnitude (the encoder splits fp32's
// top two and bf16/fp16's two; the decoder reads any plane below the width): each element falls
// in one of K buckets by the 8 bits below its base's sign (the exponent of fp32 and bf16), and
// a split plane is stored as K segments, one per bucket (an optimizer step moves every weight by
// about as much, so the difference's bytes follow the weight's size). The container then holds a
// segment of kind 0x43 (after 0x40, if any) with K (2..8), the planes split (a non-empty mask)
// and K - 1 strictly increasing thresholds. Older containers never have it.
//
// With the entropy stage (the default) EncodePiece uses sub for tensors with a base and planes
// without one (tried per piece: only whether the scaled prediction beats plain sub, on a
// sample); otherwise it tries each applicable encoding on a sample of the piece (the first
// elements). Either way it falls back to plain when the result does not shrink the piece.
// DecodePiece is the exact inverse; on malformed input it returns Corruption, never wrong
// bytes of the right length without an error (callers still check the chunk's SHA-256).
//
// Planes container (transforms other than plain): for each of `width` planes and then the
// tail (raw_len % width bytes, XOR-ed with the base's tail for deltas): codec (1 byte),
// stored length (LE32), stored bytes.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/codec/codec.h"
#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

// Stored in records and in the catalog: never renumber.
enum class Transform : uint8_t { kPlain = 0, kPlanes = 1, kXor = 2, kSub = 3 };
inline constexpr uint8_t kMaxPieceWidth = 8;

std::string_view TransformName(Transform t);
inline bool IsDelta(Transform t) { return t == Transform::kXor || t == Transform::kSub; }

struct PieceEncoding {
  Transform transform = Transform::kPlain;
  uint8_t width = 1;           // element size in bytes (1..8); 1 for non-tensor bytes
  Codec codec = Codec::kNone;  // plain: how the payload is compressed; else informational
};

struct EncodedPiece {
  PieceEncoding encoding;
  Buffer stored;  // empty for plain with Codec::kNone: the raw bytes are the payload
  bool stored_raw() const {
    return encoding.transform == Transform::kPlain && encoding.codec == Codec::kNone;
  }
};

// Encodes `raw`. `width` is the element size of the tensor the bytes belong to (1 if unknown);
// `base`, when not null and of the same size, is the previous version's piece to delta against.
EncodedPiece EncodePiece(const CodecSpec& spec, Bytes raw, uint8_t width, const Buffer* base);

// Encodes `raw` with the given transform (planes container; not plain). For tests and tools.
// REQUIRES: base of raw's size for deltas.
Buffer EncodePieceAs(const CodecSpec& spec, Bytes raw, Transform t, uint8_t width,
                     const Buffer* base);

// Encodes `raw` (fp32) as sub against `base` scaled by `scale` (a normal float): the
// container's first segment records the factor. For tests and tools.
Buffer EncodeScaledSub(const CodecSpec& spec, Bytes raw, const Buffer& base, float scale);

// Encodes `raw` (width 2 or 4) as planes of its elements rotated left by one bit: the container's
// first segment records the rotation. For tests and tools.
Buffer EncodeRotatedPlanes(const CodecSpec& spec, Bytes raw, uint8_t width);

// Decodes `stored` into `out` (exactly the raw length). Deltas need `base` of that length.
// REQUIRES: `out` overlaps neither `stored` nor `base` (planes stored raw are read from `stored`
// while `out` is written).
Status DecodePiece(const PieceEncoding& encoding, Bytes stored, Bytes base, MutableBytes out);

}  // namespace ckptfs
