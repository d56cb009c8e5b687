// engine/store/store.h
//
// A content-addressed chunk store in one directory:
//
//   STORE/ckptfs.json   format version and the store's fixed parameters (chunking)
//   STORE/LOCK          held (flock) by the one process that has the store open
//   STORE/catalog/      LMDB environment: every piece of metadata (see catalog.h)
//   STORE/packs/        append-only pack files of chunk records (see record.h)
//
//   auto store = Store::Open("/data/ckpt", StoreOptions{});
//   auto writer = (*store)->NewWriter();
//   CKPTFS_RETURN_IF_ERROR(writer->Append(bytes));
//   CKPTFS_ASSIGN_OR_RETURN(ContentId id, writer->Finish());
//   CKPTFS_ASSIGN_OR_RETURN(size_t n, (*store)->Read(id, offset, out));
//
// Guarantees:
// - Identical chunks (by SHA-256) are stored once, across contents.
// - A content is visible once Finish() returns, and is then durable: its records were synced
//   before the catalog transaction that references them committed. After a crash the store
//   opens with every committed content intact; uncommitted pack tails are cut.
// - Every record is checksummed; a mismatch reads as Status::Corruption, never as wrong bytes.
// - Deltas: a writer given the previous version's content (ContentWriter::SetReference) stores
//   a changed tensor piece as a delta against the same piece there when that is smaller
//   (codec/piece_codec.h). A chunk is rebuilt from at most max_delta_chain records; a delta
//   holds a reference on its base, so releasing the base's content keeps the delta readable.
// - Memory: the decoded-chunk cache (cache_bytes) plus the write pipeline (inflight_bytes, with
//   backpressure) plus per-content chunk lists; independent of content sizes.
// Thread-safe: any number of writers and readers; Gc() may run concurrently with both.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/chunk/fastcdc.h"
#include "engine/codec/codec.h"
#include "engine/format/layout.h"
#include "engine/store/catalog.h"
#include "engine/store/chunk_cache.h"
#include "engine/store/chunk_reader.h"
#include "engine/store/pack_writer.h"
#include "engine/store/read_progress.h"
#include "engine/util/file.h"
#include "engine/util/mutex.h"
#include "engine/util/progress.h"
#include "engine/util/status.h"
#include "engine/util/worker_pool.h"

