// libFuzzer target for the record decoder (engine/codec/piece_codec.h, huffman.h, rans.h): the
// payload of a record read from a pack is untrusted once a bit may have flipped, so DecodePiece,
// HuffmanDecode and RansDecode must return Corruption on anything malformed, never crash or touch a
// byte outside `stored`, `base` and `out`. And the encoder must round-trip: whatever EncodePiece
// (and EncodePieceAs, EncodeScaledSub, EncodeRotatedPlanes) makes of input-derived bytes,
// DecodePiece gives back bitwise.
//
// Input: 6 header bytes, then the payload.
//   [0] transform (% 5: plain, planes, xor, sub, an unknown one); bit 7: the base has the
//       wrong length
//   [1] codec (% 6: none, lz4, zstd, huffman, rans, an unknown one); also picks the CodecSpec
//       of the round trip
//   [2] width (% 10: 0 and 9 are invalid)
//   [3..5] the raw length (LE24, at most 1 MiB)
// Decode: the payload as the stored record, into exactly the raw length (base: a pattern of
// that length). Round trip: the payload as the raw bytes, the width clamped to 1..8, the base
// the payload with some bytes changed, and for widths 2 and 4 also every element moved by a
// small step (a delta the encoder may split by the base's magnitude: 16K elements and more).
//
// Vector level: the input's length % 3 caps the codec's loops at baseline, AVX2 or AVX-512 (no
// wider than the CPU has), so that the loops a CPU without AVX-512 runs are fuzzed too; a saved
// input reproduces with its level.
//
// Seeds: `CKPTFS_PIECE_SEEDS=DIR piece_codec_fuzz` writes records made by the current encoder
// (with their headers) into DIR and exits (scripts/fuzz.sh does so at first use).
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/codec/codec.h"
#include "engine/codec/huffman.h"
#include "engine/codec/piece_codec.h"
#include "engine/codec/rans.h"
#include "engine/codec/vector_level.h"

namespace {

using ckptfs::Buffer;
using ckptfs::Bytes;
using ckptfs::Codec;
using ckptfs::CodecSpec;
using ckptfs::MutableBytes;
using ckptfs::PieceEncoding;
using ckptfs::Status;
using ckptfs::Transform;

constexpr size_t kHeader = 6;
constexpr size_t kMaxRaw = size_t{1} << 20;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "piece_codec_fuzz: %s\n", what);
  std::abort();
}

// A base of `n` bytes that does not depend on the payload (the decoder must cope with any).
Buffer PatternBase(size_t n, uint8_t salt) {
  Buffer b(n);
  for (size_t i = 0; i < n; ++i) b.mutable_bytes()[i] = std::byte(uint8_t(i * 31 + salt));
  return b;
}

// What a previous version could look like: the bytes with every 7th one changed a little.
Buffer NearBase(Bytes raw, uint8_t salt) {
  Buffer b(raw);
  for (size_t i = 0; i < raw.size(); i += 7) {
    b.mutable_bytes()[i] = std::byte(uint8_t(uint8_t(raw[i]) + salt + 1));
  }
  return b;
}

// What an optimizer step makes of a previous version (width 2 or 4, elements as the top bytes of
// floats): every element moved by about as much, whatever its size, so that the delta follows
// the base's magnitude and the encoder may split its planes (segment 0x43).
Buffer SteppedBase(Bytes raw, uint8_t width) {
  Buffer b(raw);
  for (size_t i = 0; i + width <= raw.size(); i += width) {
    uint32_t bits = 0;
    std::memcpy(reinterpret_cast<std::byte*>(&bits) + 4 - width, raw.data() + i, width);
    float f;
    std::memcpy(&f, &bits, 4);
    f += (uint32_t(i) * 2654435761u >> 31) != 0 ? 2e-5f : -2e-5f;
    std::memcpy(&bits, &f, 4);
    std::memcpy(b.mutable_bytes().data() + i, reinterpret_cast<std::byte*>(&bits) + 4 - width,
                width);
  }
  return b;
}

void CheckDecodes(const PieceEncoding& enc, Bytes stored, Bytes base, Bytes raw, const char* what) {
  Buffer out(raw.size());
  Status st = ckptfs::DecodePiece(enc, stored, base, out.mutable_bytes());
  if (!st.ok()) {
    std::fprintf(stderr, "piece_codec_fuzz: %s: %s\n", what, st.ToString().c_str());
    std::abort();
  }
  Check(raw.empty() || std::memcmp(out.bytes().data(), raw.data(), raw.size()) == 0, what);
}

