#include "engine/codec/piece_codec.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "engine/codec/huffman.h"
#include "engine/codec/rans.h"
#include "engine/codec/vector_level.h"
#include "engine/codec/zero_runs.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr size_t kSegmentHeaderBytes = 5;  // codec, LE32 stored length
// A segment kind that is not a codec: the scaled prediction's factor (f32, 4 bytes), written
// only as the first segment of a sub container of width 4. Older containers never start with
// it (their segment kinds are codecs, 0..3), so they read as before.
constexpr uint8_t kScaleSegment = 0x40;
constexpr size_t kScaleSegmentBytes = kSegmentHeaderBytes + 4;
// A segment kind that is not a codec either: empty, written only as the first segment of a
// planes container of width 2 or 4, it says that each element was rotated left by one bit
// before the split (ZipNN's trick: the sign moves to the lowest bit, so the top plane holds
// the 8-bit exponent of fp32 and bf16 whole). Older containers never start with it.
constexpr uint8_t kRotatedSegment = 0x41;

// A segment kind that is not a codec either: the row/column model of the top plane of a planes
// container of width 2 or 4 (after the rotation segment, if any; docs/engine.md, "Compression").
// Its body: the period P (LE32, the tensor's row length as found in the bytes), the phase F
// (LE32, < P: element i sits in column (i + F) % P of row (i + F) / P), then P column terms and
// one row term per row, a byte each. The top plane holds each byte minus its column's and its
// row's term (mod 256): Adam's moments scale by row and by column (a linear layer's gradient
// is an outer product), so the top plane's exponents are predicted by both. Older containers
// never have it.
constexpr uint8_t kModelSegment = 0x42;
constexpr size_t kModelHeaderBytes = 8;  // period, phase

// A segment kind that is not a codec either: the high planes of a sub container of width 2 or 4
// (after the scale segment, if any) split by the magnitude of the base (docs/engine.md,
// "Compression"). A step's change of a weight is about as large wherever the weight lies, so the
// difference of the bit patterns is large where the weight is small (a small exponent: a fine
// unit in the last place) and small where it is large; coded apart, each bucket's bytes have
// less entropy than the plane's. Body: K (a byte, 2..kMaxSplitBuckets), the planes split (bit s:
// plane s), then K - 1 strictly increasing thresholds (bytes, >= 1). An element's bucket is the
// number of thresholds at or below its base's magnitude byte (the 8 bits below the sign: the
// exponent of fp32 and bf16). A split plane is stored as K segments, bucket 0's bytes first, each
// bucket's in element order. Older containers never have it.
constexpr uint8_t kSplitSegment = 0x43;
constexpr size_t kSplitHeaderBytes = 2;  // K, planes
constexpr size_t kMaxSplitBuckets = 8;

// The split of a sub container's planes (buckets 0: none), with each element's bucket (per
// thread storage) and each bucket's element count.
struct PlaneSplit {
  uint8_t buckets = 0;
  uint8_t planes = 0;
  std::array<uint8_t, kMaxSplitBuckets - 1> thresholds{};
  // Each element's bucket: thread-local storage of PlanSplit or DecodePiece, valid until the
  // thread's next call of either.
  const uint8_t* bucket_of = nullptr;
  std::array<size_t, kMaxSplitBuckets> counts{};
  size_t SegmentBytes() const {
    return buckets == 0 ? 0 : kSegmentHeaderBytes + kSplitHeaderBytes + buckets - 1;
  }
};

// The top plane's row/column model (period 0: none); terms: the P column terms, then the rows'.
struct TopModel {
  uint32_t period = 0;
  uint32_t phase = 0;
  Bytes terms;
  size_t SegmentBytes() const {
    return period == 0 ? 0 : kSegmentHeaderBytes + kModelHeaderBytes + terms.size();
  }
};

// What a container records besides its transform and planes: sub's scaled prediction (fp32;
// 0: none), or the rotation of planes (fp32, bf16, fp16) and the row/column model of their top
// plane (fp32, bf16, fp16: found by EncodeWith where `try_model` is set).
struct PlaneOptions {
  float scale = 0;
  bool rotated = false;
  bool try_model = false;
  TopModel model;
  bool try_split = false;  // sub of width 2 or 4: split the high planes where that pays
  PlaneSplit split;
  size_t PrefixBytes() const {
    return (scale != 0 ? kScaleSegmentBytes
            : rotated  ? kSegmentHeaderBytes
                       : 0) +
           model.SegmentBytes();
  }
};
// With the entropy stage, a plane whose sampled entropy is above this many bits per byte is
// stored raw without trying anything (mantissa bytes: ~7.9 bits), and one below
// kTryCodecBelowBits is also given to the block codec, which beats Huffman's 1 bit per byte on
// long runs (the high planes of deltas). Chosen by measurement (docs/engine.md): on the delta
// planes of the fp32 and bf16 trajectories lz4 won only below ~0.3 bits (planes nearly all
// zero); from 0.5 bits up Huffman was smaller every time, so lz4 is not run there.
constexpr double kRawAboveBits = 7.5;
constexpr double kTryCodecBelowBits = 0.5;
// Encodings are compared on this many leading bytes of a piece (whole elements).
constexpr size_t kSampleBytes = 64 << 10;

// The element's bytes after the transform, as an unsigned integer of the element's width. sub
// stores the difference as a zigzag integer (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...), so that a
// small change of either sign leaves the high planes zero rather than 0x00 or 0xff by the sign.
template <Transform kT, typename U>
inline U Forward(U value, U base) {
  if constexpr (kT == Transform::kXor) return value ^ base;
  if constexpr (kT == Transform::kSub) {
    using S = std::make_signed_t<U>;
    const U d = static_cast<U>(value - base);
    return static_cast<U>(static_cast<U>(d << 1) ^
                          static_cast<U>(static_cast<S>(d) >> (8 * sizeof(U) - 1)));
  }
  return value;
}
template <Transform kT, typename U>
inline U Inverse(U coded, U base) {
  if constexpr (kT == Transform::kXor) return coded ^ base;
  if constexpr (kT == Transform::kSub) {
    return static_cast<U>(base + static_cast<U>((coded >> 1) ^ static_cast<U>(0 - (coded & 1))));
  }
  return coded;
}

template <typename U>
inline U RotateLeft1(U v) {
  return static_cast<U>(static_cast<U>(v << 1) | static_cast<U>(v >> (8 * sizeof(U) - 1)));
}
template <typename U>
inline U RotateRight1(U v) {
  return static_cast<U>(static_cast<U>(v >> 1) | static_cast<U>(v << (8 * sizeof(U) - 1)));
}

// The scaled prediction of sub (fp32 only): the base element times a per-piece factor `scale`
// (Adam's exp_avg_sq decays by beta2 per step, exp_avg by beta1), rounded by one IEEE single
// multiply. Where the base or the product is zero, subnormal, infinite or NaN the prediction is
// the base itself, so that flush-to-zero modes and NaN payloads cannot make two machines
// predict differently. Exact either way: the residual against the prediction is stored.
inline uint32_t PredictScaled(uint32_t base, float scale) {
  float f;
  std::memcpy(&f, &base, 4);
  const float p = f * scale;
  uint32_t q;
  std::memcpy(&q, &p, 4);
  // Exponent fields 1..254 (normal numbers) for both, as one unsigned compare each; branch-free
  // so that the loops below vectorise.
  const uint32_t e = ((base >> 23) & 0xff) - 1, eq = ((q >> 23) & 0xff) - 1;
  const uint32_t keep = static_cast<uint32_t>(0) - static_cast<uint32_t>((e < 0xfe) & (eq < 0xfe));
  return (q & keep) | (base & ~keep);
}

// Writes `elements` elements of raw (transformed against base, or against the scaled prediction
// from base if kScaled, then rotated left by one bit if kRotate) as sizeof(U) planes of
// `elements` bytes each into out. Written so that the compiler vectorises it, prediction
// included (one pass over the piece).
template <Transform kT, typename U, bool kRotate = false, bool kScaled = false>
inline void SplitTyped(const std::byte* __restrict raw, const std::byte* __restrict base,
                       float scale, size_t elements, std::byte* __restrict out) {
  constexpr size_t kW = sizeof(U);
  auto* o = reinterpret_cast<uint8_t*>(out);
  for (size_t i = 0; i < elements; ++i) {
    U v, b = 0;
    std::memcpy(&v, raw + i * kW, kW);  // little-endian host (x86-64, aarch64)
    if constexpr (kT != Transform::kPlanes) std::memcpy(&b, base + i * kW, kW);
    if constexpr (kScaled) b = PredictScaled(b, scale);
    U c = Forward<kT, U>(v, b);
    if constexpr (kRotate) c = RotateLeft1(c);
    for (size_t j = 0; j < kW; ++j) o[j * elements + i] = static_cast<uint8_t>(c >> (8 * j));
  }
}

// The planes of a container being decoded: plane j (`elements` bytes) at [j], the tail (< width
// bytes) at [width]. A plane stored raw is read where it lies in the record (no copy).
using PlanePointers = std::array<const uint8_t*, kMaxPieceWidth + 1>;

template <Transform kT, typename U, bool kRotate = false, bool kScaled = false>
inline void JoinTyped(const PlanePointers& planes, const std::byte* __restrict base, float scale,
                      size_t elements, std::byte* __restrict raw) {
  constexpr size_t kW = sizeof(U);
  const uint8_t* p[kW];
  for (size_t j = 0; j < kW; ++j) p[j] = planes[j];
  for (size_t i = 0; i < elements; ++i) {
    U c = 0, b = 0;
    for (size_t j = 0; j < kW; ++j) c |= static_cast<U>(static_cast<U>(p[j][i]) << (8 * j));
    if constexpr (kT != Transform::kPlanes) std::memcpy(&b, base + i * kW, kW);
    if constexpr (kScaled) b = PredictScaled(b, scale);
    if constexpr (kRotate) c = RotateRight1(c);
    const U v = Inverse<kT, U>(c, b);
    std::memcpy(raw + i * kW, &v, kW);
  }
}

// The factor for the scaled prediction of `raw` from `base` (fp32), or 0 for none. Candidates,
// from the ratios of up to 4096 pairs of normal values (runs spread over the piece): the median,
// and the smallest and the largest ratio. The envelopes are Adam's exp_avg_sq: it decays by exactly
// beta2 per step where no gradient arrived and grows by the squared gradient elsewhere, so an
// old version against the new one (reverse deltas) has ratios up to 1 / beta2^k and a new one
// against the old (forward deltas) down to beta2^k; predicted by that envelope its residual
// keeps one sign and is small wherever the gradient was (docs/engine.md, "Deltas that
// predict"). Of these the one whose residuals on the sampled pairs cost the fewest bits (each
// byte plane's order-0 entropy) is returned; the caller still checks it against plain sub. None
// when too few pairs are usable, or when the best factor is 1 (plain sub) or not a positive normal
// float.
float FitScale(Bytes raw, const std::byte* base) {
  // The pairs: 16 runs of 256 spread evenly over the piece (single pairs spread evenly cost two
  // cache lines each: this was ~10% of encoding an fp32 delta).
  constexpr size_t kRuns = 16, kRun = 256, kPairs = kRuns * kRun;
  const size_t elements = raw.size() / 4;
  const size_t gap = elements > kPairs ? (elements - kRun) / (kRuns - 1) : kRun;
  uint32_t values[kPairs], bases[kPairs];
  float ratios[kPairs];
  size_t n = 0;
  for (size_t run = 0, at = 0; run < kRuns && at < elements; ++run, at += gap) {
    for (size_t i = at; i < std::min(elements, at + kRun); ++i) {
      uint32_t v, b;
      std::memcpy(&v, raw.data() + 4 * i, 4);
      std::memcpy(&b, base + 4 * i, 4);
      const uint32_t ev = (v >> 23) & 0xff, eb = (b >> 23) & 0xff;
      if (ev == 0 || ev == 0xff || eb == 0 || eb == 0xff) continue;
      float fv, fb;
      std::memcpy(&fv, &v, 4);
      std::memcpy(&fb, &b, 4);
      values[n] = v;
      bases[n] = b;
      ratios[n++] = fv / fb;
    }
  }
  if (n < 64) return 0;
  // The median from every fourth pair (nth_element's branches cost as much as the sampling).
  const auto [lowest, highest] = std::minmax_element(ratios, ratios + n);
  const float envelopes[2] = {*lowest, *highest};
  float quarter[kPairs / 4 + 1];
  size_t m = 0;
  for (size_t i = 0; i < n; i += 4) quarter[m++] = ratios[i];
  std::nth_element(quarter, quarter + m / 2, quarter + m);
  float best = 0;
  double best_bits = HUGE_VAL;
  for (float f : {quarter[m / 2], envelopes[0], envelopes[1]}) {
    if (!std::isnormal(f) || f < 0) continue;
    // The residuals' cost as the planes would store them: each byte plane's order-0 entropy,
    // 8 bits where it would be stored raw.
    uint32_t planes[4][256] = {};
    for (size_t i = 0; i < n; ++i) {
      const uint32_t r = Forward<Transform::kSub, uint32_t>(values[i], PredictScaled(bases[i], f));
      for (int j = 0; j < 4; ++j) ++planes[j][static_cast<uint8_t>(r >> (8 * j))];
    }
    double bits = 0;
    for (const auto& plane : planes) {
      const double h = HistogramEntropyBits(plane);
      bits += h > kRawAboveBits ? 8 : h;
    }
    if (bits < best_bits) {
      best_bits = bits;
      best = f;
    }
  }
  if (best == 0 || std::fabs(best - 1.0f) < 1e-6f) return 0;
  return best;
}

