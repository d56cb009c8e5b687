#include "engine/store/chunk_reader.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <tuple>

#include "engine/codec/piece_codec.h"

namespace ckptfs {
namespace {

std::string Where(uint32_t pack_id, uint64_t offset) {
  return "pack " + PackFileName(pack_id) + " offset " + std::to_string(offset);
}

// Chains longer than any configuration allows are corruption (or a cycle).
constexpr int kMaxDecodeDepth = 255;

// Reads exactly header.size() + payload.size() bytes at offset into the two spans (one
// preadv, repeated only for short reads). End of file is Corruption. The caller names the
// file in the message (only on error: building a path per read showed in profiles).
Status PReadTwo(int fd, uint64_t offset, MutableBytes header, MutableBytes payload) {
  size_t done = 0;
  const size_t total = header.size() + payload.size();
  while (done < total) {
    iovec iov[2];
    int n_iov = 0;
    if (done < header.size()) {
      iov[n_iov++] = {header.data() + done, header.size() - done};
      iov[n_iov++] = {payload.data(), payload.size()};
    } else {
      const size_t in_payload = done - header.size();
      iov[n_iov++] = {payload.data() + in_payload, payload.size() - in_payload};
    }
    ssize_t n = ::preadv(fd, iov, n_iov, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read");
    }
    if (n == 0) {
      return Status::Corruption("unexpected end of file at " + std::to_string(offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

// Whether every page of [offset, offset + length) is in the page cache; NotSupported where
// the kernel cannot tell.
Result<bool> AllCached(int fd, uint64_t offset, uint64_t length) {
  CKPTFS_ASSIGN_OR_RETURN(uint64_t cached, PageCacheBytes(fd, offset, length));
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = (offset + length - 1) / page - offset / page + 1;
  return cached >= pages * page;
}

// Reads the record at [offset, offset + header.size() + payload's size) with O_DIRECT: the
// aligned blocks around it into one aligned buffer, which becomes *payload (its bytes() the
// payload, no copy), the header copied out. End of file is Corruption; EINVAL (the filesystem
// wants another alignment) is returned as it is, for the caller to fall back.
Status PReadDirect(int fd, uint64_t offset, MutableBytes header, size_t payload_size,
                   Buffer* payload) {
  const uint64_t end = offset + header.size() + payload_size;
  const uint64_t begin = AlignDownForDirectIo(offset);
  const uint64_t block_end = AlignUpForDirectIo(end);
  Buffer block = Buffer::InAlignedBlock(kDirectIoAlignment, block_end - begin,
                                        offset - begin + header.size(), payload_size);
  MutableBytes blocks = block.block();
  const uint64_t need = end - begin;
  uint64_t done = 0;
  while (done < need) {
    if (done % kDirectIoAlignment != 0) {  // a short read ended at the end of the file
      return Status::Corruption("unexpected end of file at " + std::to_string(begin + done));
    }
    ssize_t n =
        ::pread(fd, blocks.data() + done, blocks.size() - done, static_cast<off_t>(begin + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read");
    }
    if (n == 0) {
      return Status::Corruption("unexpected end of file at " + std::to_string(begin + done));
    }
    done += static_cast<uint64_t>(n);
  }
  std::memcpy(header.data(), blocks.data() + (offset - begin), header.size());
  *payload = std::move(block);
  return Status::OK();
}

}  // namespace

std::filesystem::path ChunkReader::PackPath(uint32_t pack_id) const {
  return packs_dir_ / PackFileName(pack_id);
}

void ChunkReader::WillNeed(std::vector<ChunkRow> rows) const {
  if (remote_) {
    std::vector<RecordRange> remote;
    std::erase_if(rows, [&](const ChunkRow& row) {
      if (!remote_->Holds(row.pack_id, row.offset, row.length)) return false;
      remote.push_back({row.pack_id, row.offset, row.length});
      return true;
    });
    if (!remote.empty()) remote_->WillNeed(std::move(remote));
  }
  std::sort(rows.begin(), rows.end(), [](const ChunkRow& a, const ChunkRow& b) {
    return std::tie(a.pack_id, a.offset) < std::tie(b.pack_id, b.offset);
  });
  size_t i = 0;
  while (i < rows.size()) {
    const uint32_t pack = rows[i].pack_id;
    uint64_t begin = rows[i].offset, end = rows[i].offset + rows[i].length;
    size_t j = i + 1;
    for (; j < rows.size() && rows[j].pack_id == pack && rows[j].offset <= end + kReadaheadGap;
         ++j) {
      end = std::max(end, rows[j].offset + rows[j].length);
    }
    auto file = OpenPack(pack);
    if (file.ok() && !ReadsDirectly(**file)) {
      // In steps: the kernel reads at most max(read_ahead_kb, max_sectors_kb) of the device per
      // call (force_page_cache_ra), 128 KiB on many disks, and drops the rest of a longer range.
      for (uint64_t at = begin; at < end; at += kAdviseStep) {
        (void)::posix_fadvise((*file)->fd.get(), static_cast<off_t>(at),
                              static_cast<off_t>(std::min(kAdviseStep, end - at)),
                              POSIX_FADV_WILLNEED);
      }
    }
    i = j;
  }
}

Result<std::shared_ptr<const ChunkReader::PackFile>> ChunkReader::OpenPack(uint32_t pack_id) const {
  MutexLock lock(fd_mu_);
  auto it = fds_.find(pack_id);
  if (it != fds_.end()) return it->second;
  auto file = std::make_shared<PackFile>();
  CKPTFS_ASSIGN_OR_RETURN(file->fd, OpenFile(PackPath(pack_id), O_RDONLY));
  if (direct_.load(std::memory_order_relaxed)) {
    auto direct = OpenFile(PackPath(pack_id), O_RDONLY | O_DIRECT);
    if (direct.ok()) {
      file->direct = std::move(*direct);
    } else {
      spdlog::debug("{}: no direct reads ({}); reading through the page cache",
                    PackPath(pack_id).string(), direct.status().ToString());
    }
  }
  fds_[pack_id] = file;
  return std::shared_ptr<const PackFile>(std::move(file));
}

Status ChunkReader::ReadLocal(const PackFile& pack, const ChunkRow& row, MutableBytes header,
                              Buffer* payload) const {
  if (ReadsDirectly(pack)) {
    auto cached = AllCached(pack.fd.get(), row.offset, row.length);
    if (!cached.ok()) {
      spdlog::info("direct reads off: the kernel cannot tell what is in the page cache ({})",
                   cached.status().ToString());
      direct_.store(false, std::memory_order_relaxed);
    } else if (!*cached) {
      Status s =
          PReadDirect(pack.direct.get(), row.offset, header, row.length - header.size(), payload);
      if (s.ok()) {
        direct_reads_.fetch_add(1, std::memory_order_relaxed);
        return s;
      }
      if (s.ToErrno() != EINVAL) return s;
      spdlog::info(
          "direct reads off: {} refused an aligned O_DIRECT read; reading through the "
          "page cache",
          PackPath(row.pack_id).string());
      direct_.store(false, std::memory_order_relaxed);
    }
  }
  *payload = Buffer(row.length - header.size());
  return PReadTwo(pack.fd.get(), row.offset, header, payload->mutable_bytes());
}

void ChunkReader::ForgetPack(uint32_t pack_id) {
  MutexLock lock(fd_mu_);
  fds_.erase(pack_id);
}

Result<CheckedRecord> ChunkReader::ReadRecord(const ChunkId& id, const ChunkRow& row) const {
  // Error messages only: not built for every read.
  auto where = [&] { return Where(row.pack_id, row.offset); };
  if (row.length < kRecordHeaderBytes) {
    return Status::Corruption(where() + ": catalog row has an impossible record length");
  }
  std::byte header_bytes[kRecordHeaderBytes];
  CheckedRecord record;
  Status s;
  if (remote_ && remote_->Holds(row.pack_id, row.offset, row.length)) {
    record.payload = Buffer(row.length - kRecordHeaderBytes);
    s = remote_->Read(row.pack_id, row.offset, MutableBytes(header_bytes, kRecordHeaderBytes),
                      record.payload.mutable_bytes());
    if (!s.ok()) {
      return s.IsCorruption() ? Status::Corruption(where() + ": " + s.message()) : s;
    }
  } else {
    CKPTFS_ASSIGN_OR_RETURN(auto pack, OpenPack(row.pack_id));
    s = ReadLocal(*pack, row, MutableBytes(header_bytes, kRecordHeaderBytes), &record.payload);
  }
  if (!s.ok()) {
    const std::string path = PackPath(row.pack_id).string();
    return s.IsCorruption() ? Status::Corruption(where() + ": read " + path + ": " + s.message())
                            : Status::FromErrno(s.ToErrno(), "read " + path);
  }
  read_bytes_.fetch_add(row.length, std::memory_order_relaxed);
  reads_.fetch_add(1, std::memory_order_relaxed);
  auto header = RecordHeader::Decode(Bytes(header_bytes, kRecordHeaderBytes));
  if (!header.ok()) return Status::Corruption(where() + ": " + header.status().message());
  record.header = *header;
  const Bytes payload = record.payload.bytes();
  if (header->id != id || header->raw_len != row.raw_len || header->stored_len != payload.size() ||
      header->codec != row.codec) {
    return Status::Corruption(where() + ": record does not match the catalog (chunk " +
                              id.ShortHex() + ")");
  }
  if (Checksum64(payload) != header->payload_checksum || header->payload_checksum != row.checksum) {
    return Status::Corruption(where() + ": checksum mismatch in chunk " + id.ShortHex());
  }
  return record;
}

ChunkReader::LoadResult ChunkReader::LoadChained(const ChunkId& id, const ChunkRow& row,
                                                 const DecodeChain* chain, CacheMode mode,
                                                 bool* decoded_here) const {
  const bool streamed = mode == CacheMode::kStream;
  if (decoded_here != nullptr) *decoded_here = false;
  if (auto hit = cache_->Lookup(id, streamed)) return hit;
  std::promise<LoadResult> promise;
  std::shared_future<LoadResult> pending;
  {
    MutexLock lock(loading_mu_);
    auto it = loading_.find(id);
    if (it != loading_.end()) {
      pending = it->second;
    } else {
      loading_.emplace(id, promise.get_future().share());
    }
  }
  auto decode = [&]() -> LoadResult {
    if (decoded_here != nullptr) *decoded_here = true;
    CKPTFS_ASSIGN_OR_RETURN(Buffer raw, DecodeChained(id, row, chain, mode));
    auto chunk = std::make_shared<const Buffer>(std::move(raw));
    cache_->Insert(id, chunk, streamed);
    return chunk;
  };
  if (pending.valid()) {
    LoadResult joined = pending.get();
    // The other load may have used a location gc has moved since: try ours before failing.
    if (joined.ok()) {
      if (!streamed) cache_->Insert(id, *joined);  // an ordinary entry from now on
      return joined;
    }
    return decode();
  }
  // The load that just finished may have inserted it after our lookup and before we
  // registered: look again rather than decode it twice.
  LoadResult result = [&]() -> LoadResult {
    if (auto hit = cache_->Lookup(id, streamed)) return hit;
    return decode();
  }();
  promise.set_value(result);
  MutexLock lock(loading_mu_);
  loading_.erase(id);
  return result;
}

Result<Buffer> ChunkReader::DecodeChained(const ChunkId& id, const ChunkRow& row,
                                          const DecodeChain* chain, CacheMode mode) const {
  const std::string where = Where(row.pack_id, row.offset);
  // A delta's base first (its id is in the row; the record must name the same), so that
  // a chain holds one record at a time, not one per level.
  std::shared_ptr<const Buffer> base;
  if (IsDelta(row.transform)) {
    const ChunkId& base_id = row.base;
    const int depth = chain ? chain->depth + 1 : 1;
    bool cycle = base_id == id;
    for (const DecodeChain* c = chain; c != nullptr && !cycle; c = c->outer) {
      cycle = *c->id == base_id;
    }
    if (cycle || depth >= kMaxDecodeDepth) {
      return Status::Corruption(where + ": the delta base of chunk " + id.ShortHex() +
                                " is inconsistent (cycle or chain too long)");
    }
    std::optional<ChunkRow> base_row;
    {
      CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
      CKPTFS_ASSIGN_OR_RETURN(base_row, txn.GetChunk(base_id));
    }
    if (!base_row) {
      return Status::Corruption(where + ": the delta base " + base_id.ShortHex() + " of chunk " +
                                id.ShortHex() + " is missing; run `ckptfs verify`");
    }
    const DecodeChain link{&id, chain, depth};
    if (mode == CacheMode::kStream) {
      // Only this chunk needs its bases: use a cached one, else rebuild it uncached.
      base = cache_->Lookup(base_id, /*streamed=*/true);
      if (!base) {
        CKPTFS_ASSIGN_OR_RETURN(Buffer raw, DecodeChained(base_id, *base_row, &link, mode));
        base = std::make_shared<const Buffer>(std::move(raw));
      }
    } else {
      CKPTFS_ASSIGN_OR_RETURN(base, LoadChained(base_id, *base_row, &link, mode));
    }
  }
  return DecodeRecord(id, row, base.get());
}

Result<Buffer> ChunkReader::DecodeWithBase(const ChunkId& id, const ChunkRow& row,
                                           const Buffer& base) const {
  if (!IsDelta(row.transform) || base.size() == 0) {
    return Status::InvalidArgument("DecodeWithBase: chunk " + id.ShortHex() +
                                   " is not a delta, or its base is empty");
  }
  return DecodeRecord(id, row, &base);
}

Result<Buffer> ChunkReader::DecodeRecord(const ChunkId& id, const ChunkRow& row,
                                         const Buffer* base) const {
  const std::string where = Where(row.pack_id, row.offset);
  CKPTFS_ASSIGN_OR_RETURN(CheckedRecord record, ReadRecord(id, row));
  const RecordHeader& header = record.header;
  if (header.transform() != row.transform ||
      (row.transform != Transform::kPlain && header.width() != row.width)) {
    return Status::Corruption(where + ": record encoding does not match the catalog");
  }
  if (header.transform() == Transform::kPlain && header.codec == Codec::kNone) {
    // Stored as it is: the payload is the chunk (its length was checked against raw_len).
    if (record.payload.size() != row.raw_len) {
      return Status::Corruption(where + ": a raw record's length differs from its chunk's");
    }
    return std::move(record.payload);
  }
  const PieceEncoding encoding{header.transform(), header.width(), header.codec};
  auto body = SplitRecordPayload(header, record.payload.bytes());
  if (!body.ok()) return Status::Corruption(where + ": " + body.status().message());
  if (body->base.has_value() != (base != nullptr) || (body->base && *body->base != row.base)) {
    return Status::Corruption(where + ": the delta base of chunk " + id.ShortHex() +
                              " differs from the catalog's");
  }
  Buffer raw(row.raw_len);
  Status s =
      DecodePiece(encoding, body->encoded, base ? base->bytes() : Bytes{}, raw.mutable_bytes());
  if (!s.ok()) return Status::Corruption(where + ": " + s.message());
  return raw;
}

}  // namespace ckptfs
