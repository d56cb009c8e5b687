// engine/store/record.h
//
// The on-disk layout of pack files. A pack is a 32-byte file header followed by records; a
// record is a 64-byte header followed by its payload (the chunk's bytes as stored):
//
//   offset size  field
//   0      4     magic "CKRC"
//   4      1     header version (1)
//   5      1     codec (Codec)
//   6      2     flags: bits 0-3 transform, bits 4-6 element width - 1 (piece_codec.h)
//   8      4     raw length (bytes after decoding)
//   12     4     stored length (payload bytes that follow the header)
//   16     32    chunk id (SHA-256 of the raw bytes)
//   48     8     XXH3-64 of the payload
//   56     8     XXH3-64 of header bytes 0..55
//
// The payload is the codec's output for the plain transform, else a planes container; a delta
// (xor/sub) payload starts with the 32-byte id of its base chunk.
// A record is self-describing, so verify and recovery can walk a pack without the catalog.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/codec/codec.h"
#include "engine/codec/piece_codec.h"
#include "engine/hash/chunk_id.h"
#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

inline constexpr size_t kPackHeaderBytes = 32;
inline constexpr size_t kRecordHeaderBytes = 64;
inline constexpr uint32_t kPackFormatVersion = 1;
// Bounded so a corrupted length can never make a reader allocate gigabytes.
inline constexpr uint32_t kMaxRecordRawBytes = 64u << 20;

struct RecordHeader {
  Codec codec = Codec::kNone;
  uint16_t flags = 0;
  uint32_t raw_len = 0;
  uint32_t stored_len = 0;
  ChunkId id;
  uint64_t payload_checksum = 0;

  Transform transform() const { return static_cast<Transform>(flags & 0xf); }
  uint8_t width() const { return static_cast<uint8_t>(((flags >> 4) & 0x7) + 1); }
  void SetEncoding(Transform t, uint8_t width) {
    flags = static_cast<uint16_t>(static_cast<uint16_t>(t) | ((width - 1) & 0x7) << 4);
  }

  // The header of the record that stores `payload`, chunk `id` (raw_len bytes) encoded so.
  static RecordHeader For(const ChunkId& id, uint32_t raw_len, const PieceEncoding& encoding,
                          Bytes payload) {
    RecordHeader h;
    h.codec = encoding.codec;
    h.SetEncoding(encoding.transform, encoding.width);
    h.raw_len = raw_len;
    h.stored_len = static_cast<uint32_t>(payload.size());
    h.id = id;
    h.payload_checksum = Checksum64(payload);
    return h;
  }

  // The header of the delta record of chunk `id` whose payload is `base`'s id followed by
  // `encoded` (the same header For() gives for JoinDeltaPayload(base, encoded)).
  static RecordHeader ForDelta(const ChunkId& id, uint32_t raw_len, const PieceEncoding& encoding,
                               const ChunkId& base, Bytes encoded);

  void EncodeTo(std::byte out[kRecordHeaderBytes]) const;
  // Returns Corruption when the magic, version or header checksum is wrong, a length is out of
  // bounds or the flags name an unknown encoding.
  static Result<RecordHeader> Decode(Bytes in);
};

// A record's payload split: for a delta, the base chunk it names (the payload's first 32
// bytes) and the encoded bytes after it; otherwise no base and the whole payload.
struct RecordBody {
  std::optional<ChunkId> base;
  Bytes encoded;
};
// Corruption when a delta payload is shorter than a chunk id.
Result<RecordBody> SplitRecordPayload(const RecordHeader& header, Bytes payload);
// The payload of a delta record: the base's id, then the encoded bytes.
Buffer JoinDeltaPayload(const ChunkId& base, Bytes encoded);

// Which of the packs being appended to a pack was started for (pack_writer.h): recorded in its
// header so that a store reopened goes on appending to each. Packs written before lanes, and
// those written by other writers (gc's copies go to kMain too), read as kMain.
// Lanes sort records by when they die (the re-encoder replaces them), so that records that die
// together lie together.
enum class PackLane : uint8_t {
  kMain = 0,       // a version's whole tensor pieces (the next version makes them deltas), and
                   // records written by anyone but the writer and the re-encoder
  kLasting = 1,    // records nothing replaces: non-tensor bytes, first versions' pieces, deltas
  kTransient = 2,  // records the re-encoder replaces as soon as it reaches their version: raw
                   // pieces it compresses
};
inline constexpr size_t kPackLanes = 3;

// The 32-byte header that starts every pack file: "CKPTPACK", format version, pack id, lane
// (byte 16; zero in packs written before lanes), checksum of bytes 0..23 at 24.
void EncodePackHeader(uint32_t pack_id, std::byte out[kPackHeaderBytes],
                      PackLane lane = PackLane::kMain);
Status CheckPackHeader(Bytes in, uint32_t pack_id);
// The lane of a header CheckPackHeader accepted; an unknown value reads as kMain.
PackLane PackLaneOf(Bytes header);

// "000042.pack"
std::string PackFileName(uint32_t pack_id);
// Parses a pack file name; returns false for anything else.
bool ParsePackFileName(const std::string& name, uint32_t* pack_id);

}  // namespace ckptfs
