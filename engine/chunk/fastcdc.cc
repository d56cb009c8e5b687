#include "engine/chunk/fastcdc.h"

#include <array>
#include <bit>
#include <string>

namespace ckptfs {
namespace {

constexpr std::array<uint64_t, 256> MakeGearTable() {
  std::array<uint64_t, 256> table{};
  uint64_t state = 0x636b707466732d31ULL;  // "ckptfs-1"; splitmix64
  for (auto& entry : table) {
    state += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    entry = z ^ (z >> 31);
  }
  return table;
}
constexpr std::array<uint64_t, 256> kGear = MakeGearTable();

// The gear hash shifts left, so its top bits depend on the most recent 64 bytes: masks take
// their bits from the top.
constexpr uint64_t TopBits(int n) { return n <= 0 ? 0 : ~uint64_t{0} << (64 - n); }

}  // namespace

Status FastCdc::Validate(const Params& p) {
  if (p.min_size < 64 || p.min_size >= p.avg_size || p.avg_size >= p.max_size ||
      !std::has_single_bit(p.avg_size)) {
    return Status::InvalidArgument(
        "chunk sizes must satisfy 64 <= min < avg < max with avg a power of two (got min=" +
        std::to_string(p.min_size) + " avg=" + std::to_string(p.avg_size) +
        " max=" + std::to_string(p.max_size) + ")");
  }
  return Status::OK();
}

FastCdc::FastCdc(const Params& params) : params_(params) {
  int bits = std::countr_zero(params.avg_size);
  mask_small_ = TopBits(bits + 2);
  mask_large_ = TopBits(bits - 2);
}

size_t FastCdc::Scan(Bytes data) {
  if (at_cut_) Reset();
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t n = data.size();
  size_t i = 0;
  // Bytes before min_size can never end a chunk: skip them without hashing.
  if (pos_ < params_.min_size) {
    size_t skip = std::min(n, params_.min_size - pos_);
    i = skip;
    pos_ += skip;
  }
  uint64_t h = hash_;
  size_t pos = pos_;
  // Phase 1: up to the normal size, with the harder mask.
  size_t end1 = std::min(n, i + (pos < params_.avg_size ? params_.avg_size - pos : 0));
  for (; i < end1; ++i, ++pos) {
    h = (h << 1) + kGear[p[i]];
    if ((h & mask_small_) == 0) {
      hash_ = h;
      pos_ = pos + 1;
      at_cut_ = true;
      return i + 1;
    }
  }
  // Phase 2: up to max_size, with the easier mask.
  size_t end2 = std::min(n, i + (pos < params_.max_size ? params_.max_size - pos : 0));
  for (; i < end2; ++i, ++pos) {
    h = (h << 1) + kGear[p[i]];
    if ((h & mask_large_) == 0) {
      hash_ = h;
      pos_ = pos + 1;
      at_cut_ = true;
      return i + 1;
    }
  }
  hash_ = h;
  pos_ = pos;
  at_cut_ = pos_ >= params_.max_size;
  return i;
}

}  // namespace ckptfs