namespace ckptfs {

class ContentWriter;

// 2: records and chunk rows may be deltas / byte planes. A store of format 1 opens only with
// StoreOptions::upgrade_format (`ckptfs upgrade STORE`), which rewrites its ckptfs.json.
inline constexpr uint32_t kStoreFormatVersion = 2;

struct StoreOptions {
  bool create_if_missing = true;
  // An older store's format is upgraded in place only when this is set; otherwise Open fails
  // with NotSupported naming `ckptfs upgrade` (a format change is never silent).
  bool upgrade_format = false;
  // How new records are compressed. Unset: as recorded in the store's ckptfs.json ("codec"),
  // or the default CodecSpec ("auto") for a new store or one that recorded none. A new store
  // records the codec it was created with; a codec given for an existing store applies to the
  // records written while it is open and is not recorded (records name their own codec, so
  // reads never depend on it).
  std::optional<CodecSpec> codec;
  FastCdc::Params chunking;  // used when creating a store; fixed afterwards
  // Also end chunks where the records of a torch.save zip start and end (format/torch_zip.h),
  // so that a changed tensor shares no chunk with an unchanged one. Changing it changes
  // boundaries, and so dedup against contents stored with the other setting, nothing else.
  bool format_aware_chunking = true;
  // Tensors are cut into pieces of this size (at most chunking.max_size), counted from the
  // tensor's first byte, so that a piece lines up with the same piece of the previous version.
  size_t tensor_piece_bytes = 1u << 20;
  // A chunk is rebuilt from at most this many records (a full one and deltas on top of it);
  // 1 disables deltas. Bounds the read cost of a delta-encoded version.
  uint32_t max_delta_chain = 8;
  uint64_t pack_target_bytes = 256ull << 20;
  size_t cache_bytes = 256u << 20;  // decoded-chunk cache
  // Bytes queued for hashing/compression, all writers, and records queued for their pack
  // write (a quarter of it, at most 16 MiB, is the pack writer's queue).
  size_t inflight_bytes = 64u << 20;
  int worker_threads = 0;  // 0: one per CPU
  // Disk space held back so that versions can still be deleted (and gc run) on a full disk
  // (catalog.h, space_reserve.h). 0: none.
  uint64_t space_reserve_bytes = 32ull << 20;
  bool use_io_uring = true;
  // Records not in the page cache are read with O_DIRECT (chunk_reader.h): a restore costs no
  // page-cache copy and evicts nothing. Off by default: each direct read allocates a fresh
  // aligned block, which glibc maps and the kernel faults in and zeroes (3x the daemon's minor
  // faults on a cold cp), so that it cost as much CPU as it saved and cold cp ran slower here
  // (docs/engine.md "Read path"). false: every record read goes through the page cache.
  bool direct_reads = false;
  // Reverse deltas (reencode.cc, docs/engine.md "Read path"): after a content commits, a
  // background thread stores its delta pieces whole and re-encodes their bases as deltas
  // against them, so that the newest version decodes one record per piece. false: forward
  // deltas only (the newest version decodes up to max_delta_chain records per piece).
  bool reverse_deltas = true;
  // With reverse deltas: every piece the writer stores whole is written raw, and the
  // re-encoder compresses it behind the writer (reencode.cc), so that a save pays chunking and
  // hashing but no encoding; the store reaches its compressed size once the re-encoder caught
  // up (`ckptfs sync` waits for it). false: whole pieces are encoded as they are written.
  bool compress_behind = true;
  // Pieces smaller than this are encoded as they are written even with compress_behind: a raw
  // record punched out after its compression leaves the blocks it shares with its live
  // neighbours allocated (~4 KiB per record), which is 0.4% of a 1 MiB piece but 3% of the
  // small tensors of a pretrained model (storage.sh), and small pieces cost the writer little.
  uint64_t compress_behind_min_bytes = 1u << 20;
  // Raw bytes the re-encoder re-encodes per catalog transaction, at most.
  uint64_t reencode_batch_bytes = 64u << 20;
  // Where records that are not on local disk are read from (remote_records.h): set for a
  // store whose packs are in a bucket and whose cache holds only part of them. Null: every
  // record is in the local packs.
  std::shared_ptr<const RemoteRecords> remote_records;
  // Test hook (crash tests): runs after the re-encoder's new records are synced, before the
  // catalog transaction that points the rows at them.
  std::function<void()> before_reencode_commit;
};

struct StoreStats {
  uint64_t contents = 0;
  uint64_t logical_bytes = 0;  // sum of content sizes
  uint64_t chunks = 0;         // distinct chunks
  uint64_t chunk_bytes = 0;    // raw bytes of distinct chunks
  uint64_t record_bytes = 0;   // stored bytes of those chunks' records
  uint64_t pack_bytes = 0;     // pack files on disk (allocated: holes gc punched not counted)
  uint64_t packs = 0;
  uint64_t chunks_by_transform[4] = {};  // indexed by Transform: plain, planes, xor, sub
  uint32_t max_depth = 0;                // the longest delta chain
};

// How one content's chunks are encoded (Store::DescribeContent).
struct ContentEncoding {
  uint64_t chunks = 0;
  uint64_t raw_bytes = 0;
  uint64_t record_bytes = 0;  // stored bytes of its chunks' records (shared ones counted too)
  uint64_t chunks_by_transform[4] = {};
  uint32_t max_depth = 0;  // records decoded for the worst chunk
};

struct GcOptions {
  // Packs whose live fraction is below this are rewritten (live records copied, pack deleted).
  double rewrite_below = 0.5;
  // Test hook: runs after each record gc copies.
  std::function<void()> after_record_copied;
  // The bytes of live records gc has copied out of the packs it rewrites, of all it will
  // copy (the step that takes time); not called when there is nothing to copy.
  ProgressFn progress;
};

struct GcReport {
  uint64_t chunks_dropped = 0;
  uint64_t packs_deleted = 0;
  uint64_t records_moved = 0;
  uint64_t deltas_rematerialized = 0;  // deltas stored whole again: their bases went
  uint64_t pack_bytes_punched = 0;     // dead records' blocks given back in place (holes)
  uint64_t pack_bytes_before = 0;
  uint64_t pack_bytes_after = 0;
  std::vector<std::string> skipped;  // packs left alone, and why
};

struct VerifyReport {
  uint64_t chunks_checked = 0;
  uint64_t contents_checked = 0;
  std::vector<std::string> problems;  // each names where ("pack 000003 offset 4096: ...")
  // The chunks whose bytes cannot be read back (damaged or missing record, wrong SHA-256, a
  // delta whose base is gone), each with its problem: the namespace maps them to the files
  // and byte ranges that hold them (admin.cc, `ckptfs verify`).
  std::vector<std::pair<ChunkId, std::string>> damaged;
  bool ok() const { return problems.empty(); }
};

class Store {
 public:
  // Opens the store in `dir` (creating it if allowed), recovering from any crash: pack tails
  // past their committed length are cut, packs no commit refers to are deleted.
  // Fails with Busy when another process has it open, NotSupported for a newer format.
  static Result<std::unique_ptr<Store>> Open(const std::filesystem::path& dir,
                                             const StoreOptions& options);
  // The format recorded in dir's ckptfs.json, without opening the store (NotFound: no store).
  static Result<uint32_t> ReadFormat(const std::filesystem::path& dir);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // A new streaming writer. The store must outlive it.
  std::unique_ptr<ContentWriter> NewWriter();
  // A writer whose content starts with the bytes of `base` (see ContentWriter).
  Result<std::unique_ptr<ContentWriter>> NewAppender(ContentId base);

