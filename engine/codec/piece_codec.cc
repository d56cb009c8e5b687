#include "engine/codec/piece_codec.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr size_t kSegmentHeaderBytes = 5;  // codec, LE32 stored length
// Encodings are compared on this many leading bytes of a piece (whole elements).
constexpr size_t kSampleBytes = 64 << 10;

uint64_t LoadElement(const std::byte* p, uint8_t width) {
  uint64_t v = 0;
  std::memcpy(&v, p, width);  // little-endian host (x86-64, aarch64)
  return v;
}

// The element's bytes after the transform. sub stores the difference as a zigzag integer
// (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...), so that a small change of either sign leaves the high
// planes zero rather than 0x00 or 0xff by the sign.
template <Transform kT, uint8_t kW>
inline uint64_t Forward(uint64_t value, uint64_t base) {
  if constexpr (kT == Transform::kXor) return value ^ base;
  if constexpr (kT == Transform::kSub) {
    constexpr int kShift = 64 - 8 * kW;
    const int64_t d = static_cast<int64_t>((value - base) << kShift) >> kShift;  // sign-extended
    return (static_cast<uint64_t>(d) << 1) ^ static_cast<uint64_t>(d >> 63);
  }
  return value;
}
template <Transform kT, uint8_t kW>
inline uint64_t Inverse(uint64_t coded, uint64_t base) {
  if constexpr (kT == Transform::kXor) return coded ^ base;
  if constexpr (kT == Transform::kSub) return base + ((coded >> 1) ^ (~(coded & 1) + 1));
  return coded;
}

// Writes `elements` elements of raw (transformed against base) as `width` planes of
// `elements` bytes each into out.
template <Transform kT, uint8_t kW>
void SplitPlanesFixed(const std::byte* raw, const std::byte* base, size_t elements,
                      std::byte* out) {
  for (size_t i = 0; i < elements; ++i) {
    uint64_t v = LoadElement(raw + i * kW, kW);
    uint64_t b = kT == Transform::kPlanes ? 0 : LoadElement(base + i * kW, kW);
    uint64_t c = Forward<kT, kW>(v, b);
    for (uint8_t j = 0; j < kW; ++j) out[j * elements + i] = static_cast<std::byte>(c >> (8 * j));
  }
}

template <Transform kT, uint8_t kW>
void JoinPlanesFixed(const std::byte* planes, const std::byte* base, size_t elements,
                     std::byte* raw) {
  const uint64_t mask = kW == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * kW)) - 1;
  for (size_t i = 0; i < elements; ++i) {
    uint64_t c = 0;
    for (uint8_t j = 0; j < kW; ++j) {
      c |= static_cast<uint64_t>(planes[j * elements + i]) << (8 * j);
    }
    uint64_t b = kT == Transform::kPlanes ? 0 : LoadElement(base + i * kW, kW);
    uint64_t v = Inverse<kT, kW>(c, b) & mask;
    std::memcpy(raw + i * kW, &v, kW);
  }
}

template <Transform kT>
void SplitPlanes(uint8_t width, const std::byte* raw, const std::byte* base, size_t elements,
                 std::byte* out) {
  switch (width) {
    case 2:
      return SplitPlanesFixed<kT, 2>(raw, base, elements, out);
    case 4:
      return SplitPlanesFixed<kT, 4>(raw, base, elements, out);
    case 8:
      return SplitPlanesFixed<kT, 8>(raw, base, elements, out);
    case 1:
      return SplitPlanesFixed<kT, 1>(raw, base, elements, out);
    case 3:
      return SplitPlanesFixed<kT, 3>(raw, base, elements, out);
    case 5:
      return SplitPlanesFixed<kT, 5>(raw, base, elements, out);
    case 6:
      return SplitPlanesFixed<kT, 6>(raw, base, elements, out);
    default:
      return SplitPlanesFixed<kT, 7>(raw, base, elements, out);
  }
}

