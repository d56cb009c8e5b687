// engine/codec/codec.h
//
// Block codecs for chunk records: none, lz4 (fast) and zstd at a level; and Huffman (huffman.h)
// and rANS (rans.h) for the byte planes of tensors (piece_codec.h).
//
//   CodecSpec spec = *CodecSpec::Parse("zstd:3");
//   Buffer out;
//   Codec used = Compress(spec, raw, &out);   // kNone when compression did not shrink it
//   Status st = Decompress(used, out.bytes(), raw.size(), &back);
//
// Compress never fails: a record that does not shrink is stored raw (Codec::kNone). Decompress
// returns Corruption when the input does not decode to exactly raw_size bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

// Stored in records and in the catalog: never renumber. kHuffman, kRans and kZeroRuns
// (zero_runs.h) are only written for the plane segments of a planes container (piece_codec.h),
// never as a record's codec.
enum class Codec : uint8_t {
  kNone = 0,
  kLz4 = 1,
  kZstd = 2,
  kHuffman = 3,
  kRans = 4,
  kZeroRuns = 5
};

std::string_view CodecName(Codec codec);

// How new records are compressed. The default ("auto") is chosen by measurement (docs/engine.md,
// "Compression"): lz4 for bytes that are not tensors, and for tensors byte planes whose
// low-entropy planes are Huffman-coded and whose high-entropy planes are stored raw.
struct CodecSpec {
  Codec codec = Codec::kLz4;  // plain pieces; also planes that the entropy stage does not take
  int level = 0;              // zstd level (1..19); 0 means the codec's default
  // Planes: Huffman-code the planes whose sampled entropy is low, store raw those near 8 bits
  // per byte, and use `codec` where it beats Huffman (runs of zeros). false: every plane goes
  // through `codec` (the behaviour of "lz4" and "zstd:L").
  bool entropy = true;

  // Parses "auto" (the default), "none", "lz4", "zstd", "zstd:L", or "auto+lz4" /
  // "auto+zstd:L" (the entropy stage with another codec for plain pieces).
  static Result<CodecSpec> Parse(std::string_view text);
  std::string ToString() const;
};

// Compresses `raw` into `out` (resized to the stored length) and returns the codec used.
Codec Compress(const CodecSpec& spec, Bytes raw, Buffer* out);
// The same without the copy: returns false, leaving `out` unspecified, when compression does
// not shrink `raw` (the caller then stores raw itself, as Codec::kNone).
bool TryCompress(const CodecSpec& spec, Bytes raw, Buffer* out);

// Decodes `stored` (written by `codec`) into out, which must hold exactly raw_size bytes.
Status Decompress(Codec codec, Bytes stored, MutableBytes out);

}  // namespace ckptfs
