// engine/codec/codec.h
//
// Block codecs for chunk records: none, lz4 (default, fast) and zstd at a level.
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

// Stored in records and in the catalog: never renumber.
enum class Codec : uint8_t { kNone = 0, kLz4 = 1, kZstd = 2 };

std::string_view CodecName(Codec codec);

struct CodecSpec {
  Codec codec = Codec::kLz4;
  int level = 0;  // zstd level (1..19); 0 means the codec's default

  // Parses "none", "lz4", "zstd" or "zstd:L".
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
