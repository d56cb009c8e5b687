// engine/hash/chunk_id.h
//
// A chunk's identity: the SHA-256 of its raw bytes (OpenSSL, which uses the CPU's SHA
// extensions; see docs/engine.md for the measurement behind the choice). The same bytes always
// get the same ChunkId, so they are stored once. Record checksums (Checksum64) are XXH3-64: fast
// enough to verify on every read, not meant to resist an adversary.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "engine/util/buffer.h"

namespace ckptfs {

inline constexpr size_t kChunkIdBytes = 32;

struct ChunkId {
  std::array<uint8_t, 32> bytes{};

  static ChunkId Of(Bytes data);  // SHA-256 of data
  // Parses 64 hex digits; returns false on anything else.
  static bool FromHex(std::string_view hex, ChunkId* out);
  std::string Hex() const;
  std::string ShortHex() const { return Hex().substr(0, 12); }

  friend bool operator==(const ChunkId&, const ChunkId&) = default;
  friend auto operator<=>(const ChunkId&, const ChunkId&) = default;
};

// XXH3-64 of data (the checksum every stored record carries), and of a followed by b (a record
// whose payload is written as two parts), without joining them. With xxHash's AVX2 kernel where
// the CPU has AVX2 and the codec's vector level allows it (engine/codec/vector_level.h; the
// same hash either way).
uint64_t Checksum64(Bytes data);
uint64_t Checksum64(Bytes a, Bytes b);

}  // namespace ckptfs

template <>
struct std::hash<ckptfs::ChunkId> {
  size_t operator()(const ckptfs::ChunkId& id) const noexcept {
    size_t h;
    std::memcpy(&h, id.bytes.data(), sizeof(h));  // already uniformly distributed
    return h;
  }
};
