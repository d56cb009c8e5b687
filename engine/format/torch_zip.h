// engine/format/torch_zip.h
//
// Finds where the records of a torch.save file (a ZIP archive of stored, uncompressed
// entries: data.pkl, one entry per tensor storage, version) start and end, as the file streams
// past, so that chunks can end exactly at tensor boundaries: a changed tensor then never shares
// a chunk with an unchanged neighbour.
//
//   TorchZipCutter zip;
//   while (!data.empty()) {
//     size_t n = zip.Scan(data);  // up to the byte at which a cut became known
//     Chunk(data.first(n));        // FastCDC
//     if (zip.AtCut()) EndChunkAt(zip.cut());
//     data = data.subspan(n);
//   }
//
// It reads each ZIP local file header (signature, 30-byte fixed part, name, extra field) and
// reports two cuts per entry: where its data starts and where it ends (one for an empty entry).
// Entries must be stored (method 0) and not encrypted. The data's size comes from the header, from
// its ZIP64 extra field (sizes 0xFFFFFFFF), or, with general-purpose flag bit 3, from the data
// descriptor that follows the data: torch (miniz) writes every non-empty entry that way, with zero
// sizes in the header and a 16-byte descriptor (24 bytes when the header has a ZIP64 extra field,
// i.e. for entries of 4 GiB or more or at offsets of 4 GiB or more). Such an entry's end is found
// by looking for a descriptor whose sizes equal the bytes since the data started (signature
// required), so its cut is learned only once the descriptor has been read: at most kMaxCutLag
// bytes after the offset it names.
//
// At the central directory, or at anything it does not understand (another signature, a
// compressed or encrypted entry, an oversized extra field, input that is not a ZIP at all), it
// stops for good: done() is true and no cut follows. Input is untrusted: any bytes, split
// anywhere, give the same cuts, each cut is greater than the one before, every Scan of a
// non-empty span consumes at least one byte, and memory is this object (headers only, no data
// is buffered). Thread-compatible.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/util/buffer.h"

namespace ckptfs {

class TorchZipCutter {
 public:
  // A cut is learned at most this many bytes after the offset it names (0 for data starts and
  // for ends known from the header; the descriptor's length for ends that follow one).
  static constexpr size_t kMaxCutLag = 24;
  // A local header whose extra field is longer than this is not understood (torch writes a
  // padding field of at most 68 bytes, plus 20 or 28 for ZIP64).
  static constexpr size_t kMaxExtraBytes = 1024;
  // Entry names longer than this are not kept.
  static constexpr size_t kMaxNameBytes = 1024;

  // Consumes bytes of `data` up to and including the one at which the next cut becomes known,
  // or all of it. Returns how many; AtCut() tells which case it was.
  size_t Scan(Bytes data);
  // True when the last Scan ended where a cut became known.
  bool AtCut() const { return at_cut_; }
  // REQUIRES: AtCut(). Stream offset at which a chunk should end (offset() - kMaxCutLag <=
  // cut() <= offset()).
  uint64_t cut() const { return cut_; }
  // REQUIRES: AtCut(). Whether the cut is where an entry's data starts (else where it ends).
  bool cut_is_start() const { return cut_is_start_; }
  // REQUIRES: AtCut(). The name of the entry the cut belongs to ("" when longer than
  // kMaxNameBytes).
  const std::string& entry_name() const { return name_; }
  // Bytes consumed so far.
  uint64_t offset() const { return offset_; }
  // True once the stream has started with a local file header signature.
  bool recognized() const { return recognized_; }
  // True once no further cut can come (central directory, or bytes it does not understand).
  bool done() const { return state_ == State::kDone; }

 private:
  enum class State {
    kHeader,         // the 30-byte fixed part of a local file header
    kName,           // the file name (skipped)
    kExtra,          // the extra field
    kSizedData,      // data of a known size
    kDescribedData,  // data followed by a data descriptor
    kDone,
  };
  size_t ScanHeader(Bytes data);
  size_t ScanName(Bytes data);
  size_t ScanExtra(Bytes data);
  size_t ScanSizedData(Bytes data);
  size_t ScanDescribedData(Bytes data);
  void EndFixedHeader();
  void EndName();
  void EndHeader();
  // Whether `window` (descriptor_bytes_ long) is a data descriptor for data starting at
  // data_start_ and ending at `at`.
  bool IsDescriptor(const std::byte* window, uint64_t at) const;
  void KeepTail(Bytes data);
  void StartHeader();
  void Report(uint64_t cut, bool start);

  State state_ = State::kHeader;
  uint64_t offset_ = 0;
  bool recognized_ = false;
  bool at_cut_ = false;
  uint64_t cut_ = 0;
  uint64_t last_cut_ = 0;
  bool cut_is_start_ = false;
  std::string name_;
  bool name_too_long_ = false;

  // The local header being read.
  std::array<std::byte, 30> fixed_;
  size_t fixed_len_ = 0;
  size_t name_left_ = 0;
  std::array<std::byte, kMaxExtraBytes> extra_;
  size_t extra_size_ = 0;
  size_t extra_len_ = 0;

  // The data being skipped.
  uint64_t data_start_ = 0;
  uint64_t data_left_ = 0;                      // kSizedData
  size_t descriptor_bytes_ = 0;                 // kDescribedData: 16, or 24 with ZIP64 sizes
  std::array<std::byte, kMaxCutLag - 1> tail_;  // last bytes of data: a descriptor may start there
  size_t tail_len_ = 0;
};

}  // namespace ckptfs