// Widths without an integer type (3, 5, 6, 7): the element in a uint64_t, sign-extended from
// its width for sub.
template <Transform kT>
void SplitOdd(uint8_t width, const std::byte* raw, const std::byte* base, size_t elements,
              std::byte* out) {
  const int shift = 64 - 8 * width;
  for (size_t i = 0; i < elements; ++i) {
    uint64_t v = 0, b = 0;
    std::memcpy(&v, raw + i * width, width);
    if (kT != Transform::kPlanes) std::memcpy(&b, base + i * width, width);
    uint64_t c = v;
    if (kT == Transform::kXor) c = v ^ b;
    if (kT == Transform::kSub) {
      const int64_t d = static_cast<int64_t>((v - b) << shift) >> shift;
      c = (static_cast<uint64_t>(d) << 1) ^ static_cast<uint64_t>(d >> 63);
    }
    for (uint8_t j = 0; j < width; ++j)
      out[j * elements + i] = static_cast<std::byte>(c >> (8 * j));
  }
}

template <Transform kT>
void JoinOdd(uint8_t width, const PlanePointers& planes, const std::byte* base, size_t elements,
             std::byte* raw) {
  for (size_t i = 0; i < elements; ++i) {
    uint64_t c = 0, b = 0;
    for (uint8_t j = 0; j < width; ++j) c |= static_cast<uint64_t>(planes[j][i]) << (8 * j);
    if (kT != Transform::kPlanes) std::memcpy(&b, base + i * width, width);
    uint64_t v = c;
    if (kT == Transform::kXor) v = c ^ b;
    if (kT == Transform::kSub) v = b + ((c >> 1) ^ (~(c & 1) + 1));
    std::memcpy(raw + i * width, &v, width);  // the low `width` bytes: mod 2^(8 width)
  }
}

template <Transform kT>
inline void SplitPlanes(uint8_t width, const std::byte* raw, const std::byte* base, size_t elements,
                        std::byte* out) {
  switch (width) {
    case 1:
      return SplitTyped<kT, uint8_t>(raw, base, 0, elements, out);
    case 2:
      return SplitTyped<kT, uint16_t>(raw, base, 0, elements, out);
    case 4:
      return SplitTyped<kT, uint32_t>(raw, base, 0, elements, out);
    case 8:
      return SplitTyped<kT, uint64_t>(raw, base, 0, elements, out);
    default:
      return SplitOdd<kT>(width, raw, base, elements, out);
  }
}

template <Transform kT>
inline void JoinPlanes(uint8_t width, const PlanePointers& planes, const std::byte* base,
                       size_t elements, std::byte* raw) {
  switch (width) {
    case 1:
      return JoinTyped<kT, uint8_t>(planes, base, 0, elements, raw);
    case 2:
      return JoinTyped<kT, uint16_t>(planes, base, 0, elements, raw);
    case 4:
      return JoinTyped<kT, uint32_t>(planes, base, 0, elements, raw);
    case 8:
      return JoinTyped<kT, uint64_t>(planes, base, 0, elements, raw);
    default:
      return JoinOdd<kT>(width, planes, base, elements, raw);
  }
}

// Planes of elements rotated left by one bit, in blocks: the block's elements rotated into a
// buffer on the stack, then split from there. (Rotating inside the split loop vectorised to code
// that read cold pieces at half the speed of the plain split: 1.4 vs 2.7 GB/s; rotate-then-split
// ran at 3.5 GB/s.)
template <typename U>
inline void SplitRotatedTyped(const std::byte* __restrict raw, size_t elements,
                              std::byte* __restrict out) {
  constexpr size_t kBlock = 4096;
  U rotated[kBlock];
  auto* o = reinterpret_cast<uint8_t*>(out);
  for (size_t at = 0; at < elements; at += kBlock) {
    const size_t n = std::min(kBlock, elements - at);
    for (size_t i = 0; i < n; ++i) {
      U v;
      std::memcpy(&v, raw + (at + i) * sizeof(U), sizeof(U));
      rotated[i] = RotateLeft1(v);
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < sizeof(U); ++j) {
        o[j * elements + at + i] = static_cast<uint8_t>(rotated[i] >> (8 * j));
      }
    }
  }
}

// How the elements of a planes container relate to its planes: the transform, and sub's scaled
// prediction (fp32; 0: none) or the rotation of planes (width 2 or 4).
struct PlaneLayout {
  Transform t;
  uint8_t width;
  float scale = 0;
  bool rotated = false;
};

// Splits `raw` into planes as `layout` says (deltas against `base`); the tail is kept bytewise
// (XOR-ed with the base's for deltas). The body of the dispatched variants below.
inline void SplitBody(PlaneLayout layout, Bytes raw, const std::byte* base, std::byte* out) {
  const uint8_t width = layout.width;
  const size_t elements = raw.size() / width;
  if (layout.rotated) {
    if (width == 2) {
      SplitRotatedTyped<uint16_t>(raw.data(), elements, out);
    } else {
      SplitRotatedTyped<uint32_t>(raw.data(), elements, out);
    }
  } else if (layout.scale != 0) {
    SplitTyped<Transform::kSub, uint32_t, false, true>(raw.data(), base, layout.scale, elements,
                                                       out);
  } else if (layout.t == Transform::kXor) {
    SplitPlanes<Transform::kXor>(width, raw.data(), base, elements, out);
  } else if (layout.t == Transform::kSub) {
    SplitPlanes<Transform::kSub>(width, raw.data(), base, elements, out);
  } else {
    SplitPlanes<Transform::kPlanes>(width, raw.data(), base, elements, out);
  }
  const bool delta = IsDelta(layout.t) && base != nullptr;
  for (size_t k = elements * width; k < raw.size(); ++k) out[k] = delta ? raw[k] ^ base[k] : raw[k];
}

// The inverse of SplitBody: joins `planes` into `out`.
inline void JoinBody(PlaneLayout layout, const PlanePointers& planes, const std::byte* base,
                     MutableBytes out) {
  const uint8_t width = layout.width;
  const size_t elements = out.size() / width;
  if (layout.rotated) {
    if (width == 2) {
      JoinTyped<Transform::kPlanes, uint16_t, true>(planes, nullptr, 0, elements, out.data());
    } else {
      JoinTyped<Transform::kPlanes, uint32_t, true>(planes, nullptr, 0, elements, out.data());
    }
  } else if (layout.scale != 0) {
    JoinTyped<Transform::kSub, uint32_t, false, true>(planes, base, layout.scale, elements,
                                                      out.data());
  } else if (layout.t == Transform::kXor) {
    JoinPlanes<Transform::kXor>(width, planes, base, elements, out.data());
  } else if (layout.t == Transform::kSub) {
    JoinPlanes<Transform::kSub>(width, planes, base, elements, out.data());
  } else {
    JoinPlanes<Transform::kPlanes>(width, planes, base, elements, out.data());
  }
  const uint8_t* tail = planes[width];
  const bool delta = IsDelta(layout.t);
  for (size_t k = elements * width, i = 0; k < out.size(); ++k, ++i) {
    out[k] = delta ? static_cast<std::byte>(tail[i]) ^ base[k] : static_cast<std::byte>(tail[i]);
  }
}

// The same loops compiled for AVX-512 and AVX2 (vector_level.h): the compiler vectorises the byte
// transposes and the prediction 2x wider than for the baseline's SSE2 (a split of fp32 sub with
// the scaled prediction: 4.6 -> 9.5 GB/s in a micro-benchmark, hot cache).
#if defined(__x86_64__)
CKPTFS_TARGET_AVX512 void SplitAvx512(PlaneLayout l, Bytes raw, const std::byte* base,
                                      std::byte* out) {
  SplitBody(l, raw, base, out);
}
CKPTFS_TARGET_AVX2 void SplitAvx2(PlaneLayout l, Bytes raw, const std::byte* base, std::byte* out) {
  SplitBody(l, raw, base, out);
}
CKPTFS_TARGET_AVX512 void JoinAvx512(PlaneLayout l, const PlanePointers& planes,
                                     const std::byte* base, MutableBytes out) {
  JoinBody(l, planes, base, out);
}
// The planes of a whole piece (no delta) of width 4 or 2, rotated or not, joined 32 elements a
// round with byte and word unpacks: what a newest version's restore decodes most. The compiler
// vectorised JoinTyped by widening every byte to its element's lane and shifting it into place
// (~1.3 GB/s of a restore's cold pieces in perf). Returns how many elements it joined (a
// multiple of 32); JoinBody's loops do the rest.
CKPTFS_TARGET_AVX2 size_t JoinWholeAvx2(uint8_t width, bool rotated, const PlanePointers& planes,
                                        size_t elements, std::byte* out) {
  size_t i = 0;
  auto* o = reinterpret_cast<__m256i*>(out);
  const __m256i* p[4] = {};  // plane j's next 32 bytes (no lambda: it would not be AVX2 code)
  for (size_t j = 0; j < width && j < 4; ++j) p[j] = reinterpret_cast<const __m256i*>(planes[j]);
  if (width == 4) {
    for (; i + 32 <= elements; i += 32, o += 4) {
      const __m256i b0 = _mm256_loadu_si256(p[0]++), b1 = _mm256_loadu_si256(p[1]++);
      const __m256i b2 = _mm256_loadu_si256(p[2]++), b3 = _mm256_loadu_si256(p[3]++);
      // Within each 128-bit lane: bytes of planes 0/1 and 2/3 paired, then the pairs paired.
      const __m256i lo01 = _mm256_unpacklo_epi8(b0, b1), hi01 = _mm256_unpackhi_epi8(b0, b1);
      const __m256i lo23 = _mm256_unpacklo_epi8(b2, b3), hi23 = _mm256_unpackhi_epi8(b2, b3);
      __m256i e0 = _mm256_unpacklo_epi16(lo01, lo23);  // elements 0-3 | 16-19
      __m256i e1 = _mm256_unpackhi_epi16(lo01, lo23);  // 4-7 | 20-23
      __m256i e2 = _mm256_unpacklo_epi16(hi01, hi23);  // 8-11 | 24-27
      __m256i e3 = _mm256_unpackhi_epi16(hi01, hi23);  // 12-15 | 28-31
      if (rotated) {
        e0 = _mm256_or_si256(_mm256_srli_epi32(e0, 1), _mm256_slli_epi32(e0, 31));
        e1 = _mm256_or_si256(_mm256_srli_epi32(e1, 1), _mm256_slli_epi32(e1, 31));
        e2 = _mm256_or_si256(_mm256_srli_epi32(e2, 1), _mm256_slli_epi32(e2, 31));
        e3 = _mm256_or_si256(_mm256_srli_epi32(e3, 1), _mm256_slli_epi32(e3, 31));
      }
      _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(e0, e1, 0x20));
      _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(e2, e3, 0x20));
      _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(e0, e1, 0x31));
      _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(e2, e3, 0x31));
    }
  } else if (width == 2) {
    for (; i + 32 <= elements; i += 32, o += 2) {
      const __m256i b0 = _mm256_loadu_si256(p[0]++), b1 = _mm256_loadu_si256(p[1]++);
      __m256i lo = _mm256_unpacklo_epi8(b0, b1);  // elements 0-7 | 16-23
      __m256i hi = _mm256_unpackhi_epi8(b0, b1);  // 8-15 | 24-31
      if (rotated) {
        lo = _mm256_or_si256(_mm256_srli_epi16(lo, 1), _mm256_slli_epi16(lo, 15));
        hi = _mm256_or_si256(_mm256_srli_epi16(hi, 1), _mm256_slli_epi16(hi, 15));
      }
      _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
  }
  return i;
}

