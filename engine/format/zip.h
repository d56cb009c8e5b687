// engine/format/zip.h
//
// The ZIP format as torch.save writes it: stored (uncompressed) entries, ZIP64 records when an
// entry, an offset or the entry count outgrows 32/16 bits. The one home of ZIP signatures and
// record layouts in ckptfs: TorchZipCutter (torch_zip.h) finds entry boundaries in a stream,
// ReadZipDirectory reads an archive's central directory, ZipWriter writes one (the precision
// view builds its converted archive with it).
//
// Input is untrusted: every length and offset read is checked against the archive's size, the
// central directory is bounded (kMaxZipDirectoryBytes), and anything else is Corruption, or
// NotSupported for valid ZIP features torch never writes (compression, encryption).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/util/read_at.h"
#include "engine/util/status.h"

namespace ckptfs {

namespace zip {
inline constexpr uint32_t kLocalHeaderSignature = 0x04034b50;    // "PK\3\4"
inline constexpr uint32_t kDescriptorSignature = 0x08074b50;     // "PK\7\10"
inline constexpr uint32_t kCentralHeaderSignature = 0x02014b50;  // "PK\1\2"
inline constexpr uint32_t kEndSignature = 0x06054b50;            // "PK\5\6"
inline constexpr uint32_t kZip64EndSignature = 0x06064b50;       // "PK\6\6"
inline constexpr uint32_t kZip64LocatorSignature = 0x07064b50;   // "PK\6\7"
inline constexpr size_t kLocalHeaderBytes = 30;                  // before name and extra
inline constexpr size_t kCentralHeaderBytes = 46;                // before name, extra, comment
inline constexpr size_t kEndBytes = 22;                          // without its comment
inline constexpr size_t kZip64EndBytes = 56;
inline constexpr size_t kZip64LocatorBytes = 20;
inline constexpr uint16_t kExtraZip64 = 0x0001;
inline constexpr uint32_t kEscape32 = 0xFFFFFFFF;  // "the value is in the ZIP64 field"
inline constexpr uint16_t kEscape16 = 0xFFFF;
inline constexpr uint16_t kFlagEncrypted = 1 << 0;
inline constexpr uint16_t kFlagDescriptor = 1 << 3;
inline constexpr uint16_t kFlagStrongEncryption = 1 << 6;
inline constexpr uint16_t kFlagMaskedHeader = 1 << 13;
}  // namespace zip

// Reads the archive's bytes (engine/util/read_at.h).
using ZipReadAt = ReadAtFn;

// A central directory bigger than this is refused (torch writes ~100 bytes per tensor).
inline constexpr uint64_t kMaxZipDirectoryBytes = 64u << 20;

struct ZipDirEntry {
  std::string name;
  uint32_t crc = 0;
  uint64_t size = 0;          // stored == uncompressed
  uint64_t local_offset = 0;  // of its local header
};

// The entries of the archive of `size` bytes, in the order of their local headers. Compressed
// or encrypted entries are NotSupported.
Result<std::vector<ZipDirEntry>> ReadZipDirectory(const ZipReadAt& read, uint64_t size);

// Where the data of the entry whose local header is at `local_offset` starts (read from that
// header; Corruption if it is not one).
Result<uint64_t> ReadZipDataOffset(const ZipReadAt& read, uint64_t local_offset);

// Writes an archive of stored entries, with their data aligned to 64 bytes as torch writes it
// (a padding extra field, id "FB"). The caller places each entry's data right after the header
// it got, then appends Finish() at the end:
//
//   ZipWriter w;
//   for (entry : entries) { out += w.LocalHeader(name, size, crc, out.size()); out += data; }
//   out += w.Finish(out.size());
class ZipWriter {
 public:
  // The local header of an entry that starts at archive offset `offset`; remembers its central
  // directory entry.
  std::string LocalHeader(std::string_view name, uint64_t size, uint32_t crc, uint64_t offset);
  // For a writer that learns an entry's CRC-32 while it streams the data: records `crc` for the
  // last entry LocalHeader() made, whose local header must then get the same 4 bytes
  // (little-endian) at kLocalHeaderCrcOffset.
  static constexpr size_t kLocalHeaderCrcOffset = 14;
  void SetLastCrc(uint32_t crc);
  // The central directory and end records, placed at `offset` (just after the last data).
  std::string Finish(uint64_t offset) const;

 private:
  std::string central_;
  size_t last_central_ = 0;  // where the last entry's central header starts
  uint64_t entries_ = 0;
  bool any_zip64_ = false;
};

}  // namespace ckptfs