void Decode(const uint8_t* h, Bytes stored) {
  const auto transform = static_cast<Transform>(h[0] % 5);
  const bool bad_base = (h[0] & 0x80) != 0;
  const auto codec = static_cast<Codec>(h[1] % 6);
  const auto width = static_cast<uint8_t>(h[2] % 10);
  const size_t raw_len = (h[3] | size_t{h[4]} << 8 | size_t{h[5]} << 16) % (kMaxRaw + 1);
  // A base only for the deltas (filling 1 MiB for every input would halve the rate).
  Buffer base = ckptfs::IsDelta(transform)
                    ? PatternBase(bad_base && raw_len > 0 ? raw_len - 1 : raw_len, h[1])
                    : Buffer();
  Buffer out(raw_len);
  Status st =
      ckptfs::DecodePiece({transform, width, codec}, stored, base.bytes(), out.mutable_bytes());
  Check(st.ok() || st.IsCorruption(), "DecodePiece: a status other than Corruption");
  st = ckptfs::HuffmanDecode(stored, out.mutable_bytes());
  Check(st.ok() || st.IsCorruption(), "HuffmanDecode: a status other than Corruption");
  st = ckptfs::RansDecode(stored, out.mutable_bytes());
  Check(st.ok() || st.IsCorruption(), "RansDecode: a status other than Corruption");
  st = ckptfs::Decompress(codec, stored, out.mutable_bytes());
  Check(st.ok() || st.IsCorruption(), "Decompress: a status other than Corruption");
}

CodecSpec SpecOf(uint8_t b) {
  static const char* const kSpecs[] = {"auto", "lz4", "zstd:1", "none", "auto+zstd:3"};
  return *CodecSpec::Parse(kSpecs[b % 5]);
}

void RoundTrip(const uint8_t* h, Bytes raw) {
  const CodecSpec spec = SpecOf(h[1]);
  const auto width = static_cast<uint8_t>(h[2] % 8 + 1);
  const Buffer base = NearBase(raw, h[3]);
  for (const Buffer* b : {static_cast<const Buffer*>(nullptr), &base}) {
    ckptfs::EncodedPiece p = ckptfs::EncodePiece(spec, raw, width, b);
    CheckDecodes(p.encoding, p.stored_raw() ? raw : p.stored.bytes(), b ? b->bytes() : Bytes{}, raw,
                 b ? "EncodePiece with a base" : "EncodePiece");
  }
  CheckDecodes({Transform::kPlanes, width, spec.codec},
               ckptfs::EncodePieceAs(spec, raw, Transform::kPlanes, width, nullptr).bytes(), {},
               raw, "EncodePieceAs planes");
  for (Transform t : {Transform::kXor, Transform::kSub}) {
    CheckDecodes({t, width, spec.codec}, ckptfs::EncodePieceAs(spec, raw, t, width, &base).bytes(),
                 base.bytes(), raw, "EncodePieceAs xor/sub");
  }
  if (width == 2 || width == 4) {
    CheckDecodes({Transform::kPlanes, width, spec.codec},
                 ckptfs::EncodeRotatedPlanes(spec, raw, width).bytes(), {}, raw,
                 "EncodeRotatedPlanes");
  }
  if (width == 2 || width == 4) {
    const Buffer stepped = SteppedBase(raw, width);
    ckptfs::EncodedPiece p = ckptfs::EncodePiece(spec, raw, width, &stepped);
    CheckDecodes(p.encoding, p.stored_raw() ? raw : p.stored.bytes(), stepped.bytes(), raw,
                 "EncodePiece with a stepped base");
  }
  if (width == 4) {
    float scale;
    const uint32_t bits = 0x3f000000u | (uint32_t{h[4]} << 8 | h[5]);  // in [0.5, 1)
    std::memcpy(&scale, &bits, 4);
    CheckDecodes({Transform::kSub, 4, spec.codec},
                 ckptfs::EncodeScaledSub(spec, raw, base, scale).bytes(), base.bytes(), raw,
                 "EncodeScaledSub");
  }
}

