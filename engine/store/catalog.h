// engine/store/catalog.h
//
// The store's metadata in one LMDB environment, as typed tables:
//
//   chunks          ChunkId            -> ChunkRow (where the record is, its codec, refcount)
//   packs           pack id (BE32)     -> PackRow  (committed length)
//   contents        content id (BE64)  -> ContentRow (logical size, chunk count)
//   content_chunks  content id, offset -> ChunkRef (the chunk that starts at that offset)
//   names           UTF-8 name         -> content id (the CLI's put/get namespace)
//   meta            key                -> u64 (counters such as the next content id)
//   content_meta    content id (BE64)  -> the content's layout (format/layout.h), if recognized
//   inodes, dirents, xattrs             -> rows of the filesystem namespace (engine/namespace/),
//                                          reached through the raw-bytes Table API below
//
// Raw-table rows are checksummed (catalogs created since meta "row_checksums" exists; older
// catalogs keep unchecked rows): each stored value ends in an XXH3-64 of its table, key and
// value, checked on every Get and ForEach, so a flipped byte in a key (a file name) or a value
// is a Corruption error, never another name or value. The trailer is invisible to callers.
//
// Keys are big-endian so a cursor walks a content's chunks in offset order and ChunkAt() finds
// the chunk covering an offset in O(log n). The FUSE namespace and version tables of later
// issues are further tables in the same environment, committed in the same transactions.
//
// Transactions: any number of readers (MVCC snapshots, usable from any thread) and one writer
// at a time; a WriteTxn that is not committed aborts when destroyed. Commit() is durable.
//
// Full disk: the catalog keeps a space reserve (space_reserve.h, the file `reserve` in its
// directory). Changes that let the user make room (deleting a version or a content, gc) go
// through Update(SpaceUse::kFreesSpace, ...), which releases the reserve and tries once more
// when the disk is full; RefillReserve() takes it again once there is room.
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/codec/codec.h"
#include "engine/codec/piece_codec.h"
#include "engine/hash/chunk_id.h"
#include "engine/store/space_reserve.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs {

using ContentId = uint64_t;

struct ChunkRow {
  uint32_t pack_id = 0;
  uint64_t offset = 0;  // of the record header in the pack
  uint32_t length = 0;  // record bytes: header + payload
  uint32_t raw_len = 0;
  Codec codec = Codec::kNone;
  uint64_t checksum = 0;  // XXH3-64 of the payload
  // References from contents, plus one from each delta chunk whose base this is; 0 means
  // garbage for the next gc.
  uint64_t refcount = 0;
  Transform transform = Transform::kPlain;  // how the record encodes the raw bytes
  uint8_t width = 1;                        // element width of the planes
  ChunkId base;                             // the delta base, when IsDelta(transform)
  // Records decoded to rebuild the chunk, at most: 1 + the base's depth when it was written
  // (gc may store a base whole again, which only shortens the chains above it).
  uint8_t depth = 1;

  // A whole record of the raw bytes: no transform, no codec.
  bool stored_raw() const { return transform == Transform::kPlain && codec == Codec::kNone; }
};

struct PackRow {
  uint64_t committed = 0;  // bytes that committed records may lie in
};

struct ContentRow {
  uint64_t size = 0;
  uint64_t chunk_count = 0;
  uint64_t created_unix_ns = 0;
};

// Tables whose rows other modules encode themselves (keys sort bytewise).
enum class Table { kInodes, kDirents, kXattrs, kContentMeta };

struct ChunkRef {
  uint64_t offset = 0;  // in the content
  ChunkId id;
  uint32_t length = 0;  // raw bytes
};

class Catalog {
 public:
  // Opens (creating if needed) the LMDB environment in `dir`, with a space reserve of
  // reserve_bytes (0: none) that it takes now if the disk has room. map_bytes is the address
  // space mapped at first (0: the filesystem's size, MapBytesFor(dir)); LMDB raises it to the
  // file's size if the file is larger.
  static Result<std::unique_ptr<Catalog>> Open(const std::filesystem::path& dir,
                                               uint64_t reserve_bytes = 0, uint64_t map_bytes = 0);
  // The map a catalog in `dir` gets: the size of the filesystem holding dir, rounded up to a
  // multiple of 1 GiB, between 1 GiB and 1 TiB (1 TiB if the size cannot be read).
  static uint64_t MapBytesFor(const std::filesystem::path& dir);
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  class ReadTxn;
  class WriteTxn;
  Result<ReadTxn> BeginRead() const;
  // Blocks while another write transaction is open.
  Result<WriteTxn> BeginWrite();

  enum class SpaceUse {
    kNormal,      // may fail with NoSpace on a full disk
    kFreesSpace,  // a delete: succeeds on a full disk, using the space reserve
  };
  // Runs `body` in a new write transaction and commits it. With kFreesSpace, a NoSpace from
  // the body or the commit releases the space reserve and runs body once more in a fresh
  // transaction. REQUIRES: body changes nothing but the transaction (it may run twice).
  //
  //   CKPTFS_RETURN_IF_ERROR(catalog.Update(Catalog::SpaceUse::kFreesSpace,
  //                                         [&](Catalog::WriteTxn& txn) { return ...; }));
  Status Update(SpaceUse use, const std::function<Status(WriteTxn&)>& body);
  // The same for a change that begins and commits its own write transaction (when it must
  // hold a lock of its own until the commit): runs it once more, after releasing the space
  // reserve, if it fails with NoSpace. REQUIRES: change may run twice.
  Status FreeingSpace(const std::function<Status()>& change);
  // Takes the space reserve again after it was released, if the disk has room (NoSpace if
  // not). Called after gc has freed space.
  Status RefillReserve();
  bool reserve_held() const { return reserve_ && reserve_->held(); }
  // The address space LMDB maps now (see "Address space" above).
  uint64_t map_bytes() const EXCLUDES(map_mu_);
  // Writes a compacted copy of the whole catalog, as of one read transaction, to
  // dir/data.mdb (dir must exist and hold no data.mdb); writers go on meanwhile. The object
  // store backend publishes these images (docs/scale-out.md).
  Status CopyTo(const std::filesystem::path& dir) const;

