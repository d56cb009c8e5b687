// engine/store/chunk_reader.h
//
// Store's read side: reads chunk records from pack files, checks them against their catalog
// rows, decodes them (following delta chains down to a whole record) and loads each chunk once
// however many readers ask for it at the same time. The Store owns one; gc and verify use it
// for their record reads.
//
//   ChunkReader reader(dir / "packs", &catalog, &cache);
//   CKPTFS_ASSIGN_OR_RETURN(auto chunk, reader.Load(id, row));   // shared, cached
//   CKPTFS_ASSIGN_OR_RETURN(Buffer raw, reader.Decode(id, row)); // owned, not cached
//
// Guarantees:
// - A record's header is checked (magic, version, header checksum), must match the catalog
//   row (id, lengths, codec, encoding) and its payload's XXH3-64 must match both header and
//   row; any mismatch, and any delta base that is missing, inconsistent or cyclic, is
//   Status::Corruption naming pack and offset. Never wrong bytes.
// - A record stored raw (codec none, plain) is read straight into the buffer that is returned:
//   no copy after the read.
// - Direct reads (DirectReads::kWhereUncached; StoreOptions::direct_reads, off by default): a
//   record whose bytes are not all in the page cache (cachestat(2)) is read with O_DIRECT,
//   from the disk into the record's buffer, with no page-cache pages allocated, filled and
//   copied out, and none evicted from other files; a cached record (just written, re-encoded,
//   read again) is read from the page cache as before. Where the kernel or the filesystem
//   offers neither cachestat nor O_DIRECT, every read goes through the page cache.
// - A delta's base is rebuilt before its own record is read, so a load holds at most one
//   record, the base and the result at a time, however long the chain.
// - Load is single-flight: a second caller for a chunk being decoded waits for that decode.
// - Pack file descriptors are opened once and kept until ForgetPack.
// - Records a RemoteRecords source holds (remote_records.h: a store whose packs are in a
//   bucket) are read from it instead of the pack file, and checked the same way.
// REQUIRES (callers): the row's location stays valid during the call (the Store holds its gc
// lock shared, or the row is pinned). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/store/catalog.h"
#include "engine/store/chunk_cache.h"
#include "engine/store/record.h"
#include "engine/store/remote_records.h"
#include "engine/util/buffer.h"
#include "engine/util/file.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs {

// A record read from its pack and checked against its row.
struct CheckedRecord {
  RecordHeader header;
  Buffer payload;  // the stored bytes that follow the header
};

// Bytes of a decoded chunk, shared: the chunk stays alive while the slice does, so a reply can
// be sent from it without a copy.
struct ChunkSlice {
  std::shared_ptr<const Buffer> chunk;
  size_t offset = 0;  // within the chunk
  size_t length = 0;
  ChunkId id;
  uint64_t content_end = 0;  // where the chunk ends in its content
  Bytes bytes() const { return chunk->bytes().subspan(offset, length); }
  bool reaches_chunk_end() const { return offset + length == chunk->size(); }
};

class ChunkReader {
 public:
  // How records that are not in the page cache are read (see Guarantees).
  enum class DirectReads : uint8_t { kOff, kWhereUncached };
  // REQUIRES: catalog and cache outlive the reader. `remote` (may be null): where the records
  // it holds are read from.
  ChunkReader(std::filesystem::path packs_dir, const Catalog* catalog, ChunkCache* cache,
              std::shared_ptr<const RemoteRecords> remote = nullptr,
              DirectReads direct = DirectReads::kOff)
      : packs_dir_(std::move(packs_dir)),
        catalog_(catalog),
        cache_(cache),
        remote_(std::move(remote)),
        direct_(direct == DirectReads::kWhereUncached) {}
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  // How a loaded chunk enters the cache.
  enum class CacheMode : uint8_t {
    kKeep,    // an ordinary entry; the delta bases it needs are cached too
    kStream,  // a sequential reader's: a streamed entry (chunk_cache.h), which the reader drops
              // once it has read past it; delta bases are decoded but not cached
  };
  // The decoded chunk, from the cache or its pack (once, however many ask at the same time).
  // `decoded_here` (may be null) is set when this call decoded it itself: it was neither cached
  // nor being loaded by another caller (the prefetcher).
  Result<std::shared_ptr<const Buffer>> Load(const ChunkId& id, const ChunkRow& row,
                                             CacheMode mode = CacheMode::kKeep,
                                             bool* decoded_here = nullptr) const {
    return LoadChained(id, row, nullptr, mode, decoded_here);
  }
  // The raw bytes of a chunk (bases from the cache or their packs), owned and not cached.
  Result<Buffer> Decode(const ChunkId& id, const ChunkRow& row) const {
    return DecodeChained(id, row, nullptr, CacheMode::kKeep);
  }
  // A delta chunk decoded against its base's bytes, which the caller already holds (the
  // re-encoder, which decodes the base anyway): the base is not read again.
  // REQUIRES: `base` is the decoded chunk row.base.
  Result<Buffer> DecodeWithBase(const ChunkId& id, const ChunkRow& row, const Buffer& base) const;
  // Reads a record and checks it against `row` (header, lengths, codec, payload checksum).
  Result<CheckedRecord> ReadRecord(const ChunkId& id, const ChunkRow& row) const;