CKPTFS_TARGET_AVX2 void JoinAvx2(PlaneLayout l, const PlanePointers& planes, const std::byte* base,
                                 MutableBytes out) {
  if (l.t == Transform::kPlanes && l.scale == 0 && (l.width == 4 || l.width == 2)) {
    const size_t done = JoinWholeAvx2(l.width, l.rotated, planes, out.size() / l.width, out.data());
    PlanePointers rest = planes;  // the tail's pointer, at [width], stays
    for (size_t j = 0; j < l.width; ++j) rest[j] += done;
    return JoinBody(l, rest, base, out.subspan(done * l.width));
  }
  JoinBody(l, planes, base, out);
}
#endif

void SplitAs(PlaneLayout layout, Bytes raw, const std::byte* base, std::byte* out) {
#if defined(__x86_64__)
  const CodecVectorLevel level = CodecVectorLevelInUse();
  if (level == CodecVectorLevel::kAvx512) return SplitAvx512(layout, raw, base, out);
  if (level == CodecVectorLevel::kAvx2) return SplitAvx2(layout, raw, base, out);
#endif
  SplitBody(layout, raw, base, out);
}

void JoinAs(PlaneLayout layout, const PlanePointers& planes, const std::byte* base,
            MutableBytes out) {
#if defined(__x86_64__)
  const CodecVectorLevel level = CodecVectorLevelInUse();
  if (level == CodecVectorLevel::kAvx512) return JoinAvx512(layout, planes, base, out);
  if (level == CodecVectorLevel::kAvx2) return JoinAvx2(layout, planes, base, out);
#endif
  JoinBody(layout, planes, base, out);
}

// The row/column model of the top plane (kModelSegment). Rows of `period` bytes, the first one
// starting `phase` columns in: calls row(q, at, column, count) for each run of a row in [0, n).
template <typename F>
void ForEachRow(size_t n, size_t period, size_t phase, F&& row) {
  size_t at = 0;
  for (size_t q = 0, column = phase; at < n; ++q, column = 0) {
    const size_t count = std::min(period - column, n - at);
    row(q, at, column, count);
    at += count;
  }
}

size_t ModelRows(size_t n, size_t period, size_t phase) {
  return (phase + n + period - 1) / period;
}

// sad[lag] = the sum of |x[i] - x[i + lag]| over i < window (a multiple of 32), for lag in
// [first, last]. With AVX2 where the CPU has it.
#if defined(__x86_64__)
__attribute__((target("avx2"))) void LagSumsAvx2(const uint8_t* x, size_t window, size_t first,
                                                 size_t last, uint64_t* sad) {
  for (size_t lag = first; lag <= last; ++lag) {
    __m256i acc = _mm256_setzero_si256();
    for (size_t i = 0; i < window; i += 32) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + lag));
      acc = _mm256_add_epi64(acc, _mm256_sad_epu8(a, b));
    }
    const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    sad[lag] = static_cast<uint64_t>(_mm_cvtsi128_si64(s)) +
               static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s)));
  }
}
#endif
void LagSums(const uint8_t* x, size_t window, size_t first, size_t last, uint64_t* sad) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return LagSumsAvx2(x, window, first, last, sad);
#endif
  for (size_t lag = first; lag <= last; ++lag) {
    uint64_t sum = 0;
    for (size_t i = 0; i < window; ++i) {
      sum += static_cast<uint64_t>(x[i] > x[i + lag] ? x[i] - x[i + lag] : x[i + lag] - x[i]);
    }
    sad[lag] = sum;
  }
}

// The row length of a tensor from its top plane `x` (kModelWindow + max_lag + 1 bytes): lags at
// which a window of kModelWindow bytes differs markedly less (sum of absolute differences) from
// the bytes one lag on than at the lags beside it (the same column one row on). The dips are
// looked for on the first kModelCoarse bytes of the window at every lag, and the deepest few
// measured on the whole window. Appends the deepest dip and the smallest of its divisors that
// dips half as deep (multiples of the row length dip too).
constexpr size_t kModelWindow = 512;  // multiples of 32
constexpr size_t kModelCoarse = 128;
constexpr size_t kModelCoarseDips = 16;
constexpr size_t kModelMaxPeriod = 4096;
void AddDips(const uint8_t* x, size_t max_lag, std::vector<uint32_t>* out) {
  // The dip at a lag: sad[lag] / min(sad[lag - 1], sad[lag + 1]), compared as integers.
  thread_local std::vector<uint64_t> coarse, fine;
  coarse.assign(max_lag + 2, 0);
  LagSums(x, kModelCoarse, 1, max_lag + 1, coarse.data());
  auto deeper = [](const std::vector<uint64_t>& sad, size_t a, size_t b) {  // a's dip below b's
    const uint64_t ba = std::min(sad[a - 1], sad[a + 1]), bb = std::min(sad[b - 1], sad[b + 1]);
    return sad[a] * bb < sad[b] * ba;
  };
  size_t top[kModelCoarseDips] = {};  // the deepest coarse dips, deepest first (0: none)
  for (size_t lag = 2; lag <= max_lag; ++lag) {
    if (std::min(coarse[lag - 1], coarse[lag + 1]) == 0) continue;
    if (top[kModelCoarseDips - 1] != 0 && !deeper(coarse, lag, top[kModelCoarseDips - 1])) continue;
    size_t at = kModelCoarseDips - 1;
    while (at > 0 && (top[at - 1] == 0 || deeper(coarse, lag, top[at - 1]))) {
      top[at] = top[at - 1];
      --at;
    }
    top[at] = lag;
  }
  fine.assign(max_lag + 2, UINT64_MAX);  // measured on the whole window where asked for
  auto sad = [&](size_t lag) {
    if (fine[lag] == UINT64_MAX) LagSums(x, kModelWindow, lag, lag, fine.data());
    return fine[lag];
  };
  auto beside = [&](size_t lag) { return std::min(sad(lag - 1), sad(lag + 1)); };
  size_t best = 0;
  for (const size_t lag : top) {
    if (lag == 0 || beside(lag) == 0) continue;
    if (best == 0 || sad(lag) * beside(best) < sad(best) * beside(lag)) best = lag;
  }
  if (best == 0 || 10 * sad(best) >= 9 * beside(best)) return;  // dips under 10%: noise
  auto add = [&](size_t lag) {
    if (std::find(out->begin(), out->end(), lag) == out->end()) {
      out->push_back(static_cast<uint32_t>(lag));
    }
  };
  add(best);
  // The smallest divisor whose dip is at least half as deep: sad[d] / beside(d) <= (1 + dip) / 2.
  auto deep = [&](size_t d) {
    return 2 * sad(d) * beside(best) <= beside(d) * (beside(best) + sad(best));
  };
  // The divisors in increasing order: k up to sqrt(best), then best / k for k down from there.
  size_t smallest = 0, k = 2;
  for (; k * k <= best && smallest == 0; ++k) {
    if (best % k == 0 && deep(k)) smallest = k;
  }
  for (--k; k >= 2 && smallest == 0; --k) {
    if (best % k == 0 && best / k != k && deep(best / k)) smallest = best / k;
  }
  if (smallest != 0) add(smallest);
}

// The sum of t[k] - c[k] over k < len (<= kModelMaxPeriod).
int32_t RowExcess(const uint8_t* __restrict t, const uint8_t* __restrict c, size_t len) {
  int32_t s = 0;
  for (size_t k = 0; k < len; ++k) s += int32_t{t[k]} - int32_t{c[k]};
  return s;
}
// r[k] = t[k] - c[k] - term (mod 256), and the same in place.
void SubtractTerms(const uint8_t* __restrict t, const uint8_t* __restrict c, uint8_t term,
                   size_t len, uint8_t* __restrict r) {
  for (size_t k = 0; k < len; ++k) r[k] = static_cast<uint8_t>(t[k] - c[k] - term);
}
void SubtractTermsInPlace(uint8_t* __restrict t, const uint8_t* __restrict c, uint8_t term,
                          size_t len) {
  for (size_t k = 0; k < len; ++k) t[k] = static_cast<uint8_t>(t[k] - c[k] - term);
}

// Fits the row/column model of period p to top[0, n) (n >= 2p): p column terms and then one
// term per row into `terms`, the residual into `res` (which may be `top`). The phase is searched
// for where `phase` is kSearchPhase. Returns the phase; the residual's byte histogram into `hist`
// if not null.
constexpr size_t kSearchPhase = SIZE_MAX;
size_t FitModel(const uint8_t* top, size_t n, size_t p, size_t phase, Buffer* terms, uint8_t* res,
                uint32_t* hist) {
  // Column means, by element index mod p (the phase only renames the columns).
  thread_local std::vector<uint32_t> sum;
  sum.assign(p, 0);
  for (size_t at = 0; at < n; at += p) {
    const size_t len = std::min(p, n - at);
    uint32_t* __restrict s = sum.data();
    const uint8_t* __restrict t = top + at;
    for (size_t c = 0; c < len; ++c) s[c] += t[c];
  }
  const size_t full_rows = n / p, partial = n % p;
  int64_t col_total = 0;
  thread_local std::vector<uint8_t> mean;
  mean.resize(p);
  for (size_t c = 0; c < p; ++c) {
    const size_t count = full_rows + (c < partial);
    mean[c] = static_cast<uint8_t>((sum[c] + count / 2) / count);
    col_total += mean[c];
  }
  if (phase == kSearchPhase) {
    // Rows start at the offset b (< p) that maximises the spread of the row sums (less the
    // column terms) over the whole rows, sum_q (S_q(b) - col_total)^2. S_q(b + 1) is S_q(b)
    // less its first byte plus the next row's, of the same column, so one sequential pass over
    // each row and the next gives S_q(b) for every b.
    thread_local std::vector<int64_t> spread;
    spread.assign(p, 0);
    for (size_t q = 0; q + 1 < full_rows; ++q) {
      const uint8_t* t = top + q * p;
      int64_t v = -col_total;
      for (size_t c = 0; c < p; ++c) v += t[c];
      for (size_t b = 0; b < p; ++b) {
        spread[b] += v * v;
        v += int64_t{t[p + b]} - int64_t{t[b]};
      }
    }
    const size_t start =
        static_cast<size_t>(std::max_element(spread.begin(), spread.end()) - spread.begin());
    phase = (p - start) % p;
  }
  const size_t rows = ModelRows(n, p, phase);
  terms->Resize(p + rows);
  auto* col = reinterpret_cast<uint8_t*>(terms->data());
  auto* row = col + p;
  for (size_t c = 0; c < p; ++c) col[(c + phase) % p] = mean[c];
  // Row terms: the rounded mean of each row less its columns' terms; then the residual.
  ForEachRow(n, p, phase, [&](size_t q, size_t at, size_t column, size_t len) {
    const int32_t s = RowExcess(top + at, col + column, len);
    const auto term =
        static_cast<uint8_t>(std::lround(static_cast<double>(s) / static_cast<double>(len)));
    row[q] = term;
    if (res == top) {
      SubtractTermsInPlace(res + at, col + column, term, len);
    } else {
      SubtractTerms(top + at, col + column, term, len, res + at);
    }
  });
  if (hist != nullptr) ByteHistogram(Bytes(reinterpret_cast<const std::byte*>(res), n), hist);
  return phase;
}

// Finds and fits the row/column model of the top plane `top` (n bytes): candidate periods from
// the dips of the bytes and of their differences from the left neighbour (which cancel the row
// terms, so columns show where rows vary as much), compared on kModelTrial bytes from the
// middle of the plane (which also give the phase). Where the best makes the trial's order-0
// entropy smaller by more than 2% with the terms counted, it is fitted to the whole plane, the
// plane replaced by its residual and the model returned (its terms in per-thread storage);
// otherwise no model.
constexpr size_t kModelTrial = 16 << 10;
inline TopModel FitTopModelBody(uint8_t* top, size_t n) {
  if (n < 4 * kModelWindow) return {};
  const size_t max_lag = std::min(kModelMaxPeriod, n - kModelWindow - 2);
  const size_t at = (n - kModelWindow - max_lag - 1) / 2;
  thread_local std::vector<uint32_t> candidates;
  candidates.clear();
  AddDips(top + at, max_lag, &candidates);
  thread_local std::vector<uint8_t> diff;
  diff.resize(kModelWindow + max_lag + 1);
  for (size_t i = 0; i < diff.size(); ++i) {
    const uint8_t left = at + i > 0 ? top[at + i - 1] : top[at + i];
    diff[i] = static_cast<uint8_t>(top[at + i] - left + 128);
  }
  AddDips(diff.data(), max_lag, &candidates);
  if (candidates.empty()) return {};
  const size_t len = std::min(n, kModelTrial);
  thread_local Buffer terms, residual;
  residual.Resize(len);
  auto* res = reinterpret_cast<uint8_t*>(residual.data());
  const size_t from = (n - len) / 2;
  const uint8_t* trial = top + from;
  uint32_t hist[256];
  ByteHistogram(Bytes(reinterpret_cast<const std::byte*>(trial), len), hist);
  // Bits per element of the trial; the terms counted as the whole plane pays for them.
  const double plain = HistogramEntropyBits(hist);
  double best = 0;
  size_t period = 0, trial_phase = 0;
  for (const uint32_t p : candidates) {
    if (2 * size_t{p} > len) continue;
    const size_t phase = FitModel(trial, len, p, kSearchPhase, &terms, res, hist);
    const double bits =
        HistogramEntropyBits(hist) +
        8.0 * static_cast<double>(kSegmentHeaderBytes + kModelHeaderBytes + p + n / p + 1) /
            static_cast<double>(n);
    if (period == 0 || bits < best) {
      best = bits;
      period = p;
      trial_phase = phase;
    }
  }
  if (period == 0 || best >= 0.98 * plain) return {};
  // Element `from` of the plane sits in the trial's column trial_phase.
  const size_t phase = (trial_phase + period - from % period) % period;
  FitModel(top, n, period, phase, &terms, top, nullptr);
  return {.period = static_cast<uint32_t>(period),
          .phase = static_cast<uint32_t>(phase),
          .terms = terms.bytes()};
}