  Result<ContentRow> StatContent(ContentId id) const;
  // The tensor layout learned when the content was written (format/layout.h), if any.
  Result<std::optional<ContentLayout>> GetLayout(ContentId id) const;
  // The most recent content whose layout has `signature` (LayoutSignature), among the last
  // `max_scan` content ids: a delta reference for a file that has no same-named predecessor
  // (Lightning's epoch=N-step=M.ckpt, ckpt_{step}.pt loops, copies). nullopt when none.
  Result<std::optional<ContentId>> FindContentByLayout(uint64_t signature,
                                                       uint64_t max_scan = 256) const;
  Result<ContentEncoding> DescribeContent(ContentId id) const;
  // Reads up to out.size() bytes at offset; returns the count (short only at the end).
  Result<size_t> Read(ContentId id, uint64_t offset, MutableBytes out) const;
  // The same without a copy: appends to `out` the slices of the decoded chunks that hold up
  // to `length` bytes at offset, in order; returns their total (short only at the end).
  // mode kStream is for a sequential reader, which drops the chunks it has read past with
  // DropStreamed (chunk_reader.h, chunk_cache.h).
  Result<size_t> ReadSlices(ContentId id, uint64_t offset, size_t length,
                            std::vector<ChunkSlice>* out,
                            ChunkReader::CacheMode mode = ChunkReader::CacheMode::kKeep) const;
  // Loads the chunks of [offset, offset + length) into the cache in the background. kLow
  // prefetch runs only when no write and no other prefetch waits for the worker pool. A chunk
  // that `progress` (when given) no longer Wants by the time a worker gets to it is skipped:
  // its reader is past it or done with it (read_progress.h).
  void Prefetch(ContentId id, uint64_t offset, uint64_t length,
                WorkerPool::Priority priority = WorkerPool::Priority::kNormal,
                ChunkReader::CacheMode mode = ChunkReader::CacheMode::kKeep,
                std::shared_ptr<const ReadProgress> progress = nullptr) const;
  // Drops a chunk a sequential reader has read past, unless it is an ordinary cache entry.
  void DropStreamed(const ChunkId& id) const { cache_.DropStreamed(id); }
  // Drops a content and its chunk references; unreferenced chunks go at the next Gc().
  Status Release(ContentId id);
  // The same inside a caller's transaction (the FUSE layer swaps contents atomically).
  Status ReleaseInTxn(Catalog::WriteTxn& txn, ContentId id);

  // The CLI's flat namespace: name -> content. Binding a name releases the content it held.
  Status BindNameInTxn(Catalog::WriteTxn& txn, std::string_view name, ContentId id);
  Result<ContentId> LookupName(std::string_view name) const;
  Status RemoveName(std::string_view name);

  Result<GcReport> Gc(const GcOptions& options = {});
  // Reads and checks every record (checksums, decoding, SHA-256) and every reference.
  // `progress` (when given) hears the record bytes checked of all the records'.
  Result<VerifyReport> Verify(const ProgressFn& progress = {}) const;
  Result<StoreStats> Stats() const;

