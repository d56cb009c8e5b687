// engine/chunk/fastcdc.h
//
// FastCDC content-defined chunking (Xia et al., USENIX ATC'16), streaming: bytes arrive in
// pieces of any size and cut points depend only on content, so an insertion or a change
// moves only the boundaries near it. Gear rolling hash, normalised chunking (level 2), and
// no cut before min_size or after max_size.
//
//   FastCdc cdc(FastCdc::Params{});
//   while (!data.empty()) {
//     size_t n = cdc.Scan(data);         // bytes of data that belong to the current chunk
//     current.Append(data.first(n));
//     if (cdc.AtCut()) EmitChunk(current);
//     data = data.subspan(n);
//   }
//
// The gear table is fixed (derived from a constant seed): changing it changes every boundary
// and so loses dedup against data stored before. Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

class FastCdc {
 public:
  // Defaults chosen by measurement on multi-GB checkpoints; see docs/engine.md.
  struct Params {
    size_t min_size = 64 << 10;
    size_t avg_size = 256 << 10;  // a power of two
    size_t max_size = 1 << 20;
  };
  // Returns InvalidArgument unless 64 <= min < avg < max and avg is a power of two.
  static Status Validate(const Params& params);

  // REQUIRES: Validate(params).ok()
  explicit FastCdc(const Params& params);

  // Consumes bytes of `data` up to and including the next cut point, or all of it when no cut
  // falls inside. Returns how many bytes it consumed; AtCut() tells which case it was.
  size_t Scan(Bytes data);
  // True when the last Scan ended the current chunk; the next Scan starts a new one.
  bool AtCut() const { return at_cut_; }
  // Bytes of the current (unfinished) chunk scanned so far.
  size_t pending() const { return pos_; }
  // Forgets the current chunk (the caller cut it itself).
  void Reset() {
    pos_ = 0;
    hash_ = 0;
    at_cut_ = false;
  }
  const Params& params() const { return params_; }

 private:
  Params params_;
  uint64_t mask_small_;  // before avg_size: more bits, cuts less likely
  uint64_t mask_large_;  // after avg_size: fewer bits, cuts more likely
  size_t pos_ = 0;
  uint64_t hash_ = 0;
  bool at_cut_ = false;
};

}  // namespace ckptfs