template <Transform kT>
void JoinPlanes(uint8_t width, const std::byte* planes, const std::byte* base, size_t elements,
                std::byte* raw) {
  switch (width) {
    case 2:
      return JoinPlanesFixed<kT, 2>(planes, base, elements, raw);
    case 4:
      return JoinPlanesFixed<kT, 4>(planes, base, elements, raw);
    case 8:
      return JoinPlanesFixed<kT, 8>(planes, base, elements, raw);
    case 1:
      return JoinPlanesFixed<kT, 1>(planes, base, elements, raw);
    case 3:
      return JoinPlanesFixed<kT, 3>(planes, base, elements, raw);
    case 5:
      return JoinPlanesFixed<kT, 5>(planes, base, elements, raw);
    case 6:
      return JoinPlanesFixed<kT, 6>(planes, base, elements, raw);
    default:
      return JoinPlanesFixed<kT, 7>(planes, base, elements, raw);
  }
}

void Split(Transform t, uint8_t width, Bytes raw, const std::byte* base, std::byte* out) {
  const size_t elements = raw.size() / width;
  switch (t) {
    case Transform::kXor:
      SplitPlanes<Transform::kXor>(width, raw.data(), base, elements, out);
      break;
    case Transform::kSub:
      SplitPlanes<Transform::kSub>(width, raw.data(), base, elements, out);
      break;
    default:
      SplitPlanes<Transform::kPlanes>(width, raw.data(), base, elements, out);
  }
  // The tail (a piece that is not a whole number of elements) is kept bytewise.
  const size_t head = elements * width;
  for (size_t k = head; k < raw.size(); ++k) {
    out[k] = base != nullptr && IsDelta(t) ? raw[k] ^ base[k] : raw[k];
  }
}

void Join(Transform t, uint8_t width, const std::byte* planes, const std::byte* base,
          MutableBytes out) {
  const size_t elements = out.size() / width;
  switch (t) {
    case Transform::kXor:
      JoinPlanes<Transform::kXor>(width, planes, base, elements, out.data());
      break;
    case Transform::kSub:
      JoinPlanes<Transform::kSub>(width, planes, base, elements, out.data());
      break;
    default:
      JoinPlanes<Transform::kPlanes>(width, planes, base, elements, out.data());
  }
  const size_t head = elements * width;
  for (size_t k = head; k < out.size(); ++k) {
    out[k] = IsDelta(t) ? planes[k] ^ base[k] : planes[k];
  }
}

// Compresses each plane (and the tail) of `planes` on its own into a container.
void PackSegments(const CodecSpec& spec, uint8_t width, Bytes planes, Buffer* out) {
  const size_t elements = planes.size() / width;
  out->Reserve(planes.size() + (width + 1) * kSegmentHeaderBytes);
  out->Clear();
  Buffer compressed;
  for (size_t s = 0; s <= width; ++s) {
    Bytes segment =
        s < width ? planes.subspan(s * elements, elements) : planes.subspan(width * elements);
    std::byte header[kSegmentHeaderBytes];
    Bytes body = segment;
    Codec codec = Codec::kNone;
    if (!segment.empty() && TryCompress(spec, segment, &compressed)) {
      codec = spec.codec;
      body = compressed.bytes();
    }
    header[0] = static_cast<std::byte>(codec);
    PutLE<uint32_t>(header + 1, static_cast<uint32_t>(body.size()));
    out->Append({header, kSegmentHeaderBytes});
    out->Append(body);
  }
}

Status UnpackSegments(uint8_t width, Bytes stored, MutableBytes planes) {
  const size_t elements = planes.size() / width;
  size_t pos = 0;
  for (size_t s = 0; s <= width; ++s) {
    MutableBytes segment =
        s < width ? planes.subspan(s * elements, elements) : planes.subspan(width * elements);
    if (stored.size() - pos < kSegmentHeaderBytes) {
      return Status::Corruption("piece: plane header is truncated");
    }
    const uint8_t codec = static_cast<uint8_t>(stored[pos]);
    const uint32_t len = GetLE<uint32_t>(stored.data() + pos + 1);
    pos += kSegmentHeaderBytes;
    if (codec > static_cast<uint8_t>(Codec::kZstd) || len > stored.size() - pos) {
      return Status::Corruption("piece: bad plane header");
    }
    Bytes body = stored.subspan(pos, len);
    pos += len;
    if (static_cast<Codec>(codec) == Codec::kNone) {
      if (body.size() != segment.size()) return Status::Corruption("piece: plane size mismatch");
      if (!body.empty()) std::memcpy(segment.data(), body.data(), body.size());
    } else {
      CKPTFS_RETURN_IF_ERROR(Decompress(static_cast<Codec>(codec), body, segment));
    }
  }
  if (pos != stored.size()) return Status::Corruption("piece: trailing bytes after the planes");
  return Status::OK();
}