// FitTopModelBody compiled for AVX-512 and AVX2 too (vector_level.h): the column sums, row sums
// and residuals are byte loops the compiler vectorises; integers only, so the same model at
// every level.
#if defined(__x86_64__)
CKPTFS_TARGET_AVX512 TopModel FitTopModelAvx512(uint8_t* top, size_t n) {
  return FitTopModelBody(top, n);
}
CKPTFS_TARGET_AVX2 TopModel FitTopModelAvx2(uint8_t* top, size_t n) {
  return FitTopModelBody(top, n);
}
#endif
TopModel FitTopModel(uint8_t* top, size_t n) {
#if defined(__x86_64__)
  const CodecVectorLevel level = CodecVectorLevelInUse();
  if (level == CodecVectorLevel::kAvx512) return FitTopModelAvx512(top, n);
  if (level == CodecVectorLevel::kAvx2) return FitTopModelAvx2(top, n);
#endif
  return FitTopModelBody(top, n);
}

// Adds the model's terms back to the residual top plane (n bytes).
void ApplyTopModel(uint8_t* top, size_t n, size_t period, size_t phase, const uint8_t* terms) {
  const uint8_t* col = terms;
  const uint8_t* row = terms + period;
  ForEachRow(n, period, phase, [&](size_t q, size_t at, size_t column, size_t len) {
    const uint8_t r = row[q];
    uint8_t* __restrict t = top + at;
    const uint8_t* __restrict c = col + column;
    for (size_t k = 0; k < len; ++k) t[k] = static_cast<uint8_t>(t[k] + c[k] + r);
  });
}

// The split's thresholds as the bucket loops compare them: unused ones 256 (never reached).
using SplitThresholds = std::array<uint32_t, kMaxSplitBuckets - 1>;
SplitThresholds ThresholdsOf(const PlaneSplit& split) {
  SplitThresholds t;
  t.fill(256);
  for (size_t b = 0; b + 1 < split.buckets; ++b) t[b] = split.thresholds[b];
  return t;
}
// An element's magnitude byte: the 8 bits below its sign (the exponent of fp32 and bf16).
template <typename U>
inline uint32_t MagnitudeOf(U v) {
  return static_cast<uint32_t>(v >> (8 * sizeof(U) - 9)) & 0xff;
}
// Its bucket: how many thresholds the magnitude byte reaches (compares and adds, which the
// compiler vectorises).
inline uint32_t BucketOf(uint32_t magnitude, const SplitThresholds& t) {
  uint32_t b = 0;
  for (uint32_t threshold : t) b += magnitude >= threshold;
  return b;
}

// Each element's bucket at the baseline, and how many elements reach each threshold
// (`reached`), with only the `kUsed` thresholds in use compared: the compiler unrolls and
// vectorises the loop (with all seven thresholds and a second pass counting the buckets, 2.5x
// as long).
template <typename U, size_t kUsed>
void BucketsScalarOf(const std::byte* __restrict base, size_t elements, const SplitThresholds& t,
                     uint8_t* __restrict out, std::array<size_t, kMaxSplitBuckets - 1>* reached) {
  for (size_t j = 0; j < kUsed; ++j) (*reached)[j] = 0;
  // Counted in 32 bits (the lanes the compiler vectorises with), so in blocks of 2^31 elements.
  for (size_t from = 0; from < elements; from += size_t{1} << 31) {
    const size_t to = std::min(elements, from + (size_t{1} << 31));
    std::array<uint32_t, kUsed> at_or_above{};
    for (size_t i = from; i < to; ++i) {
      U v;
      std::memcpy(&v, base + sizeof(U) * i, sizeof(U));
      const uint32_t magnitude = MagnitudeOf(v);
      uint32_t b = 0;
      for (size_t j = 0; j < kUsed; ++j) {
        const uint32_t k = magnitude >= t[j];
        b += k;
        at_or_above[j] += k;
      }
      out[i] = static_cast<uint8_t>(b);
    }
    for (size_t j = 0; j < kUsed; ++j) (*reached)[j] += at_or_above[j];
  }
}
using BucketsScalarFn = void (*)(const std::byte*, size_t, const SplitThresholds&, uint8_t*,
                                 std::array<size_t, kMaxSplitBuckets - 1>*);
template <typename U, size_t... k>
constexpr std::array<BucketsScalarFn, sizeof...(k)> BucketsScalarTable(std::index_sequence<k...>) {
  return {&BucketsScalarOf<U, k + 1>...};
}
// Entry used - 1: the loop for `used` thresholds (1 .. kMaxSplitBuckets - 1), per width.
constexpr auto kBucketsScalar32 =
    BucketsScalarTable<uint32_t>(std::make_index_sequence<kMaxSplitBuckets - 1>());
constexpr auto kBucketsScalar16 =
    BucketsScalarTable<uint16_t>(std::make_index_sequence<kMaxSplitBuckets - 1>());
// The counts of the buckets from `reached` (reached[j]: the elements whose magnitude byte is at
// or above threshold j; the thresholds increase, so these do not), of `elements` in all.
void CountsFromReached(const std::array<size_t, kMaxSplitBuckets - 1>& reached, size_t used,
                       size_t elements, std::array<size_t, kMaxSplitBuckets>* counts) {
  counts->fill(0);
  (*counts)[0] = elements - (used > 0 ? reached[0] : 0);
  for (size_t b = 1; b <= used; ++b) (*counts)[b] = reached[b - 1] - (b < used ? reached[b] : 0);
}
// The thresholds in use (those below 256).
size_t UsedThresholds(const SplitThresholds& t) {
  size_t used = 0;
  while (used < t.size() && t[used] < 256) ++used;
  return used;
}
// The elements from `from` on (the tail after the vector loops) with the scalar loop; adds to
// `reached`.
template <size_t kUsed>
void BucketsTail(uint8_t width, const std::byte* base, size_t from, size_t elements,
                 const SplitThresholds& t, uint8_t* out,
                 std::array<size_t, kMaxSplitBuckets - 1>* reached) {
  std::array<size_t, kMaxSplitBuckets - 1> tail{};
  if (width == 4) {
    BucketsScalarOf<uint32_t, kUsed>(base + 4 * from, elements - from, t, out + from, &tail);
  } else {
    BucketsScalarOf<uint16_t, kUsed>(base + 2 * from, elements - from, t, out + from, &tail);
  }
  for (size_t j = 0; j < kUsed; ++j) (*reached)[j] += tail[j];
}

#if defined(__x86_64__)
// A vector of elements a round: the magnitude bytes in its lanes (shifted and masked), the
// bucket as the count of thresholds reached (a compare and a masked add each), narrowed into
// `out`; each compare's mask counted as it goes (a popcount: the elements at or above the
// threshold), so that no second pass over `out` is needed. Instantiated per number of
// thresholds in use, so that the loop over them unrolls and the counts stay in registers (a
// count in memory, indexed at run time, made each round wait for the one before). The shifts are
// the zero-masked forms: GCC 12 warns that the plain ones' undefined source may be uninitialised.
template <size_t kUsed>
CKPTFS_TARGET_AVX512 void BucketsAvx512Of(uint8_t width, const std::byte* base, size_t elements,
                                          const SplitThresholds& t, uint8_t* out,
                                          std::array<size_t, kMaxSplitBuckets - 1>* reached) {
  std::array<size_t, kUsed> at_or_above{};
  size_t i = 0;
  if (width == 4) {
    const __m512i low = _mm512_set1_epi32(0xff), one = _mm512_set1_epi32(1);
    for (; i + 16 <= elements; i += 16) {
      const __m512i v = _mm512_loadu_si512(base + 4 * i);
      const __m512i m = _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, v, 23), low);
      __m512i ids = _mm512_setzero_si512();
      for (size_t j = 0; j < kUsed; ++j) {
        const __mmask16 k = _mm512_cmpge_epu32_mask(m, _mm512_set1_epi32(t[j]));
        ids = _mm512_mask_add_epi32(ids, k, ids, one);
        at_or_above[j] += static_cast<size_t>(__builtin_popcount(k));
      }
      _mm512_mask_cvtepi32_storeu_epi8(out + i, 0xffff, ids);
    }
  } else {
    const __m512i low = _mm512_set1_epi16(0xff), one = _mm512_set1_epi16(1);
    for (; i + 32 <= elements; i += 32) {
      const __m512i v = _mm512_loadu_si512(base + 2 * i);
      const __m512i m = _mm512_and_si512(_mm512_maskz_srli_epi16(~__mmask32{0}, v, 7), low);
      __m512i ids = _mm512_setzero_si512();
      for (size_t j = 0; j < kUsed; ++j) {
        const __mmask32 k =
            _mm512_cmpge_epu16_mask(m, _mm512_set1_epi16(static_cast<int16_t>(t[j])));
        ids = _mm512_mask_add_epi16(ids, k, ids, one);
        at_or_above[j] += static_cast<size_t>(__builtin_popcount(k));
      }
      _mm512_mask_cvtepi16_storeu_epi8(out + i, ~__mmask32{0}, ids);
    }
  }
  for (size_t j = 0; j < kUsed; ++j) (*reached)[j] = at_or_above[j];
  BucketsTail<kUsed>(width, base, i, elements, t, out, reached);
}
// The same with AVX2, 32 elements a round: magnitudes 0..255 compared signed (greater than the
// threshold less one), the -1s of each compare subtracted into the ids and counted from its
// movemask; the ids packed to bytes and their lanes put back in element order.
template <size_t kUsed>
CKPTFS_TARGET_AVX2 void BucketsAvx2Of(uint8_t width, const std::byte* base, size_t elements,
                                      const SplitThresholds& t, uint8_t* out,
                                      std::array<size_t, kMaxSplitBuckets - 1>* reached) {
  std::array<size_t, kUsed> at_or_above{};
  size_t i = 0;
  if (width == 4) {
    const __m256i low = _mm256_set1_epi32(0xff);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; i + 32 <= elements; i += 32) {
      __m256i ids[4];
      for (int q = 0; q < 4; ++q) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 4 * i) + q);
        const __m256i m = _mm256_and_si256(_mm256_srli_epi32(v, 23), low);
        ids[q] = _mm256_setzero_si256();
        for (size_t j = 0; j < kUsed; ++j) {
          const __m256i k = _mm256_cmpgt_epi32(m, _mm256_set1_epi32(static_cast<int>(t[j]) - 1));
          ids[q] = _mm256_sub_epi32(ids[q], k);
          at_or_above[j] += static_cast<size_t>(__builtin_popcount(
              static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(k)))));
        }
      }
      // packs: [a0-3 b0-3 a4-7 b4-7] and [c.. d..], then bytes [a0-3 b0-3 c0-3 d0-3 a4-7 ...].
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(ids[0], ids[1]),
                                               _mm256_packs_epi32(ids[2], ids[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permutevar8x32_epi32(bytes, order));
    }
  } else {
    const __m256i low = _mm256_set1_epi16(0xff);
    for (; i + 32 <= elements; i += 32) {
      __m256i ids[2];
      for (int q = 0; q < 2; ++q) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 2 * i) + q);
        const __m256i m = _mm256_and_si256(_mm256_srli_epi16(v, 7), low);
        ids[q] = _mm256_setzero_si256();
        for (size_t j = 0; j < kUsed; ++j) {
          const __m256i k =
              _mm256_cmpgt_epi16(m, _mm256_set1_epi16(static_cast<int16_t>(t[j] - 1)));
          ids[q] = _mm256_sub_epi16(ids[q], k);
          // Two mask bits per element.
          at_or_above[j] += static_cast<size_t>(
              __builtin_popcount(static_cast<uint32_t>(_mm256_movemask_epi8(k))) / 2);
        }
      }
      // packus: [a0-7 b0-7 a8-15 b8-15], then the 64-bit quarters in element order.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permute4x64_epi64(_mm256_packus_epi16(ids[0], ids[1]), 0xd8));
    }
  }
  for (size_t j = 0; j < kUsed; ++j) (*reached)[j] = at_or_above[j];
  BucketsTail<kUsed>(width, base, i, elements, t, out, reached);
}
using BucketsFn = void (*)(uint8_t, const std::byte*, size_t, const SplitThresholds&, uint8_t*,
                           std::array<size_t, kMaxSplitBuckets - 1>*);
