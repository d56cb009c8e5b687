#include "engine/hash/chunk_id.h"

#include <openssl/sha.h>
// The XXH3 state type, for a streamed checksum on the stack.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "engine/codec/vector_level.h"
#include "engine/hash/xxh3_two_parts.h"

namespace ckptfs {
namespace hash_internal {
// engine/hash/xxh3_avx2.cc (compiled for AVX2): XXH3-64 of a followed by b.
unsigned long long Xxh3Avx2(const void* a, size_t a_len, const void* b, size_t b_len);
}  // namespace hash_internal

ChunkId ChunkId::Of(Bytes data) {
  ChunkId id;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), id.bytes.data());
  return id;
}

std::string ChunkId::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

bool ChunkId::FromHex(std::string_view hex, ChunkId* out) {
  if (hex.size() != 64) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

uint64_t Checksum64(Bytes data) { return Checksum64(data, {}); }

uint64_t Checksum64(Bytes a, Bytes b) {
#if defined(__x86_64__)
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    return hash_internal::Xxh3Avx2(a.data(), a.size(), b.data(), b.size());
  }
#endif
  return hash_internal::Xxh3TwoParts(a.data(), a.size(), b.data(), b.size());
}

}  // namespace ckptfs