  // ---- Packs written by other processes (engine/store/adopt.cc; docs/snapshot.md) ---------
  // A chunk of a content another process wrote: a record in its pack, or a chunk the store
  // already holds (an unchanged block of the previous version).
  struct AdoptedChunk {
    ChunkId id;
    uint32_t raw_len = 0;
    std::optional<PackLocation> record;  // nullopt: a reference to a stored chunk
    ChunkRow row;                        // filled by CheckExternalPack for records
  };
  // Creates an empty pack (header only, owned by uid:gid) with an id the store's own writer
  // never uses, for another process to append records to.
  Result<std::pair<uint32_t, std::filesystem::path>> CreateExternalPack(uint32_t uid, uint32_t gid);
  // Checks that the records of `chunks` tile the pack from its header to `length`, each with
  // a valid header, the claimed id and length and a matching payload checksum; fills their
  // rows (a delta's row names its base) and syncs the pack. Corruption names pack and offset.
  Status CheckExternalPack(uint32_t pack_id, uint64_t length, std::vector<AdoptedChunk>* chunks);
  // Adds a content made of `chunks` (checked) inside `txn`: new records become chunk rows,
  // stored chunks gain a reference, a new delta references its base (NotFound when the base
  // is no longer stored), the pack is committed up to pack_length (0: no pack).
  Result<ContentId> AdoptContentInTxn(Catalog::WriteTxn& txn,
                                      const std::vector<AdoptedChunk>& chunks, uint64_t size,
                                      uint32_t pack_id, uint64_t pack_length);
  // Deletes a pack from CreateExternalPack that will not be adopted.
  Status DiscardExternalPack(uint32_t pack_id);
  // ---- end of adopt.cc --------------------------------------------------------------------

  // Returns once every content committed so far has been through the reverse-delta
  // re-encoder (at once with reverse_deltas off), and the records it replaced that no writer
  // holds any more are punched out. The destructor waits for it too.
  void WaitReencoded();
  // Pieces the re-encoder stored whole since Open (their bases re-encoded against them or
  // left whole as anchors).
  uint64_t pieces_reencoded() const { return pieces_reencoded_.load(); }
  // The re-encoder's catalog transactions since Open, and how many of them had to scan every
  // chunk row (the first of each content's, and any after another writer committed).
  uint64_t reencode_batches() const { return reencode_batches_.load(); }
  uint64_t reencode_scans() const { return reencode_scans_.load(); }

  Catalog& catalog() { return *catalog_; }
  const std::filesystem::path& dir() const { return dir_; }
  const StoreOptions& options() const { return options_; }
  bool using_io_uring() const { return packs_->using_io_uring(); }
  // The packs being appended to, one per lane in use (pack_writer.h).
  std::vector<PackExtent> ActivePacks() const { return packs_->active_extents(); }
  // Punches of dead records (PackWriter::punch_seq, PunchedSince): for a copier of pack bytes
  // (the bucket mirror) to learn whether what it read may have been punched meanwhile.
  uint64_t PunchSeq() const { return packs_->punch_seq(); }
  bool PunchedSince(uint64_t seq, uint32_t pack_id, uint64_t from, uint64_t to) const {
    return packs_->PunchedSince(seq, pack_id, from, to);
  }
  // The most raw bytes queued in the write pipeline at once since Open.
  size_t inflight_peak_bytes() const { return inflight_.peak(); }
  // Bytes (and records) read from pack files since Open: what readers cost the disk.
  uint64_t pack_read_bytes() const { return reader_->read_bytes(); }
  uint64_t pack_reads() const { return reader_->reads(); }
  // The decoded-chunk cache's lookups that hit / missed (chunk_cache.h), and the chunk loads
  // Prefetch() queued (each a chunk not in the cache when the prefetch was asked for).
  uint64_t cache_hits() const { return cache_.hits(); }
  // Decoded bytes the chunk cache holds now.
  uint64_t cache_bytes() const { return cache_.size_bytes(); }
  uint64_t cache_misses() const { return cache_.misses(); }
  // Whether the chunk cache holds the chunk now.
  bool Cached(const ChunkId& id) const { return cache_.Contains(id); }
  uint64_t prefetch_loads() const { return prefetch_loads_.load(std::memory_order_relaxed); }
  // The chunks a read decoded itself, found neither cached nor being prefetched: each one a
  // read that waited for the pack because prefetch had not kept ahead of it.
  uint64_t read_loads() const { return read_loads_.load(std::memory_order_relaxed); }