template <size_t... k>
constexpr std::array<BucketsFn, sizeof...(k)> BucketsAvx512Table(std::index_sequence<k...>) {
  return {&BucketsAvx512Of<k + 1>...};
}
template <size_t... k>
constexpr std::array<BucketsFn, sizeof...(k)> BucketsAvx2Table(std::index_sequence<k...>) {
  return {&BucketsAvx2Of<k + 1>...};
}
// Entry used - 1: the loops for `used` thresholds (1 .. kMaxSplitBuckets - 1).
constexpr auto kBucketsAvx512 =
    BucketsAvx512Table(std::make_index_sequence<kMaxSplitBuckets - 1>());
constexpr auto kBucketsAvx2 = BucketsAvx2Table(std::make_index_sequence<kMaxSplitBuckets - 1>());
#endif

// Each element's bucket under `split` (its thresholds and bucket count set) from the base's
// magnitude bytes, into `bucket_of` (elements bytes); the counts into split->counts.
void BucketElements(uint8_t width, const std::byte* base, size_t elements, PlaneSplit* split,
                    uint8_t* bucket_of) {
  const SplitThresholds t = ThresholdsOf(*split);
  split->bucket_of = bucket_of;
  const size_t used = UsedThresholds(t);
#if defined(__x86_64__)
  const CodecVectorLevel level = CodecVectorLevelInUse();
  if (level != CodecVectorLevel::kBaseline && used > 0) {
    std::array<size_t, kMaxSplitBuckets - 1> reached{};
    (level == CodecVectorLevel::kAvx512 ? kBucketsAvx512 : kBucketsAvx2)[used - 1](
        width, base, elements, t, bucket_of, &reached);
    return CountsFromReached(reached, used, elements, &split->counts);
  }
#endif
  std::array<size_t, kMaxSplitBuckets - 1> reached{};
  if (used > 0) {
    (width == 4 ? kBucketsScalar32 : kBucketsScalar16)[used - 1](base, elements, t, bucket_of,
                                                                 &reached);
  } else {
    std::memset(bucket_of, 0, elements);
  }
  CountsFromReached(reached, used, elements, &split->counts);
}

// Moves the bytes of `plane` to `out` (elements + 64 bytes: the vector loop stores whole
// vectors) bucket by bucket (bucket 0's first), each bucket's in element order; ScatterBuckets
// is the inverse. With AVX-512 VBMI2: a byte compression per bucket and 64 elements, a byte
// expansion per bucket and 64 elements back. (The scalar loops wait on the bucket's cursor,
// stored and loaded again per element: with them the fp32 weights' deltas of the trajectory
// decoded at 1.2 GB/s per core, with these at 1.9.)
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vbmi2,bmi2,popcnt"))) void GatherBucketsVbmi2(
    const PlaneSplit& split, const uint8_t* __restrict plane, size_t elements,
    const std::array<uint8_t*, kMaxSplitBuckets>& to) {
  const uint8_t* bucket_of = split.bucket_of;
  // Bucket by bucket: the whole vector stored past one bucket's end is overwritten by the next.
  for (size_t b = 0; b < split.buckets; ++b) {
    uint8_t* out = to[b];
    const __m512i id = _mm512_set1_epi8(static_cast<char>(b));
    size_t i = 0;
    for (; i + 64 <= elements; i += 64) {
      const __mmask64 m = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(bucket_of + i), id);
      _mm512_storeu_si512(out, _mm512_maskz_compress_epi8(m, _mm512_loadu_si512(plane + i)));
      out += _mm_popcnt_u64(m);
    }
    for (; i < elements; ++i) {
      if (bucket_of[i] == b) *out++ = plane[i];
    }
  }
}
__attribute__((target("avx512f,avx512bw,avx512vbmi2,bmi2,popcnt"))) void ScatterBucketsVbmi2(
    const PlaneSplit& split, std::array<const uint8_t*, kMaxSplitBuckets> at, size_t elements,
    uint8_t* __restrict plane) {
  const uint8_t* bucket_of = split.bucket_of;
  size_t i = 0;
  for (; i + 64 <= elements; i += 64) {
    const __m512i ids = _mm512_loadu_si512(bucket_of + i);
    __m512i v = _mm512_setzero_si512();
    for (size_t b = 0; b < split.buckets; ++b) {
      const __mmask64 m = _mm512_cmpeq_epi8_mask(ids, _mm512_set1_epi8(static_cast<char>(b)));
      v = _mm512_mask_expand_epi8(v, m, _mm512_loadu_si512(at[b]));
      at[b] += _mm_popcnt_u64(m);
    }
    _mm512_storeu_si512(plane + i, v);
  }
  for (; i < elements; ++i) plane[i] = *at[bucket_of[i]]++;
}

// The AVX2 level's byte compression and expansion, 8 bytes at a time: for a mask m of 8
// elements, kByteShuffles.pack[m] moves the bytes whose bit is set to the front (in order) and
// expand[m] moves the front bytes back to where the bits are set (pshufb indices; 0x80 clears).
struct ByteShuffles {
  std::array<uint64_t, 256> pack{};
  std::array<uint64_t, 256> expand{};
};
constexpr ByteShuffles MakeByteShuffles() {
  ByteShuffles t;
  for (unsigned m = 0; m < 256; ++m) {
    // 0x80: pshufb clears the byte (also in pack + 8, the upper half's indices).
    uint64_t pack = 0x8080808080808080, expand = 0x8080808080808080;
    for (unsigned k = 0, rank = 0; k < 8; ++k) {
      if ((m >> k & 1) == 0) continue;
      pack = (pack & ~(uint64_t{0xff} << (8 * rank))) | uint64_t{k} << (8 * rank);
      expand = (expand & ~(uint64_t{0xff} << (8 * k))) | uint64_t{rank} << (8 * k);
      ++rank;
    }
    t.pack[m] = pack;
    t.expand[m] = expand;
  }
  return t;
}
constexpr ByteShuffles kByteShuffles = MakeByteShuffles();

// One pass for all K buckets, each written at its own pointer (8-byte stores past a bucket's end:
// GatherBuckets leaves a gap after each). K a constant, so the pointers stay in registers.
template <size_t K>
CKPTFS_TARGET_AVX2 void GatherBucketsAvx2Of(const uint8_t* __restrict bucket_of,
                                            const uint8_t* __restrict plane, size_t elements,
                                            std::array<uint8_t*, kMaxSplitBuckets> to_array) {
  std::array<uint8_t*, K> to;
  for (size_t b = 0; b < K; ++b) to[b] = to_array[b];
  const __m128i eight = _mm_set1_epi8(8);
  size_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    const __m128i ids = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bucket_of + i));
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(plane + i));
    for (size_t b = 0; b < K; ++b) {
      const __m128i id = _mm_set1_epi8(static_cast<char>(b));
      const auto m = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(ids, id)));
      const __m128i lo = _mm_cvtsi64_si128(static_cast<int64_t>(kByteShuffles.pack[m & 0xff]));
      const __m128i hi =
          _mm_add_epi8(_mm_cvtsi64_si128(static_cast<int64_t>(kByteShuffles.pack[m >> 8])), eight);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(to[b]), _mm_shuffle_epi8(v, lo));
      to[b] += std::popcount(m & 0xff);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(to[b]), _mm_shuffle_epi8(v, hi));
      to[b] += std::popcount(m >> 8);
    }
  }
  for (; i < elements; ++i) *to[bucket_of[i]]++ = plane[i];
}
using GatherFn = void (*)(const uint8_t*, const uint8_t*, size_t,
                          std::array<uint8_t*, kMaxSplitBuckets>);
template <size_t... k>
constexpr std::array<GatherFn, sizeof...(k)> GatherAvx2Table(std::index_sequence<k...>) {
  return {&GatherBucketsAvx2Of<k + 2>...};
}
// Entry buckets - 2: the loop for 2 .. kMaxSplitBuckets buckets.
constexpr auto kGatherAvx2 = GatherAvx2Table(std::make_index_sequence<kMaxSplitBuckets - 1>());
CKPTFS_TARGET_AVX2 void ScatterBucketsAvx2(const PlaneSplit& split,
                                           std::array<const uint8_t*, kMaxSplitBuckets> at,
                                           size_t elements, uint8_t* __restrict plane) {
  const uint8_t* bucket_of = split.bucket_of;
  size_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    const __m128i ids = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bucket_of + i));
    __m128i v = _mm_setzero_si128();
    for (size_t b = 0; b < split.buckets; ++b) {
      const __m128i id = _mm_set1_epi8(static_cast<char>(b));
      const auto m = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(ids, id)));
      const __m128i lo =
          _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at[b])),
                           _mm_cvtsi64_si128(static_cast<int64_t>(kByteShuffles.expand[m & 0xff])));
      at[b] += std::popcount(m & 0xff);
      const __m128i hi =
          _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at[b])),
                           _mm_cvtsi64_si128(static_cast<int64_t>(kByteShuffles.expand[m >> 8])));
      at[b] += std::popcount(m >> 8);
      v = _mm_or_si128(v, _mm_unpacklo_epi64(lo, hi));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(plane + i), v);
  }
  for (; i < elements; ++i) plane[i] = *at[bucket_of[i]]++;
}
#endif
bool UseVbmi2() {
#if defined(__x86_64__)
  return CodecVectorLevelInUse() >= CodecVectorLevel::kAvx512 && CodecCpuHasAvx512Vbmi2();
#else
  return false;
#endif
}
// Where GatherBuckets puts each bucket's bytes in its output: in order, kGatherGap bytes apart
// (the vector loops store past a bucket's end). The output needs GatheredBytes(split, elements).
constexpr size_t kGatherGap = 8;
std::array<size_t, kMaxSplitBuckets> GatheredStarts(const PlaneSplit& split) {
  std::array<size_t, kMaxSplitBuckets> starts{};
  for (size_t b = 1; b < split.buckets; ++b) {
    starts[b] = starts[b - 1] + split.counts[b - 1] + kGatherGap;
  }
  return starts;
}
size_t GatheredBytes(const PlaneSplit& split, size_t elements) {
  return elements + split.buckets * kGatherGap + 64;
}
void GatherBuckets(const PlaneSplit& split, const uint8_t* __restrict plane, size_t elements,
                   uint8_t* __restrict out) {
  const std::array<size_t, kMaxSplitBuckets> starts = GatheredStarts(split);
  std::array<uint8_t*, kMaxSplitBuckets> to{};
  for (size_t b = 0; b < split.buckets; ++b) to[b] = out + starts[b];
#if defined(__x86_64__)
  if (UseVbmi2()) return GatherBucketsVbmi2(split, plane, elements, to);
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    return kGatherAvx2[split.buckets - 2](split.bucket_of, plane, elements, to);
  }
#endif
  const uint8_t* __restrict bucket_of = split.bucket_of;
  for (size_t i = 0; i < elements; ++i) *to[bucket_of[i]]++ = plane[i];
}
// `from`: each bucket's bytes, with 64 readable bytes after each bucket's (in the record, or in a
// buffer of their own: UnpackSegments).
void ScatterBuckets(const PlaneSplit& split,
                    const std::array<const uint8_t*, kMaxSplitBuckets>& from, size_t elements,
                    uint8_t* __restrict plane) {
#if defined(__x86_64__)
  if (UseVbmi2()) return ScatterBucketsVbmi2(split, from, elements, plane);
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    return ScatterBucketsAvx2(split, from, elements, plane);
  }
#endif
  std::array<const uint8_t*, kMaxSplitBuckets> at = from;
  const uint8_t* __restrict bucket_of = split.bucket_of;
  for (size_t i = 0; i < elements; ++i) plane[i] = *at[bucket_of[i]]++;
}