// The stored size of `raw` encoded with `t` (planes container), written into out.
size_t EncodeWith(const CodecSpec& spec, Transform t, uint8_t width, Bytes raw,
                  const std::byte* base, Buffer* scratch, Buffer* out) {
  scratch->Resize(raw.size());
  Split(t, width, raw, base, scratch->data());
  PackSegments(spec, width, scratch->bytes(), out);
  return out->size();
}

size_t PlainSize(const CodecSpec& spec, Bytes raw, Buffer* out) {
  return TryCompress(spec, raw, out) ? out->size() : raw.size();
}

}  // namespace

std::string_view TransformName(Transform t) {
  switch (t) {
    case Transform::kPlain:
      return "plain";
    case Transform::kPlanes:
      return "planes";
    case Transform::kXor:
      return "xor";
    case Transform::kSub:
      return "sub";
  }
  return "unknown";
}

EncodedPiece EncodePiece(const CodecSpec& spec, Bytes raw, uint8_t width, const Buffer* base) {
  width = std::clamp<uint8_t>(width, 1, kMaxPieceWidth);
  const bool can_delta = base != nullptr && base->size() == raw.size() && !raw.empty();
  std::vector<Transform> candidates;
  if (width > 1) candidates.push_back(Transform::kPlanes);
  if (can_delta) {
    candidates.push_back(Transform::kXor);
    if (width > 1) candidates.push_back(Transform::kSub);
  }
  auto plain = [&]() {
    EncodedPiece p;
    p.encoding = {Transform::kPlain, width, Codec::kNone};
    if (TryCompress(spec, raw, &p.stored)) {
      p.encoding.codec = spec.codec;
    } else {
      p.stored = Buffer();  // the raw bytes are the payload
    }
    return p;
  };
  if (candidates.empty() || spec.codec == Codec::kNone) return plain();

  // Compare on a sample of whole elements: the leading bytes of the piece.
  const size_t sample = std::min(raw.size(), kSampleBytes / width * width);
  Bytes head = raw.first(sample);
  const std::byte* base_data = can_delta ? base->data() : nullptr;
  Buffer scratch, trial;
  size_t best_size = PlainSize(spec, head, &trial);
  Transform best = Transform::kPlain;
  for (Transform t : candidates) {
    size_t size = EncodeWith(spec, t, width, head, base_data, &scratch, &trial);
    if (size < best_size) {
      best_size = size;
      best = t;
    }
  }
  if (best == Transform::kPlain) return plain();
  EncodedPiece p;
  p.encoding = {best, width, spec.codec};
  EncodeWith(spec, best, width, raw, base_data, &scratch, &p.stored);
  if (p.stored.size() >= raw.size()) return plain();  // the sample misled: never grow
  return p;
}

Buffer EncodePieceAs(const CodecSpec& spec, Bytes raw, Transform t, uint8_t width,
                     const Buffer* base) {
  Buffer scratch, out;
  EncodeWith(spec, t, width, raw, base ? base->data() : nullptr, &scratch, &out);
  return out;
}

Status DecodePiece(const PieceEncoding& encoding, Bytes stored, Bytes base, MutableBytes out) {
  if (encoding.transform == Transform::kPlain) return Decompress(encoding.codec, stored, out);
  if (encoding.width < 1 || encoding.width > kMaxPieceWidth ||
      encoding.transform > Transform::kSub) {
    return Status::Corruption("piece: unknown encoding");
  }
  if (IsDelta(encoding.transform) && base.size() != out.size()) {
    return Status::Corruption("piece: the delta base has another length");
  }
  Buffer planes(out.size());
  CKPTFS_RETURN_IF_ERROR(UnpackSegments(encoding.width, stored, planes.mutable_bytes()));
  Join(encoding.transform, encoding.width, planes.data(), base.data(), out);
  return Status::OK();
}

}  // namespace ckptfs
