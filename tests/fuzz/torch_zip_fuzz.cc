// libFuzzer target for TorchZipCutter (engine/format/torch_zip.h): any input, split any way
// (1-byte pieces over a 1 KiB window, random pieces of 1-64 bytes), must give the same cuts as
// when fed whole, and every Scan must keep the cutter's contract.
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/format/torch_zip.h"

namespace {

using ckptfs::Bytes;
using ckptfs::TorchZipCutter;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "torch_zip_fuzz: %s\n", what);
  std::abort();
}

// Cuts of `data` fed in pieces of next_piece() bytes.
template <typename NextPiece>
std::vector<uint64_t> Cuts(Bytes data, NextPiece next_piece) {
  TorchZipCutter zip;
  std::vector<uint64_t> cuts;
  bool was_done = false;
  while (!data.empty()) {
    size_t piece = next_piece();
    Bytes in = data.first(piece < data.size() ? piece : data.size());
    data = data.subspan(in.size());
    while (!in.empty()) {
      const uint64_t before = zip.offset();
      const size_t n = zip.Scan(in);
      Check(n > 0 && n <= in.size(), "Scan consumed nothing or too much");
      Check(zip.offset() == before + n, "offset() does not count the bytes consumed");
      in = in.subspan(n);
      if (zip.AtCut()) {
        Check(!was_done, "a cut after done()");
        Check(zip.cut() <= zip.offset(), "a cut ahead of the stream");
        Check(zip.offset() - zip.cut() <= TorchZipCutter::kMaxCutLag, "a cut learned too late");
        Check(cuts.empty() || zip.cut() > cuts.back(), "cuts not increasing");
        cuts.push_back(zip.cut());
      }
      was_done = zip.done();
    }
  }
  return cuts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Bytes input(reinterpret_cast<const std::byte*>(data), size);
  const std::vector<uint64_t> whole = Cuts(input, [&] { return size + 1; });
  // 1-byte pieces over a window of kByteWindow bytes (all of a smaller input; elsewhere the
  // window's place follows the input's size), one piece before and one after it. Fed byte by
  // byte whole, a 32 KiB input cost 32 768 Scan calls, each moving the cutter's kept tail:
  // 75% of the target's time (perf, 2026-12-04; a 4 KiB window still 70%).
  constexpr size_t kByteWindow = 1024;
  const size_t window_at =
      size <= kByteWindow ? 0 : static_cast<size_t>((size * 0x9e3779b9ULL) % (size - kByteWindow));
  size_t fed = 0;
  auto byte_window = [&] {
    const size_t piece = fed < window_at                 ? window_at - fed
                         : fed < window_at + kByteWindow ? 1
                                                         : size - fed;
    fed += piece;
    return piece;
  };
  Check(Cuts(input, byte_window) == whole, "1-byte pieces cut differently");
  // Pseudo-random piece sizes from 1 to 64 bytes, seeded by the input's size.
  uint64_t state = size * 0x9e3779b97f4a7c15ULL + 1;
  auto random_piece = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<size_t>(1 + state % 64);
  };
  Check(Cuts(input, random_piece) == whole, "random pieces cut differently");
  return 0;
}