// Which high planes of a sub delta (`planes`: width planes of `elements` bytes, split from
// `base`) to split by the base's magnitude, decided on a sample (kSplitRuns runs of
// kSplitRun elements spread over the piece): the thresholds cut the sampled magnitude bytes'
// histogram into kSplitBuckets parts of about as many elements; a plane is split where the
// buckets' order-0 entropies, with a table's cost each (kSplitBucketCost), come below the
// plane's by at least kSplitMinSavedBits per byte. The top two planes of fp32 (the lower ones
// are noise) and both of bf16/fp16 are looked at. Measured in docs/engine.md, "Compression".
constexpr size_t kSplitBuckets = 4;
constexpr size_t kSplitMinElements = 16 << 10;
constexpr size_t kSplitRuns = 8;
constexpr size_t kSplitRun = 1024;
constexpr double kSplitBucketCost = 200;  // bytes: a segment header and an entropy coder's table
constexpr double kSplitMinSavedBits = 0.25;
PlaneSplit PlanSplit(uint8_t width, const std::byte* base, const std::byte* planes,
                     size_t elements) {
  PlaneSplit split;
  if (elements < kSplitMinElements || (width != 2 && width != 4)) return split;
  const size_t gap = (elements - kSplitRun) / (kSplitRuns - 1);
  const size_t sampled = kSplitRuns * kSplitRun;
  // The sample's elements, i, with the base element read as U.
  auto for_sample = [&](auto&& f) {
    auto each = [&]<typename U>(U) {
      for (size_t r = 0; r < kSplitRuns; ++r) {
        for (size_t i = r * gap; i < r * gap + kSplitRun; ++i) {
          U v;
          std::memcpy(&v, base + sizeof(U) * i, sizeof(U));
          f(i, MagnitudeOf(v));
        }
      }
    };
    if (width == 4) {
      each(uint32_t{});
    } else {
      each(uint16_t{});
    }
  };
  std::array<uint32_t, 256> magnitudes{};
  for_sample([&](size_t, uint32_t m) { ++magnitudes[m]; });
  // Thresholds where the running count passes each next share of the sample (a byte value
  // that passes several gives one threshold).
  size_t seen = 0, share = 1;
  int found = 0;
  for (int v = 0; v < 255 && found < static_cast<int>(kSplitBuckets) - 1; ++v) {
    seen += magnitudes[v];
    if (seen >= sampled) break;  // no byte above v
    if (seen * kSplitBuckets >= share * sampled) {
      split.thresholds[found++] = static_cast<uint8_t>(v + 1);
      while (seen * kSplitBuckets >= share * sampled) ++share;
    }
  }
  if (found == 0) return split;
  split.buckets = static_cast<uint8_t>(found + 1);
  const SplitThresholds t = ThresholdsOf(split);
  const int first_plane = width == 4 ? 2 : 0;
  std::array<std::array<std::array<uint32_t, 256>, kMaxSplitBuckets>, 2> counts{};
  std::array<uint32_t, kMaxSplitBuckets> in_bucket{};
  const uint8_t* lower = reinterpret_cast<const uint8_t*>(planes) + first_plane * elements;
  const uint8_t* upper = lower + elements;
  for_sample([&](size_t i, uint32_t m) {
    const uint32_t b = BucketOf(m, t);
    ++in_bucket[b];
    ++counts[0][b][lower[i]];
    ++counts[1][b][upper[i]];
  });
  for (int s = 0; s < 2; ++s) {
    std::array<uint32_t, 256> whole{};
    double split_bits = 0;
    for (int b = 0; b < split.buckets; ++b) {
      for (int v = 0; v < 256; ++v) whole[v] += counts[s][b][v];
      if (in_bucket[b] == 0) continue;
      split_bits += std::min(8.0, HistogramEntropyBits(counts[s][b].data())) * in_bucket[b];
    }
    const double whole_bits = std::min(8.0, HistogramEntropyBits(whole.data())) * sampled;
    const double scale = static_cast<double>(elements) / sampled;  // sample to piece, in bytes
    const double saved = (whole_bits - split_bits) / 8 * scale - kSplitBucketCost * split.buckets;
    if (saved >= kSplitMinSavedBits / 8 * static_cast<double>(elements)) {
      split.planes |= static_cast<uint8_t>(1u << (first_plane + s));
    }
  }
  if (split.planes == 0) {
    split.buckets = 0;
    return split;
  }
  thread_local Buffer bucket_ids;
  bucket_ids.Resize(elements);
  BucketElements(width, base, elements, &split, reinterpret_cast<uint8_t*>(bucket_ids.data()));
  return split;
}

// rANS (rans.h) for the planes of deltas only, where it pays for its speed: below
// kRansBelowBits sampled bits per byte a plane's full histogram gives its size and Huffman's,
// and rANS is taken where it stores at least kRansMinSavedBits per byte less than Huffman and
// than the block codec (whichever is smaller). Huffman spends at least a bit per byte and up to
// ~0.5 bit over the entropy on the top planes of deltas (1-2 bits); but rANS decodes a symbol per
// table lookup (~0.8 ns per byte here) where Huffman's table gives up to four and lz4 copies
// runs, so a plane must gain a quarter of a bit per byte for it: on planes that are nearly all
// zeros (a tiny update) it saved ~2% of a small record at a fifth of the decoding speed. Whole
// pieces (the newest version, which a restore reads) keep Huffman; deltas are read only for
// older versions. Chosen by measurement (docs/engine.md, "rANS for the planes of deltas").
constexpr double kRansBelowBits = 4.0;
constexpr double kRansMinSavedBits = 0.25;

// Whether rANS is worth its speed for `segment` (a delta's plane of `bits` sampled bits per byte)
// against the `best` size another coding gave it so far. `counts`: the plane's histogram, taken
// here unless `*counted` (then set).
bool RansPays(Bytes segment, double bits, size_t best, uint32_t counts[256], bool* counted) {
  const double margin = kRansMinSavedBits / 8 * static_cast<double>(segment.size());
  // Cheap refusals first: rANS cannot beat its header, nor, going by the sample at half its
  // word, the plane's entropy.
  if (bits >= kRansBelowBits ||
      static_cast<double>(best) < kRansMinEncodedBytes + bits * segment.size() / 16 + margin) {
    return false;
  }
  if (!*counted) ByteHistogram(segment, counts);
  *counted = true;
  const size_t other = std::min(best, HuffmanEncodedSizeOfCounts(counts));
  return static_cast<double>(RansEncodedSize(counts)) + margin <= static_cast<double>(other);
}

// Whether the block codec is worth running over a whole delta plane (one below
// kTryCodecBelowBits sampled bits per byte), where the zero runs (their size `best`, when they
// took the plane) or rANS are the alternative: its size on kBlockSamples runs of
// kBlockSampleRun bytes spread over the plane, scaled up, must come within kBlockSampleSlack of
// that size (for rANS, plus the margin it has to beat the block codec by: RansPays). On the
// trajectories' deltas lz4 stored 1.1-3.5x what rANS did on such planes and won only on planes
// of tiny updates (nearly all zeros), where it runs as before; it was 21% of encoding the later
// weights' bf16 deltas (docs/engine.md, "Codec speed, round 4"). Without the zero runs `counts`
// gets the plane's histogram (`*counted` set). Planes too small to sample: true.
constexpr size_t kBlockSamples = 4;
constexpr size_t kBlockSampleRun = 8 << 10;
constexpr double kBlockSampleSlack = 1.5;
bool BlockCodecMayPay(const CodecSpec& spec, Bytes segment, size_t best, uint32_t counts[256],
                      bool* counted) {
  const size_t n = segment.size();
  if (n < 4 * kBlockSamples * kBlockSampleRun) return true;
  double other = static_cast<double>(best);
  if (best >= n) {
    ByteHistogram(segment, counts);
    *counted = true;
    other = static_cast<double>(RansEncodedSize(counts)) + kRansMinSavedBits / 8 * n;
  }
  thread_local Buffer out;
  size_t sampled = 0;
  const size_t gap = (n - kBlockSampleRun) / (kBlockSamples - 1);
  for (size_t k = 0; k < kBlockSamples; ++k) {
    Bytes run = segment.subspan(k * gap, kBlockSampleRun);
    sampled += TryCompress(spec, run, &out) ? out.size() : run.size();
  }
  const double scaled = static_cast<double>(sampled) * n / (kBlockSamples * kBlockSampleRun);
  return scaled <= kBlockSampleSlack * other;
}

// Whether the zero runs (zero_runs.h) may take a delta's plane: where at least
// kZeroRunsMinZeros of its sampled bytes are zeros. Below that the runs are short and cost more
// than an order-0 coder; ZeroRunsEncodeTo itself gives up at three quarters.
constexpr double kZeroRunsMinZeros = 0.8;
bool ZeroRunsMayPay(const uint32_t sampled[256], size_t samples) {
  return samples > 0 && sampled[0] >= kZeroRunsMinZeros * static_cast<double>(samples);
}

// Whether the block codec can store less than the zero runs did on a plane of that `shape`.
// Stored raw, the zero runs spend at most two bytes per nonzero byte (its run symbol and itself)
// besides the escapes, which match lz4's length bytes (one per 255 zeros). lz4 spends at least
// three bytes (a token and an offset) on each sequence, and a stretch of nonzero bytes starts a
// new one unless the plane repeats it exactly (the same bytes after the same zeros). Where at most
// a third of the nonzero bytes follow another one, the stretches number at least two thirds of
// them: lz4 needs at least as many bytes as the zero runs, and its samples (BlockCodecMayPay)
// are not taken. On the trajectories' deltas a tenth or fewer follow another (~5% of encoding the
// later bf16 weights' deltas went to those samples); a delta whose changes sit in one run of
// elements has nearly all of them adjacent and keeps the trial.
bool BlockCodecCanBeatZeroRuns(const ZeroRunsShape& shape) {
  return 3 * shape.adjacent > shape.values;
}

// Whether the zero runs' `stored` bytes for a plane of `n` bytes and `bits` sampled bits per
// byte settle it: within kRansMinSavedBits per byte of the sample's entropy, neither rANS nor
// Huffman can store that much less, and neither is run.
bool ZeroRunsSettle(size_t stored, double bits, size_t n) {
  return 8.0 * static_cast<double>(stored) <= (bits + kRansMinSavedBits) * static_cast<double>(n);
}

// Whether rotating each element left by one bit makes the planes of `raw` (width 2 or 4)
// smaller: per plane the order-0 entropy of a sample of the elements, with and without the
// rotation, summed, counting a plane above kRotationRawAboveBits as stored raw (8 bits). It wins
// where the sign is noise and the exponent's last bit is not (weights, exp_avg: the exponent
// plane gains the bit, the raw low plane takes the sign); where the sign is constant
// (exp_avg_sq) the sign costs nothing where it is and the rotation is not used. Measured in
// docs/engine.md, "Compression".
//
// kRotationRawAboveBits is below PutSegment's kRawAboveBits on purpose: rotating an all-positive
// tensor leaves a 7-bit low plane (7 mantissa bits and the constant sign) that PutSegment would
// Huffman-code for 1/8 of the plane, but that decodes at ~1 symbol per table lookup. Counting it
// at 7 bits chose the rotation for Adam's exp_avg_sq: 0.1-0.4% of raw smaller, at fp32 first
// decode 3.2 -> 2.3 GB/s and bf16 2.6 -> 1.7 GB/s per core (noisy: load ~2 on 2 cores).
constexpr double kRotationRawAboveBits = 6.5;
bool RotationPays(Bytes raw, uint8_t width) {
  // The sample: 16 runs of 256 elements spread evenly over the piece (runs rather than single
  // elements: a cache line per sampled element made this cost half as much as Huffman coding).
  constexpr size_t kRuns = 16, kRun = 256;
  const size_t elements = raw.size() / width;
  const size_t gap = elements > kRuns * kRun ? (elements - kRun) / (kRuns - 1) : kRun;
  uint32_t plain[4][256] = {}, rotated[4][256] = {};
  auto count = [&]<typename U>(U v) {
    const U rot = RotateLeft1(v);
    for (size_t j = 0; j < sizeof(U); ++j) {
      ++plain[j][static_cast<uint8_t>(v >> (8 * j))];
      ++rotated[j][static_cast<uint8_t>(rot >> (8 * j))];
    }
  };
  for (size_t run = 0, at = 0; run < kRuns && at < elements; ++run, at += gap) {
    const size_t end = std::min(elements, at + kRun);
    for (size_t i = at; i < end; ++i) {
      if (width == 2) {
        uint16_t v;
        std::memcpy(&v, raw.data() + 2 * i, 2);
        count(v);
      } else {
        uint32_t v;
        std::memcpy(&v, raw.data() + 4 * i, 4);
        count(v);
      }
    }
  }
  auto cost = [&](const uint32_t hist[256]) {
    const double bits = HistogramEntropyBits(hist);
    return bits > kRotationRawAboveBits ? 8.0 : bits;
  };
  double with = 0, without = 0;
  for (int j = 0; j < width; ++j) {
    without += cost(plain[j]);
    with += cost(rotated[j]);
  }
  return with < without;
}

