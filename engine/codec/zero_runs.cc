#include "engine/codec/zero_runs.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "engine/codec/huffman.h"
#include "engine/codec/vector_level.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr uint8_t kEscape = 255;          // 255 zeros, no value
constexpr size_t kStreamHeaderBytes = 5;  // mode, LE32 stored length
constexpr size_t kHeaderBytes = 4;        // LE32 run symbols
enum : uint8_t { kRawStream = 0, kHuffmanStream = 1 };

// Writes `in` as a stream (header and bytes) at dst, Huffman-coded where that is smaller.
// Returns the bytes written, or 0 when it does not fit in `capacity`.
size_t PutStream(Bytes in, std::byte* dst, size_t capacity) {
  if (capacity < kStreamHeaderBytes) return 0;
  size_t len = in.size() > 1
                   ? HuffmanEncodeTo(in, dst + kStreamHeaderBytes, capacity - kStreamHeaderBytes)
                   : 0;
  uint8_t mode = kHuffmanStream;
  if (len == 0) {  // Huffman did not shrink it (or did not fit): raw
    if (in.size() > capacity - kStreamHeaderBytes) return 0;
    if (!in.empty()) std::memcpy(dst + kStreamHeaderBytes, in.data(), in.size());
    len = in.size();
    mode = kRawStream;
  }
  dst[0] = static_cast<std::byte>(mode);
  PutLE<uint32_t>(dst + 1, static_cast<uint32_t>(len));
  return kStreamHeaderBytes + len;
}

// Reads the stream at `*pos` of `stored` (advancing it) into `out` (exactly its decoded size).
Status GetStream(Bytes stored, size_t* pos, MutableBytes out) {
  if (stored.size() - *pos < kStreamHeaderBytes) {
    return Status::Corruption("zero runs: stream header is truncated");
  }
  const uint8_t mode = static_cast<uint8_t>(stored[*pos]);
  const uint32_t len = GetLE<uint32_t>(stored.data() + *pos + 1);
  *pos += kStreamHeaderBytes;
  if (len > stored.size() - *pos) return Status::Corruption("zero runs: stream is truncated");
  Bytes body = stored.subspan(*pos, len);
  *pos += len;
  if (mode == kRawStream) {
    if (body.size() != out.size()) return Status::Corruption("zero runs: stream size mismatch");
    if (!out.empty()) std::memcpy(out.data(), body.data(), out.size());
    return Status::OK();
  }
  if (mode != kHuffmanStream) return Status::Corruption("zero runs: unknown stream mode");
  return HuffmanDecode(body, out);
}

// The runs and values of a plane, written as its nonzero bytes are found.
struct RunWriter {
  const uint8_t* p;
  uint8_t* runs;
  uint8_t* values;
  size_t r = 0, v = 0, run_start = 0, adjacent = 0;
  void Put(size_t at) {
    size_t zeros = at - run_start;
    adjacent += zeros == 0;
    for (; zeros >= kEscape; zeros -= kEscape) runs[r++] = kEscape;
    runs[r++] = static_cast<uint8_t>(zeros);
    values[v++] = p[at];
    run_start = at + 1;
  }
  // The nonzero bytes of a block at `at` whose mask has bit k * kStride set for byte k.
  template <int kStride>
  void PutMask(size_t at, uint64_t mask) {
    do {
      Put(at + static_cast<size_t>(std::countr_zero(mask)) / kStride);
      mask &= mask - 1;
    } while (mask != 0);
  }
};

// The values a block scan may write past max_values before it stops.
constexpr size_t kScanBlock = 64;

// Scans p[*at..) in blocks while more than a block is left; false once more than max_values
// nonzero bytes were found. Eight bytes at a time: the words of a sparse plane are mostly all
// zero, and the others are walked by their nonzero bytes (a bit per byte, found without a branch
// per byte).
bool ScanWords(RunWriter& w, size_t n, size_t max_values, size_t* at) {
  size_t i = *at;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, w.p + i, 8);  // little-endian host: byte k is bits 8k..8k+7
    if (word == 0) continue;
    uint64_t nonzero = word | word >> 4;
    nonzero |= nonzero >> 2;
    nonzero |= nonzero >> 1;
    w.PutMask<8>(i, nonzero & 0x0101010101010101u);
    if (w.v > max_values) return false;
  }
  *at = i;
  return true;
}

#if defined(__x86_64__)
// The same, 64 bytes a step (a zero test per byte gives the mask).
CKPTFS_TARGET_AVX512 bool ScanAvx512(RunWriter& w, size_t n, size_t max_values, size_t* at) {
  size_t i = *at;
  for (; i + 64 <= n; i += 64) {
    const __m512i x = _mm512_loadu_si512(w.p + i);
    const uint64_t mask = _mm512_test_epi8_mask(x, x);
    if (mask == 0) continue;
    w.PutMask<1>(i, mask);
    if (w.v > max_values) return false;
  }
  *at = i;
  return true;
}