 private:
  friend class ContentWriter;
  struct Pinned {
    ChunkRow row;
    uint64_t pins = 0;
  };
  // What the writer knows about a chunk beyond its bytes.
  struct PieceHint {
    uint8_t width = 1;  // element width of the tensor it belongs to
    // The same piece of the previous version, pinned by the caller: a delta base candidate.
    // With reverse deltas a whole base is not encoded against: the piece is stored whole and
    // the re-encoder turns the base into a delta against it (WritesWhole).
    std::optional<std::pair<ChunkId, ChunkRow>> base;
    bool cache = false;   // keep the raw bytes in the cache (the next version's delta base)
    bool encode = false;  // encode now even where the store compresses behind the writer
  };
  Store(std::filesystem::path dir, const StoreOptions& options);
  // Cuts the packs' uncommitted tails and removes packs no commit refers to (recover.cc),
  // then opens the pack writer.
  Status Recover();
  struct RecoveredPacks {
    // Per lane, its last pack, where appending may go on there (pack_writer.h).
    std::vector<PackExtent> resume;
    uint32_t next_id = 1;  // above every pack file and row
  };
  Result<RecoveredPacks> RecoverPacks();
  // Stores `raw` (unless present) and pins its row until Unpin; returns the row to reference.
  Result<ChunkRow> PutChunk(const ChunkId& id, Buffer raw, const PieceHint& hint);
  // Whether a piece whose delta base candidate has `base_row` is stored whole, leaving the
  // delta to the re-encoder (reverse deltas on and the base whole: the newest version is
  // whole in the end, so a forward delta now would be encoded only to be replaced).
  bool WritesWhole(const ChunkRow& base_row) const;
  // Whether a whole piece of raw_len bytes that is stored raw is one for the re-encoder to
  // compress: at least compress_behind_min_bytes (smaller ones stored raw were written by an
  // encoder that found them incompressible), and a codec that compresses. Whatever the store's
  // compress_behind now: pieces an earlier mount left raw are compressed too.
  bool CompressibleBehind(uint64_t raw_len) const;
  // Whether a whole piece of raw_len bytes is written raw, for the re-encoder to compress
  // (compress_behind on, a re-encoder running, and CompressibleBehind).
  bool CompressesBehind(uint64_t raw_len) const;
  // Pins a chunk that is stored (committed or pinned); nullopt when it is not.
  Result<std::optional<ChunkRow>> PinIfStored(const ChunkId& id);
  void Unpin(const ChunkId& id);
  // The chunk of `content` at exactly [offset, offset + length), pinned, if it may serve as a
  // delta base (its chain leaves room for one more record).
  std::optional<std::pair<ChunkId, ChunkRow>> PinDeltaBase(ContentId content, uint64_t offset,
                                                           uint32_t length);
  // One chunk of a content being committed: its reference, the row PutChunk returned, and
  // the delta base candidate it was written whole against (reverse_base: the re-encoder then
  // makes that base a delta against this chunk, reencode.cc).
  struct CommitRef {
    ChunkRef ref;
    ChunkRow row;
    std::optional<ChunkId> reverse_base;
  };
  // Durably commits a content made of `refs`, with its layout row (empty: none). `reencode`:
  // the content is marked for the re-encoder, and the caller queues it (QueueReverseDeltas)
  // once it has released its pins: the re-encoder leaves a base that a writer pins as it is
  // (reencode.cc), so queued before the unpin, the previous version could stay whole for good.
  struct Committed {
    ContentId id;
    bool reencode = false;
  };
  Result<Committed> CommitContent(std::optional<ContentId> base, const std::vector<CommitRef>& refs,
                                  uint64_t size, const std::string& layout,
                                  const std::function<Status(Catalog::WriteTxn&, ContentId)>& hook);
  // The decoded chunk, from the cache or the pack (chunk_reader.h).
  // REQUIRES: gc_mu_ held shared, or the row pinned.
  Result<std::shared_ptr<const Buffer>> LoadChunk(const ChunkId& id, const ChunkRow& row) const {
    return reader_->Load(id, row);
  }
  std::filesystem::path PackPath(uint32_t pack_id) const;
  // `copied` hears the length of each live record once it is copied.
  Status RewritePack(uint32_t pack_id, const std::vector<std::pair<ChunkId, ChunkRow>>& live,
                     const GcOptions& options, const std::function<void(uint64_t)>& copied,
                     GcReport* report);
  Status DeletePackFile(uint32_t pack_id);
  // Punches holes in the pack over [kPackHeaderBytes, committed) less the extents in_use
  // ({offset, length} of every record a row or pin points at). REQUIRES: in_use is complete
  // for a snapshot taken under gc_mu_ exclusive (gc.cc).
  void PunchDeadRanges(uint32_t pack_id, uint64_t committed,
                       std::vector<std::pair<uint64_t, uint64_t>> in_use, GcReport* report);
  // The content-meta key that marks chunk `id` as promoted: made whole by the re-encoder, it
  // may become a delta against the next version's piece (reencode.cc). Dropped with the chunk.
  static std::string PromotedKey(const ChunkId& id);
  // Deletes `dead` chunk rows (and their promoted marks) and, in turn, the delta bases they
  // held the last reference to. REQUIRES: gc_mu_ exclusive.
  Status DropChunksInTxn(Catalog::WriteTxn& txn, std::vector<ChunkId> dead, GcReport* report)
      REQUIRES(mu_);
  Status RematerializeOrphanedDeltas(GcReport* report);
  // A new adopted delta row (adopt.cc): its depth from the base's row, a reference on the base.
  Status ReferenceDeltaBase(Catalog::WriteTxn& txn, const ChunkId& id, ChunkRow* row);
  // The catalog row of a record appended at `loc` (no delta base, no references).
  static ChunkRow RowOf(const RecordHeader& header, const PackLocation& loc);
  uint64_t PackBytesOnDisk() const;
  // ---- Reverse deltas (reencode.cc) ---------------------------------------------------------
  void QueueReverseDeltas(ContentId id);
  // Persists `id` in the re-encoder's queue (inside the transaction that commits it).
  static Status MarkForReverseDeltas(Catalog::WriteTxn& txn, ContentId id);
  // Records, with content `id`, that its new chunk `x` was written whole against the whole
  // chunk `base`: the re-encoder of `id` makes `base` a delta against `x`, and compresses `x`
  // first if it was written raw (compress_behind). Without a base: only that compression.
  static Status MarkReverseBase(Catalog::WriteTxn& txn, ContentId id, const ChunkId& x,
                                const std::optional<ChunkId>& base);
  // Queues the contents a crash left marked (Open).
  Status QueuePendingReverseDeltas();
  void RunReencoder();
  Status ReverseDeltas(ContentId id);
  // Punches the whole blocks inside dead records' extents (adjacent records as one range).
  void PunchRecords(std::vector<PackLocation> dead);
  // Punches the replaced records that waited for their pins (punch_later_) and have none now.
  void PunchUnpinnedReplaced();