// How a plane is stored: its codec (kNone: raw) and its stored bytes.
struct SegmentCode {
  Codec codec;
  size_t stored;
};

// Chooses how to store `segment`, one plane (`delta`: of a delta, xor or sub, which the zero
// runs and rANS may code). With `body` (room for the segment raw) the stored bytes are written
// there, but for kNone (the caller copies the raw bytes); without, only their size is found, as
// cheaply as the choice allows: the zero runs and the block codec run (their sizes are not known
// otherwise), rANS and Huffman are sized from the histogram.
SegmentCode CodeSegment(const CodecSpec& spec, Bytes segment, bool delta, std::byte* body) {
  const size_t n = segment.size();
  SegmentCode code{Codec::kNone, n};
  if (n == 0) return code;
  thread_local Buffer block, trial;
  // Takes a coder's `size` bytes, at `from` (null: written in body already).
  auto take = [&](Codec codec, size_t size, const std::byte* from) {
    if (body != nullptr && from != nullptr) std::memcpy(body, from, size);
    code = {codec, size};
  };
  if (!spec.entropy) {
    if (TryCompress(spec, segment, &block)) take(spec.codec, block.size(), block.data());
    return code;
  }
  uint32_t sampled[256];
  const size_t samples = SampleHistogram(segment, sampled);
  const double bits = HistogramEntropyBits(sampled);
  if (bits > kRawAboveBits) return code;
  // Long runs (the high planes of deltas): the zero runs and the block codec first, and the
  // entropy coders only where their sizes, known from the histogram before any code is
  // written, are smaller still.
  uint32_t counts[256];
  bool counted = false;
  bool settled = false;  // by the zero runs (ZeroRunsSettle): no rANS, no Huffman
  bool block_may_pay = true;
  if (delta && ZeroRunsMayPay(sampled, samples)) {
    std::byte* dst = body;
    if (dst == nullptr) {
      trial.Resize(n);
      dst = trial.data();
    }
    ZeroRunsShape shape;
    const size_t stored = ZeroRunsEncodeTo(segment, dst, n - 1, &shape);
    if (stored > 0) {
      take(Codec::kZeroRuns, stored, nullptr);
      settled = ZeroRunsSettle(stored, bits, n);
      block_may_pay = BlockCodecCanBeatZeroRuns(shape);
    }
  }
  if (bits < kTryCodecBelowBits && spec.codec != Codec::kNone && block_may_pay &&
      (!delta || BlockCodecMayPay(spec, segment, code.stored, counts, &counted)) &&
      TryCompress(spec, segment, &block) && block.size() < code.stored) {
    take(spec.codec, block.size(), block.data());
  }
  if (settled) return code;
  if (delta && RansPays(segment, bits, code.stored, counts, &counted)) {
    if (body == nullptr) return {Codec::kRans, RansEncodedSize(counts)};
    // The coder writes before it knows whether it fits: not over another coder's bytes.
    std::byte* dst = body;
    if (code.codec != Codec::kNone) {
      trial.Resize(code.stored);
      dst = trial.data();
    }
    const size_t stored = RansEncodeTo(segment, dst, code.stored - 1, counts);
    if (stored > 0) {
      take(Codec::kRans, stored, dst == body ? nullptr : dst);
      return code;
    }
  }
  // Huffman spends at least a bit per byte: not tried where another coder did better.
  if (code.stored > n / 8) {
    const uint32_t* histogram = counted ? counts : nullptr;
    if (body == nullptr) {
      const size_t size =
          histogram ? HuffmanEncodedSizeOfCounts(histogram) : HuffmanEncodedSize(segment);
      if (size < code.stored) code = {Codec::kHuffman, size};
    } else if (const size_t stored = HuffmanEncodeTo(segment, body, code.stored - 1, histogram);
               stored > 0) {
      take(Codec::kHuffman, stored, nullptr);
    }
  }
  return code;
}

// Appends one plane to the container in `out` (whose capacity already holds the segment raw):
// its header (codec, stored length) and its stored bytes (CodeSegment).
void PutSegment(const CodecSpec& spec, Bytes segment, bool delta, Buffer* out) {
  const size_t at = out->size();
  out->Resize(at + kSegmentHeaderBytes + segment.size());  // within the reserved capacity
  std::byte* header = out->data() + at;
  std::byte* body = header + kSegmentHeaderBytes;
  const SegmentCode code = CodeSegment(spec, segment, delta, body);
  if (code.codec == Codec::kNone && !segment.empty()) {
    std::memcpy(body, segment.data(), segment.size());
  }
  header[0] = static_cast<std::byte>(code.codec);
  PutLE<uint32_t>(header + 1, static_cast<uint32_t>(code.stored));
  out->Resize(at + kSegmentHeaderBytes + code.stored);
}

// The size of the container PackSegments would write.
size_t PackedSize(const CodecSpec& spec, uint8_t width, Bytes planes, bool delta) {
  const size_t elements = planes.size() / width;
  size_t total = (width + 1) * kSegmentHeaderBytes + (planes.size() - width * elements);
  for (size_t s = 0; s < width; ++s) {
    total += CodeSegment(spec, planes.subspan(s * elements, elements), delta, nullptr).stored;
  }
  return total;
}

// Compresses each plane (and the tail) of `planes` on its own into a container, opened by the
// segment that records `options`, if any. `delta`: as for PutSegment.
void PackSegments(const CodecSpec& spec, uint8_t width, Bytes planes, bool delta,
                  PlaneOptions options, Buffer* out) {
  const size_t elements = planes.size() / width;
  const float scale = options.scale;
  out->Clear();
  const PlaneSplit& split = options.split;
  out->Reserve(planes.size() + (width + 1) * kSegmentHeaderBytes + kScaleSegmentBytes +
               options.model.SegmentBytes() + split.SegmentBytes() +
               width * kMaxSplitBuckets * kSegmentHeaderBytes);
  if (options.rotated) {
    out->Resize(kSegmentHeaderBytes);
    out->data()[0] = static_cast<std::byte>(kRotatedSegment);
    PutLE<uint32_t>(out->data() + 1, 0);
  } else if (scale != 0) {
    out->Resize(kScaleSegmentBytes);
    out->data()[0] = static_cast<std::byte>(kScaleSegment);
    PutLE<uint32_t>(out->data() + 1, 4);
    uint32_t bits;
    std::memcpy(&bits, &scale, 4);
    PutLE<uint32_t>(out->data() + kSegmentHeaderBytes, bits);
  }
  if (const TopModel& model = options.model; model.period != 0) {
    const size_t at = out->size();
    out->Resize(at + model.SegmentBytes());
    std::byte* p = out->data() + at;
    p[0] = static_cast<std::byte>(kModelSegment);
    PutLE<uint32_t>(p + 1, static_cast<uint32_t>(kModelHeaderBytes + model.terms.size()));
    PutLE<uint32_t>(p + kSegmentHeaderBytes, model.period);
    PutLE<uint32_t>(p + kSegmentHeaderBytes + 4, model.phase);
    std::memcpy(p + kSegmentHeaderBytes + kModelHeaderBytes, model.terms.data(),
                model.terms.size());
  }
  if (split.buckets != 0) {
    const size_t at = out->size();
    out->Resize(at + split.SegmentBytes());
    std::byte* p = out->data() + at;
    p[0] = static_cast<std::byte>(kSplitSegment);
    PutLE<uint32_t>(p + 1, static_cast<uint32_t>(kSplitHeaderBytes + split.buckets - 1));
    p[kSegmentHeaderBytes] = static_cast<std::byte>(split.buckets);
    p[kSegmentHeaderBytes + 1] = static_cast<std::byte>(split.planes);
    std::memcpy(p + kSegmentHeaderBytes + kSplitHeaderBytes, split.thresholds.data(),
                split.buckets - 1);
  }
  for (size_t s = 0; s < width; ++s) {
    Bytes plane = planes.subspan(s * elements, elements);
    if ((split.planes >> s & 1) == 0) {
      PutSegment(spec, plane, delta, out);
      continue;
    }
    thread_local Buffer gathered;
    gathered.Resize(GatheredBytes(split, elements));
    GatherBuckets(split, reinterpret_cast<const uint8_t*>(plane.data()), elements,
                  reinterpret_cast<uint8_t*>(gathered.data()));
    const std::array<size_t, kMaxSplitBuckets> starts = GatheredStarts(split);
    for (size_t b = 0; b < split.buckets; ++b) {
      PutSegment(spec, gathered.bytes().subspan(starts[b], split.counts[b]), delta, out);
    }
  }
  // The tail (< width bytes) as it is.
  CodecSpec raw;
  raw.codec = Codec::kNone;
  raw.entropy = false;
  PutSegment(raw, planes.subspan(width * elements), delta, out);
}

// A segment that is coded: its codec, its stored bytes and where it decodes to.
struct CodedSegment {
  Codec codec;
  Bytes body;
  MutableBytes out;
};

// Reads the segment at `*pos` of `stored` (advancing `*pos`), of `segment.size()` bytes once
// decoded: one stored raw is pointed at where it lies in `stored` (unless `copy`, or fewer than
// `overread` bytes of `stored` follow it: its reader loads that far past its end) and copied
// into `segment` otherwise; one coded is added to `coded`, to be decoded into `segment`. Where
// the bytes will be, into *at.
Status ReadSegment(Bytes stored, size_t* pos, MutableBytes segment, bool copy, size_t overread,
                   std::vector<CodedSegment>* coded, const uint8_t** at) {
  if (stored.size() - *pos < kSegmentHeaderBytes) {
    return Status::Corruption("piece: plane header is truncated");
  }
  const uint8_t codec = static_cast<uint8_t>(stored[*pos]);
  const uint32_t len = GetLE<uint32_t>(stored.data() + *pos + 1);
  *pos += kSegmentHeaderBytes;
  if (codec > static_cast<uint8_t>(Codec::kZeroRuns) || len > stored.size() - *pos) {
    return Status::Corruption("piece: bad plane header");
  }
  Bytes body = stored.subspan(*pos, len);
  *pos += len;
  *at = reinterpret_cast<const uint8_t*>(segment.data());
  if (static_cast<Codec>(codec) != Codec::kNone) {
    coded->push_back({static_cast<Codec>(codec), body, segment});
  } else if (body.size() != segment.size()) {
    return Status::Corruption("piece: plane size mismatch");
  } else if (copy || stored.size() - *pos < overread) {
    if (!body.empty()) std::memcpy(segment.data(), body.data(), body.size());
  } else {
    *at = reinterpret_cast<const uint8_t*>(body.data());
  }
  return Status::OK();
}

// Decodes the coded segments: each rANS-coded one together with Huffman-coded ones of about as
// many symbols (RansDecodeWithHuffman: the two decoders overlap on one core; a delta's high
// planes are mostly rANS-coded and its low planes, or their buckets, Huffman-coded), the others
// one by one. `prefetch` (a delta's base, which the join reads next) is asked for from memory
// while the first Huffman-coded segment decodes: the join waited for it (~75% of a bf16 delta's
// join).
Status DecodeSegments(const std::vector<CodedSegment>& coded, Bytes prefetch) {
  thread_local std::vector<HuffmanInput> huffman;
  huffman.clear();
  for (const CodedSegment& c : coded) {
    if (c.codec == Codec::kHuffman) huffman.push_back({c.body, c.out});
  }
  size_t next = 0;  // the first Huffman input not decoded yet
  for (const CodedSegment& c : coded) {
    if (c.codec == Codec::kRans) {
      const size_t first = next;
      for (size_t symbols = 0; next < huffman.size() && symbols < c.out.size(); ++next) {
        symbols += huffman[next].out.size();
      }
      const std::span<const HuffmanInput> beside(huffman.data() + first, next - first);
      CKPTFS_RETURN_IF_ERROR(RansDecodeWithHuffman(c.body, c.out, beside, prefetch));
      if (!beside.empty()) prefetch = {};
    } else if (c.codec != Codec::kHuffman) {
      CKPTFS_RETURN_IF_ERROR(Decompress(c.codec, c.body, c.out));
    }
  }
  for (; next < huffman.size(); ++next) {
    CKPTFS_RETURN_IF_ERROR(HuffmanDecode(huffman[next].stored, huffman[next].out, prefetch));
    prefetch = {};
  }
  return Status::OK();
}

