#include "engine/format/zip.h"

#include <algorithm>

namespace ckptfs {
namespace {

uint64_t Le(std::string_view s, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}
void Put(std::string& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

Result<std::string> ReadAt(const ZipReadAt& read, uint64_t offset, uint64_t n) {
  return ReadExact(read, offset, n, "zip");
}

}  // namespace

Result<std::vector<ZipDirEntry>> ReadZipDirectory(const ZipReadAt& read, uint64_t size) {
  using namespace zip;
  const uint64_t tail_len = std::min<uint64_t>(size, 65535 + kEndBytes);
  CKPTFS_ASSIGN_OR_RETURN(std::string tail, ReadAt(read, size - tail_len, tail_len));
  size_t eocd = std::string::npos;
  for (size_t i = tail.size() >= kEndBytes ? tail.size() - kEndBytes + 1 : 0; i-- > 0;) {
    if (Le(tail, i, 4) == kEndSignature) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) return Status::Corruption("zip: no end of central directory");
  uint64_t count = Le(tail, eocd + 10, 2), cd_size = Le(tail, eocd + 12, 4),
           cd_offset = Le(tail, eocd + 16, 4);
  const uint64_t eocd_abs = size - tail_len + eocd;
  if (count == kEscape16 || cd_size == kEscape32 || cd_offset == kEscape32) {
    if (eocd_abs < kZip64LocatorBytes) return Status::Corruption("zip: no zip64 locator");
    CKPTFS_ASSIGN_OR_RETURN(std::string loc,
                            ReadAt(read, eocd_abs - kZip64LocatorBytes, kZip64LocatorBytes));
    if (Le(loc, 0, 4) != kZip64LocatorSignature) {
      return Status::Corruption("zip: no zip64 locator");
    }
    const uint64_t at = Le(loc, 8, 8);
    if (at > size || size - at < kZip64EndBytes) {
      return Status::Corruption("zip: bad zip64 record offset");
    }
    CKPTFS_ASSIGN_OR_RETURN(std::string z, ReadAt(read, at, kZip64EndBytes));
    if (Le(z, 0, 4) != kZip64EndSignature) return Status::Corruption("zip: bad zip64 record");
    count = Le(z, 32, 8);
    cd_size = Le(z, 40, 8);
    cd_offset = Le(z, 48, 8);
  }
  if (cd_size > kMaxZipDirectoryBytes || cd_offset > size || cd_size > size - cd_offset ||
      count > cd_size / kCentralHeaderBytes) {
    return Status::Corruption("zip: bad central directory");
  }
  CKPTFS_ASSIGN_OR_RETURN(std::string cd, ReadAt(read, cd_offset, cd_size));
  std::vector<ZipDirEntry> entries;
  size_t p = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (p + kCentralHeaderBytes > cd.size() || Le(cd, p, 4) != kCentralHeaderSignature) {
      return Status::Corruption("zip: bad central directory entry");
    }
    const uint64_t flags = Le(cd, p + 8, 2), method = Le(cd, p + 10, 2);
    ZipDirEntry e;
    e.crc = static_cast<uint32_t>(Le(cd, p + 16, 4));
    uint64_t comp = Le(cd, p + 20, 4), uncomp = Le(cd, p + 24, 4);
    const size_t nlen = Le(cd, p + 28, 2), xlen = Le(cd, p + 30, 2), clen = Le(cd, p + 32, 2);
    e.local_offset = Le(cd, p + 42, 4);
    const size_t name_at = p + kCentralHeaderBytes;
    if (name_at + nlen + xlen + clen > cd.size()) {
      return Status::Corruption("zip: entry overflows");
    }
    e.name = cd.substr(name_at, nlen);
    // The zip64 extra field holds the fields that are 0xFFFFFFFF, in this order.
    const size_t extra_end = name_at + nlen + xlen;
    for (size_t x = name_at + nlen; x + 4 <= extra_end;) {
      const uint64_t id = Le(cd, x, 2), len = Le(cd, x + 2, 2);
      if (x + 4 + len > extra_end) break;
      if (id == kExtraZip64) {
        size_t f = x + 4;
        for (uint64_t* v : {&uncomp, &comp, &e.local_offset}) {
          if (*v == kEscape32 && f + 8 <= x + 4 + len) {
            *v = Le(cd, f, 8);
            f += 8;
          }
        }
      }
      x += 4 + len;
    }
    if (method != 0 || (flags & kFlagEncrypted) || comp != uncomp) {
      return Status::NotSupported("zip: compressed or encrypted entry");
    }
    e.size = uncomp;
    if (e.local_offset > size || e.size > size) {
      return Status::Corruption("zip: entry past the end");
    }
    entries.push_back(std::move(e));
    p = extra_end + clen;
  }
  std::sort(entries.begin(), entries.end(), [](const ZipDirEntry& a, const ZipDirEntry& b) {
    return a.local_offset < b.local_offset;
  });
  return entries;
}

Result<uint64_t> ReadZipDataOffset(const ZipReadAt& read, uint64_t local_offset) {
  CKPTFS_ASSIGN_OR_RETURN(std::string lh, ReadAt(read, local_offset, zip::kLocalHeaderBytes));
  if (Le(lh, 0, 4) != zip::kLocalHeaderSignature) {
    return Status::Corruption("zip: bad local header");
  }
  return local_offset + zip::kLocalHeaderBytes + Le(lh, 26, 2) + Le(lh, 28, 2);
}

void ZipWriter::SetLastCrc(uint32_t crc) {
  constexpr size_t kCentralCrcOffset = 16;
  for (size_t i = 0; i < 4; ++i) {
    central_[last_central_ + kCentralCrcOffset + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  }
}

std::string ZipWriter::LocalHeader(std::string_view name, uint64_t size, uint32_t crc,
                                   uint64_t offset) {
  using namespace zip;
  const bool big = size >= kEscape32;
  std::string extra;
  if (big) {
    Put(extra, kExtraZip64, 2);
    Put(extra, 16, 2);
    Put(extra, size, 8);
    Put(extra, size, 8);
  }
  const uint64_t base = offset + kLocalHeaderBytes + name.size() + extra.size() + 4;
  const uint64_t pad = (64 - base % 64) % 64;
  Put(extra, 0x4246, 2);  // "FB"
  Put(extra, pad, 2);
  extra.append(static_cast<size_t>(pad), 'Z');
  std::string lh;
  Put(lh, kLocalHeaderSignature, 4);
  Put(lh, big ? 45 : 20, 2);
  Put(lh, 0, 2);  // flags: sizes and CRC are in this header
  Put(lh, 0, 2);  // stored
  Put(lh, 0, 4);  // time, date
  Put(lh, crc, 4);
  Put(lh, big ? kEscape32 : size, 4);
  Put(lh, big ? kEscape32 : size, 4);
  Put(lh, name.size(), 2);
  Put(lh, extra.size(), 2);
  lh += name;
  lh += extra;

  // Its central directory entry.
  const bool far = offset >= kEscape32;
  std::string x64;
  if (big || far) {
    Put(x64, kExtraZip64, 2);
    Put(x64, (big ? 16 : 0) + (far ? 8 : 0), 2);
    if (big) {
      Put(x64, size, 8);
      Put(x64, size, 8);
    }
    if (far) Put(x64, offset, 8);
    any_zip64_ = true;
  }
  std::string& cd = central_;
  last_central_ = cd.size();
  Put(cd, kCentralHeaderSignature, 4);
  Put(cd, 45, 2);  // made by
  Put(cd, (big || far) ? 45 : 20, 2);
  Put(cd, 0, 2);
  Put(cd, 0, 2);
  Put(cd, 0, 4);
  Put(cd, crc, 4);
  Put(cd, big ? kEscape32 : size, 4);
  Put(cd, big ? kEscape32 : size, 4);
  Put(cd, name.size(), 2);
  Put(cd, x64.size(), 2);
  Put(cd, 0, 2);  // comment
  Put(cd, 0, 2);  // disk
  Put(cd, 0, 2);  // internal attributes
  Put(cd, 0, 4);  // external attributes
  Put(cd, far ? kEscape32 : offset, 4);
  cd += name;
  cd += x64;
  ++entries_;
  return lh;
}

std::string ZipWriter::Finish(uint64_t offset) const {
  using namespace zip;
  std::string cd = central_;
  const uint64_t cd_size = cd.size(), n = entries_;
  const bool zip64 = any_zip64_ || offset >= kEscape32 || n >= kEscape16;
  if (zip64) {
    const uint64_t at = offset + cd_size;
    Put(cd, kZip64EndSignature, 4);
    Put(cd, kZip64EndBytes - 12, 8);  // size of the rest of the record
    Put(cd, 45, 2);
    Put(cd, 45, 2);
    Put(cd, 0, 4);
    Put(cd, 0, 4);
    Put(cd, n, 8);
    Put(cd, n, 8);
    Put(cd, cd_size, 8);
    Put(cd, offset, 8);
    Put(cd, kZip64LocatorSignature, 4);
    Put(cd, 0, 4);
    Put(cd, at, 8);
    Put(cd, 1, 4);
  }
  Put(cd, kEndSignature, 4);
  Put(cd, 0, 2);
  Put(cd, 0, 2);
  Put(cd, zip64 ? kEscape16 : n, 2);
  Put(cd, zip64 ? kEscape16 : n, 2);
  Put(cd, zip64 ? kEscape32 : cd_size, 4);
  Put(cd, zip64 ? kEscape32 : offset, 4);
  Put(cd, 0, 2);
  return cd;
}

}  // namespace ckptfs