  // Asks the kernel to start reading these records' bytes from their packs now
  // (POSIX_FADV_WILLNEED over runs of adjacent records, coalesced across gaps up to
  // kReadaheadGap), so that the loads that follow find them in the page cache: one large
  // asynchronous read instead of one small synchronous pread per record. Advisory: errors are
  // ignored (the loads report them). Records a remote source holds go to its WillNeed. With
  // direct reads nothing is advised for local packs: their loads read uncached records from
  // the disk themselves, and pages read ahead would only be copied out again.
  void WillNeed(std::vector<ChunkRow> rows) const;
  static constexpr uint64_t kReadaheadGap = 256 << 10;
  // One posix_fadvise call covers at most this much (the kernel's per-call limit can be as low
  // as 128 KiB; a longer range is cut there, not read).
  static constexpr uint64_t kAdviseStep = 128 << 10;

  // Closes the cached descriptor of a pack (before it is deleted).
  void ForgetPack(uint32_t pack_id);

  // Bytes (and records) read from pack files so far: what readers cost the disk; and the
  // records among them read with O_DIRECT.
  uint64_t read_bytes() const { return read_bytes_.load(std::memory_order_relaxed); }
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }
  uint64_t direct_reads() const { return direct_reads_.load(std::memory_order_relaxed); }

 private:
  // The chunks being rebuilt by one read, innermost last: a base that is already on it is a
  // cycle (a corrupted catalog), which must fail rather than wait for itself.
  struct DecodeChain {
    const ChunkId* id;
    const DecodeChain* outer;
    int depth;
  };
  using LoadResult = Result<std::shared_ptr<const Buffer>>;

  LoadResult LoadChained(const ChunkId& id, const ChunkRow& row, const DecodeChain* chain,
                         CacheMode mode, bool* decoded_here = nullptr) const;
  Result<Buffer> DecodeChained(const ChunkId& id, const ChunkRow& row, const DecodeChain* chain,
                               CacheMode mode) const;
  // The record of `row` decoded; `base` is the decoded base of a delta (else null).
  Result<Buffer> DecodeRecord(const ChunkId& id, const ChunkRow& row, const Buffer* base) const;
  // A pack's descriptors: `direct` (O_DIRECT) is invalid where direct reads are off or the
  // filesystem refuses them.
  struct PackFile {
    FileDescriptor fd;
    FileDescriptor direct;
  };
  Result<std::shared_ptr<const PackFile>> OpenPack(uint32_t pack_id) const;
  // Whether uncached records of `pack` are read with O_DIRECT (its descriptor opened, and
  // direct reads not turned off since).
  bool ReadsDirectly(const PackFile& pack) const {
    return pack.direct.valid() && direct_.load(std::memory_order_relaxed);
  }
  // Reads the record at row's location from `pack`: with O_DIRECT where its bytes are not all
  // in the page cache (and direct reads work), else through the page cache.
  Status ReadLocal(const PackFile& pack, const ChunkRow& row, MutableBytes header,
                   Buffer* payload) const;
  std::filesystem::path PackPath(uint32_t pack_id) const;

  const std::filesystem::path packs_dir_;
  const Catalog* const catalog_;
  ChunkCache* const cache_;
  const std::shared_ptr<const RemoteRecords> remote_;
  // Chunks being decoded: a second reader (or the prefetcher) waits for the first.
  mutable Mutex loading_mu_;
  mutable std::unordered_map<ChunkId, std::shared_future<LoadResult>> loading_
      GUARDED_BY(loading_mu_);
  mutable std::atomic<uint64_t> read_bytes_{0};
  mutable std::atomic<uint64_t> reads_{0};
  mutable std::atomic<uint64_t> direct_reads_{0};
  // Cleared for good when the kernel lacks cachestat or a direct read fails with EINVAL.
  mutable std::atomic<bool> direct_;
  mutable Mutex fd_mu_;
  mutable std::unordered_map<uint32_t, std::shared_ptr<const PackFile>> fds_ GUARDED_BY(fd_mu_);
};

}  // namespace ckptfs