// The same with two 32-byte compares a step: blocks of 64 bytes, as with AVX-512, keep the
// branch on an all-zero block predictable (on a plane 2.6% nonzero, 32-byte blocks are all zero
// about half the time, 64-byte ones a fifth; docs/engine.md, "Codec speed, round 7").
CKPTFS_TARGET_AVX2 bool ScanAvx2(RunWriter& w, size_t n, size_t max_values, size_t* at) {
  size_t i = *at;
  const __m256i zero = _mm256_setzero_si256();
  for (; i + 64 <= n; i += 64) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.p + i));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.p + i + 32));
    const auto zeros0 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x0, zero)));
    const auto zeros1 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x1, zero)));
    const uint64_t nonzero = ~(uint64_t{zeros1} << 32 | zeros0);
    if (nonzero == 0) continue;
    w.PutMask<1>(i, nonzero);
    if (w.v > max_values) return false;
  }
  *at = i;
  return true;
}
#endif

}  // namespace

size_t ZeroRunsEncodeTo(Bytes in, std::byte* dst, size_t capacity, ZeroRunsShape* shape) {
  const size_t n = in.size();
  if (n == 0 || n > UINT32_MAX || capacity < kHeaderBytes + 2 * kStreamHeaderBytes) return 0;
  const size_t max_values = n / 4;
  thread_local Buffer runs_buf, values_buf;
  // A scan stops within a block of passing max_values: room for a block's values more, and for
  // one run symbol per value plus one escape per 255 zeros.
  runs_buf.Resize(max_values + kScanBlock + n / kEscape + 1);
  values_buf.Resize(max_values + kScanBlock);
  RunWriter w{reinterpret_cast<const uint8_t*>(in.data()),
              reinterpret_cast<uint8_t*>(runs_buf.data()),
              reinterpret_cast<uint8_t*>(values_buf.data())};
  size_t i = 0;
  bool sparse = true;
#if defined(__x86_64__)
  if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx512) {
    sparse = ScanAvx512(w, n, max_values, &i);
  } else if (CodecVectorLevelInUse() >= CodecVectorLevel::kAvx2) {
    sparse = ScanAvx2(w, n, max_values, &i);
  }
#endif
  if (sparse) sparse = ScanWords(w, n, max_values, &i);
  for (; sparse && i < n; ++i) {
    if (w.p[i] != 0) w.Put(i);
  }
  if (!sparse || w.v > max_values) return 0;
  // The zeros after the last value are implied.
  PutLE<uint32_t>(dst, static_cast<uint32_t>(w.r));
  size_t at = kHeaderBytes;
  const size_t runs_len = PutStream(Bytes(runs_buf.data(), w.r), dst + at, capacity - at);
  if (runs_len == 0) return 0;
  at += runs_len;
  const size_t values_len = PutStream(Bytes(values_buf.data(), w.v), dst + at, capacity - at);
  if (values_len == 0) return 0;
  if (shape != nullptr) *shape = {.values = w.v, .adjacent = w.adjacent};
  return at + values_len;
}

Status ZeroRunsDecode(Bytes stored, MutableBytes out) {
  const size_t n = out.size();
  if (stored.size() < kHeaderBytes) return Status::Corruption("zero runs: header is truncated");
  const uint32_t r = GetLE<uint32_t>(stored.data());
  if (r > n) return Status::Corruption("zero runs: more runs than bytes");
  thread_local Buffer runs_buf, values_buf;
  runs_buf.Resize(r);
  size_t pos = kHeaderBytes;
  CKPTFS_RETURN_IF_ERROR(GetStream(stored, &pos, runs_buf.mutable_bytes()));
  const auto* runs = reinterpret_cast<const uint8_t*>(runs_buf.data());
  const size_t v = static_cast<size_t>(r - std::count(runs, runs + r, kEscape));
  values_buf.Resize(v);
  CKPTFS_RETURN_IF_ERROR(GetStream(stored, &pos, values_buf.mutable_bytes()));
  if (pos != stored.size()) return Status::Corruption("zero runs: trailing bytes");
  const auto* values = reinterpret_cast<const uint8_t*>(values_buf.data());
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  if (n > 0) std::memset(o, 0, n);
  size_t at = 0, k = 0;
  for (size_t j = 0; j < r; ++j) {
    at += runs[j];
    if (runs[j] == kEscape) continue;
    if (at >= n) return Status::Corruption("zero runs: runs run past the plane");
    o[at++] = values[k++];
  }
  if (at > n) return Status::Corruption("zero runs: runs run past the plane");
  return Status::OK();
}

}  // namespace ckptfs