 private:
  struct Tables {
    MDB_dbi chunks, packs, contents, content_chunks, names, meta;
    MDB_dbi raw[4];  // indexed by Table
    bool row_checksums = false;  // raw rows end in a checksum (see the top of this file)
  };
  Catalog() = default;
  // Every transaction (and CopyTo's) is counted from before it begins until it ends, so that
  // GrowMap can remap only while none is open.
  // IOError once a failed remap left LMDB without a map.
  Status TxnBegins() const EXCLUDES(map_mu_);
  void TxnEnded() const EXCLUDES(map_mu_);
  // Runs change; if it fails with NoSpace and GrowMap() grew the map, runs it once more.
  Status WithRoomInMap(const std::function<Status()>& change);
  // Grows the map to MapBytesFor(dir_) if it is smaller and no transaction is open. Returns
  // whether it grew.
  bool GrowMap() EXCLUDES(map_mu_);
  MDB_env* env_ = nullptr;
  mutable Mutex map_mu_;
  mutable uint64_t open_txns_ GUARDED_BY(map_mu_) = 0;
  uint64_t map_bytes_ GUARDED_BY(map_mu_) = 0;
  bool unusable_ GUARDED_BY(map_mu_) = false;
  std::unique_ptr<SpaceReserve> reserve_;
  Tables t_{};
  std::filesystem::path dir_;
};

class Catalog::ReadTxn {
 public:
  ReadTxn(ReadTxn&& o) noexcept : owner_(o.owner_), txn_(o.txn_), t_(o.t_) { o.txn_ = nullptr; }
  ReadTxn& operator=(ReadTxn&&) = delete;
  ~ReadTxn();  // a write transaction that was not committed aborts

  Result<std::optional<ChunkRow>> GetChunk(const ChunkId& id) const;
  Result<std::optional<PackRow>> GetPack(uint32_t pack_id) const;
  Result<std::optional<ContentRow>> GetContent(ContentId id) const;
  Result<std::optional<ContentId>> GetName(std::string_view name) const;
  Result<uint64_t> GetCounter(std::string_view key) const;  // 0 when absent
  // The chunk of `content` that covers `offset`, or nullopt past the end.
  Result<std::optional<ChunkRef>> ChunkAt(ContentId content, uint64_t offset) const;

  // LMDB's transaction id: a read transaction sees the catalog as of write transaction id();
  // a write transaction is id() and, once committed, the next writer's is id() + 1 unless
  // someone else committed in between (an aborted write leaves no id behind).
  uint64_t id() const;

  // Visitors stop early (and return OK) when fn returns false.
  Status ForEachChunk(const std::function<bool(const ChunkId&, const ChunkRow&)>& fn) const;
  Status ForEachPack(const std::function<bool(uint32_t, const PackRow&)>& fn) const;
  Status ForEachContent(const std::function<bool(ContentId, const ContentRow&)>& fn) const;
  // The chunks of `content` in offset order, starting with the one that covers `from`.
  Status ForEachChunkRef(ContentId content, uint64_t from,
                         const std::function<bool(const ChunkRef&)>& fn) const;
  Status ForEachName(const std::function<bool(std::string_view, ContentId)>& fn) const;

  // Raw-bytes tables. Get returns nullopt when absent. ForEach visits keys >= from that start
  // with `prefix`, in byte order; fn returns false to stop.
  Result<std::optional<std::string>> Get(Table table, std::string_view key) const;
  // Both return Corruption on a row whose checksum does not match (ForEach stops there).
  Status ForEach(Table table, std::string_view prefix, std::string_view from,
                 const std::function<bool(std::string_view key, std::string_view value)>& fn) const;
  // Checks the checksum of every raw-table row; calls damaged with the Corruption of each bad
  // one (its message names the table and key). OK with no calls on a catalog without row
  // checksums.
  Status CheckRows(const std::function<void(const Status&)>& damaged) const;

 protected:
  friend class Catalog;
  ReadTxn(const Catalog* owner, MDB_txn* txn, const Tables& t) : owner_(owner), txn_(txn), t_(t) {}
  const Catalog* owner_;  // told when the transaction ends (txn_ becomes null)
  MDB_txn* txn_;
  Tables t_;
};

class Catalog::WriteTxn : public ReadTxn {
 public:
  WriteTxn(WriteTxn&& o) noexcept = default;

  Status PutChunk(const ChunkId& id, const ChunkRow& row);
  Status DeleteChunk(const ChunkId& id);
  Status PutPack(uint32_t pack_id, const PackRow& row);
  Status DeletePack(uint32_t pack_id);
  Status PutContent(ContentId id, const ContentRow& row);
  // Deletes the content row, its chunk refs and its meta row (refcounts are the caller's
  // business).
  Status DeleteContent(ContentId id);
  Status PutChunkRef(ContentId content, const ChunkRef& ref);
  Status PutName(std::string_view name, ContentId id);
  Status DeleteName(std::string_view name);
  Status PutCounter(std::string_view key, uint64_t value);
  Status Put(Table table, std::string_view key, std::string_view value);
  Status Delete(Table table, std::string_view key);
  // Durable when it returns OK. The transaction is finished either way.
  Status Commit();

 private:
  friend class Catalog;
  using ReadTxn::ReadTxn;
};

}  // namespace ckptfs