// Reads the segments of a planes container into `planes`: a plane stored raw is pointed at where
// it lies in `stored`; the others are decoded into `scratch` (raw_len bytes: plane j at
// j * elements, the tail after the planes), and so is plane `copy_plane` even where it is raw
// (the top plane, when the row/column model adds its terms to it in place; -1: none). A plane
// that `split` splits is read as its buckets' segments and put together into `scratch`.
// `prefetch`: as DecodeSegments.
Status UnpackSegments(uint8_t width, Bytes stored, MutableBytes scratch, int copy_plane,
                      const PlaneSplit& split, Bytes prefetch, PlanePointers* planes) {
  const size_t elements = scratch.size() / width;
  // The split planes' buckets, each plane's with 64 bytes after them for ScatterBuckets.
  thread_local Buffer bucket_bytes;
  bucket_bytes.Resize(static_cast<size_t>(std::popcount(split.planes)) * (elements + 64));
  std::array<std::array<const uint8_t*, kMaxSplitBuckets>, kMaxPieceWidth> from{};
  thread_local std::vector<CodedSegment> coded;
  coded.clear();
  size_t pos = 0;
  for (size_t s = 0, split_at = 0; s <= width; ++s) {
    MutableBytes segment =
        s < width ? scratch.subspan(s * elements, elements) : scratch.subspan(width * elements);
    if (s < width && (split.planes >> s & 1) != 0) {
      MutableBytes buckets = bucket_bytes.mutable_bytes().subspan(split_at, elements + 64);
      split_at += elements + 64;
      for (size_t b = 0, at = 0; b < split.buckets; at += split.counts[b], ++b) {
        // ScatterBuckets loads up to 64 bytes past a bucket's bytes: one stored raw is read in
        // place unless it ends within 64 bytes of the record's end.
        CKPTFS_RETURN_IF_ERROR(ReadSegment(stored, &pos, buckets.subspan(at, split.counts[b]),
                                           /*copy=*/false, /*overread=*/64, &coded, &from[s][b]));
      }
      continue;
    }
    CKPTFS_RETURN_IF_ERROR(ReadSegment(stored, &pos, segment, static_cast<int>(s) == copy_plane,
                                       /*overread=*/0, &coded, &(*planes)[s]));
  }
  if (pos != stored.size()) return Status::Corruption("piece: trailing bytes after the planes");
  CKPTFS_RETURN_IF_ERROR(DecodeSegments(coded, prefetch));
  for (size_t s = 0; s < width; ++s) {
    if ((split.planes >> s & 1) == 0) continue;
    uint8_t* plane = reinterpret_cast<uint8_t*>(scratch.data()) + s * elements;
    ScatterBuckets(split, from[s], elements, plane);
    (*planes)[s] = plane;
  }
  return Status::OK();
}

// Splits `raw` into planes transformed with `t` (and the scaled prediction or the rotation that
// `options` asks for).
void SplitWith(Transform t, uint8_t width, Bytes raw, const std::byte* base, PlaneOptions options,
               std::byte* out) {
  SplitAs({.t = t, .width = width, .scale = options.scale, .rotated = options.rotated}, raw, base,
          out);
}

// The stored size of `raw` encoded with `t` (planes container), written into out.
size_t EncodeWith(const CodecSpec& spec, Transform t, uint8_t width, Bytes raw,
                  const std::byte* base, PlaneOptions options, Buffer* scratch, Buffer* out) {
  scratch->Resize(raw.size());
  SplitWith(t, width, raw, base, options, scratch->data());
  if (options.try_model && t == Transform::kPlanes && (width == 2 || width == 4)) {
    const size_t elements = raw.size() / width;
    options.model =
        FitTopModel(reinterpret_cast<uint8_t*>(scratch->data()) + (width - 1) * elements, elements);
  }
  if (options.try_split && t == Transform::kSub && base != nullptr) {
    options.split = PlanSplit(width, base, scratch->data(), raw.size() / width);
  }
  PackSegments(spec, width, scratch->bytes(), IsDelta(t), options, out);
  return out->size();
}

// The stored size of `raw` encoded with `t`, without writing it.
size_t SizeWith(const CodecSpec& spec, Transform t, uint8_t width, Bytes raw, const std::byte* base,
                PlaneOptions options, Buffer* scratch) {
  scratch->Resize(raw.size());
  SplitWith(t, width, raw, base, options, scratch->data());
  return PackedSize(spec, width, scratch->bytes(), IsDelta(t)) + options.PrefixBytes();
}

// Parses the split segment at the start of `stored` (a sub container of `width`) into *split
// (no buckets yet); returns its length.
Result<size_t> ReadSplit(uint8_t width, Bytes stored, PlaneSplit* split) {
  const auto bad = [] { return Status::Corruption("piece: bad split segment"); };
  if ((width != 2 && width != 4) || stored.size() < kSegmentHeaderBytes + kSplitHeaderBytes) {
    return bad();
  }
  const uint32_t len = GetLE<uint32_t>(stored.data() + 1);
  const size_t buckets = static_cast<uint8_t>(stored[kSegmentHeaderBytes]);
  const uint8_t planes = static_cast<uint8_t>(stored[kSegmentHeaderBytes + 1]);
  if (buckets < 2 || buckets > kMaxSplitBuckets || len != kSplitHeaderBytes + buckets - 1 ||
      len > stored.size() - kSegmentHeaderBytes || planes == 0 || (planes >> width) != 0) {
    return bad();
  }
  split->buckets = static_cast<uint8_t>(buckets);
  split->planes = planes;
  for (size_t b = 0; b + 1 < buckets; ++b) {
    const uint8_t t = static_cast<uint8_t>(stored[kSegmentHeaderBytes + kSplitHeaderBytes + b]);
    if (t == 0 || (b > 0 && t <= split->thresholds[b - 1])) return bad();
    split->thresholds[b] = t;
  }
  return kSegmentHeaderBytes + len;
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
  if (spec.codec == Codec::kNone || raw.empty() || (width == 1 && !can_delta)) return plain();
  const std::byte* base_data = can_delta ? base->data() : nullptr;
  thread_local Buffer scratch, trial;  // per worker thread: no fresh memory per piece

  Transform best = Transform::kPlain;
  PlaneOptions options;  // neither scaled prediction nor rotation
  if (spec.entropy && width > 1) {
    // Tensors with the entropy stage: no trials. Measured on real trajectories (docs/engine.md,
    // "Compression"), sub is within 0.1% of the best of plain/planes/xor/sub per piece whenever
    // there is a base, and planes whenever there is none; the size check below still falls back
    // to plain when a piece does not shrink.
    best = can_delta ? Transform::kSub : Transform::kPlanes;
    // fp32, bf16 and fp16 without a base: the elements rotated left by one bit where the
    // sampled plane entropies say it pays (docs/engine.md, "Compression").
    if (!can_delta && (width == 2 || width == 4)) {
      options.rotated = RotationPays(raw, width);
      // And the top plane predicted by its row and column where the bytes show rows.
      options.try_model = true;
    }
    // Deltas of fp32, bf16 and fp16: their high planes split by the base's magnitude where
    // that pays.
    options.try_split = can_delta && (width == 2 || width == 4);
    // fp32 deltas: the base scaled by a per-piece factor where that predicts better (Adam's
    // moments decay between versions), decided on the leading bytes of the piece.
    if (can_delta && width == 4) {
      const float fitted = FitScale(raw, base_data);
      if (fitted != 0) {
        const size_t sample = std::min(raw.size(), kSampleBytes / 2);
        Bytes head = raw.first(sample);
        if (SizeWith(spec, best, width, head, base_data, {.scale = fitted}, &scratch) <
            SizeWith(spec, best, width, head, base_data, {}, &scratch)) {
          options.scale = fitted;
        }
      }
    }
  } else {
    std::vector<Transform> candidates;
    if (width > 1) candidates.push_back(Transform::kPlanes);
    if (can_delta) {
      candidates.push_back(Transform::kXor);
      if (width > 1) candidates.push_back(Transform::kSub);
    }
    // Compare on a sample of whole elements: the leading bytes of the piece.
    const size_t sample = std::min(raw.size(), kSampleBytes / width * width);
    Bytes head = raw.first(sample);
    size_t best_size = PlainSize(spec, head, &trial);
    for (Transform t : candidates) {
      size_t size = SizeWith(spec, t, width, head, base_data, {}, &scratch);
      if (size < best_size) {
        best_size = size;
        best = t;
      }
    }
  }
  if (best == Transform::kPlain) return plain();
  EncodedPiece p;
  p.encoding = {best, width, spec.codec};
  EncodeWith(spec, best, width, raw, base_data, options, &scratch, &p.stored);
  if (p.stored.size() >= raw.size()) return plain();  // the sample misled: never grow
  return p;
}

Buffer EncodePieceAs(const CodecSpec& spec, Bytes raw, Transform t, uint8_t width,
                     const Buffer* base) {
  Buffer scratch, out;
  EncodeWith(spec, t, width, raw, base ? base->data() : nullptr, {}, &scratch, &out);
  return out;
}

Buffer EncodeScaledSub(const CodecSpec& spec, Bytes raw, const Buffer& base, float scale) {
  Buffer scratch, out;
  EncodeWith(spec, Transform::kSub, 4, raw, base.data(), {.scale = scale}, &scratch, &out);
  return out;
}

Buffer EncodeRotatedPlanes(const CodecSpec& spec, Bytes raw, uint8_t width) {
  Buffer scratch, out;
  EncodeWith(spec, Transform::kPlanes, width, raw, nullptr, {.rotated = true}, &scratch, &out);
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
  float scale = 0;
  if (encoding.transform == Transform::kSub && !stored.empty() &&
      static_cast<uint8_t>(stored[0]) == kScaleSegment) {
    if (encoding.width != 4 || stored.size() < kScaleSegmentBytes ||
        GetLE<uint32_t>(stored.data() + 1) != 4) {
      return Status::Corruption("piece: bad prediction segment");
    }
    const uint32_t bits = GetLE<uint32_t>(stored.data() + kSegmentHeaderBytes);
    std::memcpy(&scale, &bits, 4);
    if (!std::isnormal(scale)) return Status::Corruption("piece: bad prediction factor");
    stored = stored.subspan(kScaleSegmentBytes);
  }
  const size_t elements = out.size() / encoding.width;
  PlaneSplit split;
  if (encoding.transform == Transform::kSub && !stored.empty() &&
      static_cast<uint8_t>(stored[0]) == kSplitSegment) {
    CKPTFS_ASSIGN_OR_RETURN(size_t len, ReadSplit(encoding.width, stored, &split));
    thread_local Buffer bucket_ids;
    bucket_ids.Resize(elements);
    BucketElements(encoding.width, base.data(), elements, &split,
                   reinterpret_cast<uint8_t*>(bucket_ids.data()));
    stored = stored.subspan(len);
  }
  bool rotated = false;
  if (encoding.transform == Transform::kPlanes && !stored.empty() &&
      static_cast<uint8_t>(stored[0]) == kRotatedSegment) {
    if ((encoding.width != 2 && encoding.width != 4) || stored.size() < kSegmentHeaderBytes ||
        GetLE<uint32_t>(stored.data() + 1) != 0) {
      return Status::Corruption("piece: bad rotation segment");
    }
    rotated = true;
    stored = stored.subspan(kSegmentHeaderBytes);
  }
  size_t period = 0, phase = 0;
  Bytes terms;
  if (encoding.transform == Transform::kPlanes && !stored.empty() &&
      static_cast<uint8_t>(stored[0]) == kModelSegment) {
    if ((encoding.width != 2 && encoding.width != 4) ||
        stored.size() < kSegmentHeaderBytes + kModelHeaderBytes) {
      return Status::Corruption("piece: bad model segment");
    }
    const uint32_t len = GetLE<uint32_t>(stored.data() + 1);
    period = GetLE<uint32_t>(stored.data() + kSegmentHeaderBytes);
    phase = GetLE<uint32_t>(stored.data() + kSegmentHeaderBytes + 4);
    if (period < 2 || period > elements || phase >= period ||
        len != kModelHeaderBytes + period + ModelRows(elements, period, phase) ||
        len > stored.size() - kSegmentHeaderBytes) {
      return Status::Corruption("piece: bad model segment");
    }
    terms = stored.subspan(kSegmentHeaderBytes + kModelHeaderBytes, len - kModelHeaderBytes);
    stored = stored.subspan(kSegmentHeaderBytes + len);
  }
  thread_local Buffer scratch;  // per thread: no fresh memory per piece
  scratch.Resize(out.size());
  PlanePointers planes{};
  CKPTFS_RETURN_IF_ERROR(UnpackSegments(encoding.width, stored, scratch.mutable_bytes(),
                                        period != 0 ? encoding.width - 1 : -1, split, base,
                                        &planes));
  if (period != 0) {
    ApplyTopModel(reinterpret_cast<uint8_t*>(scratch.data()) + (encoding.width - 1) * elements,
                  elements, period, phase, reinterpret_cast<const uint8_t*>(terms.data()));
  }
  JoinAs({.t = encoding.transform, .width = encoding.width, .scale = scale, .rotated = rotated},
         planes, base.data(), out);
  return Status::OK();
}

}  // namespace ckptfs