// Writes a few records as the current encoder makes them, each with the header that decodes it.
void WriteSeeds(const char* dir) {
  std::vector<float> f(512);
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::sin(0.37f * i) * 0.01f;
  const Bytes fp32(reinterpret_cast<const std::byte*>(f.data()), f.size() * 4);
  std::vector<uint16_t> h(1024);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(0x3c00 + (i * 7919) % 257);
  const Bytes half(reinterpret_cast<const std::byte*>(h.data()), h.size() * 2);
  const std::string text = "step=1000 lr=3e-4 " + std::string(300, 'x') + " betas=(0.9,0.999)";
  const Bytes bytes = ckptfs::AsBytes(text);
  int n = 0;
  auto write = [&](const PieceEncoding& e, Bytes stored, size_t raw_len) {
    const uint8_t hdr[kHeader] = {
        uint8_t(e.transform), uint8_t(e.codec),      e.width,
        uint8_t(raw_len),     uint8_t(raw_len >> 8), uint8_t(raw_len >> 16)};
    const std::string path = std::string(dir) + "/record" + std::to_string(n++);
    FILE* out = std::fopen(path.c_str(), "wb");
    Check(out != nullptr, "cannot write a seed");
    std::fwrite(hdr, 1, kHeader, out);
    std::fwrite(stored.data(), 1, stored.size(), out);
    Check(std::fclose(out) == 0, "cannot write a seed");
  };
  for (const char* s : {"auto", "lz4", "zstd:3"}) {
    const CodecSpec spec = *CodecSpec::Parse(s);
    for (auto [raw, width] :
         {std::pair{fp32, uint8_t{4}}, std::pair{half, uint8_t{2}}, std::pair{bytes, uint8_t{1}}}) {
      ckptfs::EncodedPiece p = ckptfs::EncodePiece(spec, raw, width, nullptr);
      write(p.encoding, p.stored_raw() ? raw : p.stored.bytes(), raw.size());
    }
    write({Transform::kPlanes, 2, spec.codec}, ckptfs::EncodeRotatedPlanes(spec, half, 2).bytes(),
          half.size());
  }
  // Deltas: the record against its previous version (the decoder's pattern base is another
  // one, so these exercise the decode, not a round trip).
  const CodecSpec spec = *CodecSpec::Parse("auto");
  const Buffer base = NearBase(fp32, 3);
  for (Transform t : {Transform::kXor, Transform::kSub}) {
    write({t, 4, spec.codec}, ckptfs::EncodePieceAs(spec, fp32, t, 4, &base).bytes(), fp32.size());
  }
  write({Transform::kSub, 4, spec.codec}, ckptfs::EncodeScaledSub(spec, fp32, base, 0.999f).bytes(),
        fp32.size());
  // A delta large enough that its high plane is coded with rANS (the header's 64 states pay
  // from a few kilobytes on).
  std::vector<float> g(16384);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * i) * 0.01f;
  std::vector<float> g2 = g;
  for (size_t i = 0; i < g2.size(); ++i) g2[i] *= 1.0f + 0.01f * std::sin(1.3f * i);
  const Bytes wide(reinterpret_cast<const std::byte*>(g2.data()), g2.size() * 4);
  const Buffer wide_base(Bytes(reinterpret_cast<const std::byte*>(g.data()), g.size() * 4));
  ckptfs::EncodedPiece p = ckptfs::EncodePiece(spec, wide, 4, &wide_base);
  write(p.encoding, p.stored_raw() ? wide : p.stored.bytes(), wide.size());
  // A delta whose high planes are split by the base's magnitude (segment 0x43): an optimizer
  // step moves every weight by about as much, whatever its size.
  std::vector<float> stepped = g;
  for (size_t i = 0; i < stepped.size(); ++i) {
    stepped[i] += (uint32_t(i) * 2654435761u >> 31) != 0 ? 2e-5f : -2e-5f;
  }
  const Bytes moved(reinterpret_cast<const std::byte*>(stepped.data()), stepped.size() * 4);
  p = ckptfs::EncodePiece(spec, moved, 4, &wide_base);
  write(p.encoding, p.stored_raw() ? moved : p.stored.bytes(), moved.size());
  // The same tensor as a round trip's input (header: width 4), against its stepped base the
  // encoder splits (checked here, so that the seed keeps its purpose): the fuzzer's round trips
  // reach the split from the start (-max_len in fuzz.sh leaves room for 16K fp32 elements).
  const Buffer stepped_base = SteppedBase(wide, 4);
  p = ckptfs::EncodePiece(spec, wide, 4, &stepped_base);
  Check(!p.stored_raw() && p.encoding.transform == Transform::kSub && p.stored.size() > 0 &&
            uint8_t(p.stored.bytes()[0]) == 0x43,
        "the round trip's seed is not split");
  write({Transform::kSub, 3, Codec::kNone}, wide, wide.size());  // spec auto, width 3 % 8 + 1
  std::fprintf(stderr, "piece_codec_fuzz: wrote %d seeds to %s\n", n, dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("CKPTFS_PIECE_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kHeader) return 0;
  ckptfs::CapCodecVectorLevelForTesting(static_cast<ckptfs::CodecVectorLevel>(size % 3));
  const Bytes payload(reinterpret_cast<const std::byte*>(data + kHeader), size - kHeader);
  Decode(data, payload);
  RoundTrip(data, payload);
  return 0;
}