  const std::filesystem::path dir_;
  StoreOptions options_;
  FileDescriptor lock_fd_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<PackWriter> packs_;
  mutable ChunkCache cache_;
  std::unique_ptr<ChunkReader> reader_;  // the read side: record reads, decoding, pack fds
  ByteBudget inflight_;
  std::unique_ptr<WorkerPool> pool_;
  mutable std::atomic<uint64_t> prefetch_loads_{0};
  mutable std::atomic<uint64_t> read_loads_{0};

  // Lock order: gc_run_mu_, then gc_mu_, then mu_ (then the reader's own locks).
  std::mutex gc_run_mu_;             // one Gc() at a time
  mutable std::shared_mutex gc_mu_;  // shared: location lookups + reads; exclusive: gc moves
  Mutex mu_;
  std::unordered_map<ChunkId, Pinned> pinned_ GUARDED_BY(mu_);
  // LayoutSignature by content id for FindContentByLayout (a content's layout never changes
  // and ids are not reused); cleared when it reaches kMaxCachedSignatures.
  static constexpr size_t kMaxCachedSignatures = 8192;
  mutable Mutex signatures_mu_;
  mutable std::unordered_map<ContentId, std::optional<uint64_t>> signatures_
      GUARDED_BY(signatures_mu_);

  Mutex reencode_mu_;
  CondVar reencode_cv_;
  std::deque<ContentId> reencode_queue_ GUARDED_BY(reencode_mu_);
  bool reencode_busy_ GUARDED_BY(reencode_mu_) = false;
  bool reencode_stopping_ GUARDED_BY(reencode_mu_) = false;
  std::atomic<uint64_t> pieces_reencoded_{0};
  std::atomic<uint64_t> reencode_batches_{0};
  std::atomic<uint64_t> reencode_scans_{0};
  // Replaced records a writer still held pinned: punched by a later batch (reencode.cc).
  std::vector<std::pair<ChunkId, PackLocation>> punch_later_ GUARDED_BY(mu_);
  // Records the re-encoder appended that its commit has not named yet (nor given up): gc keeps
  // them as it keeps pinned ones (their packs are not rewritten, their bytes not punched).
  // Added under gc_mu_ shared with the appends, removed under gc_mu_ exclusive at the commit.
  std::vector<PackLocation> reencode_appended_ GUARDED_BY(mu_);
  std::thread reencoder_;  // started by Open when options_.reverse_deltas
};

}  // namespace ckptfs
