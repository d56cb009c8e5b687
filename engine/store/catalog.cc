#include "engine/store/catalog.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/hash/chunk_id.h"
#include "engine/store/lmdb_check.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMapUnit = uint64_t{1} << 30;
constexpr uint64_t kMaxMapBytes = uint64_t{1} << 40;

// Below this much free space, a commit's EIO is taken for a short write of a full disk.
constexpr uint64_t kShortWriteFreeBytes = 1 << 20;

Status LmdbError(int rc, std::string_view what) {
  std::string msg = "catalog " + std::string(what) + ": " + mdb_strerror(rc);
  if (rc == ENOSPC || rc == MDB_MAP_FULL) return Status::NoSpace(msg);
  if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID) {
    return Status::Corruption(msg);
  }
  return Status::IOError(msg);
}

MDB_val Val(const void* data, size_t size) { return {size, const_cast<void*>(data)}; }

// Raw-table rows of a catalog with row checksums (meta "row_checksums" = 1; every catalog
// created since) end in a trailer: LE64 XXH3-64 of the table's number, the key's length, the
// key and the value. A flipped byte in a key (a file name) or a value then reads as Corruption
// instead of as another name. Catalogs created before keep their rows as they are, unchecked.
constexpr char kRowChecksumsKey[] = "row_checksums";
constexpr size_t kRowTrailerBytes = 8;
constexpr const char* kRawTableNames[] = {"inodes", "dirents", "xattrs", "content_meta"};

uint64_t RowChecksum(Table table, std::string_view key, std::string_view value) {
  std::string buf(5, '\0');
  buf[0] = static_cast<char>(table);
  PutLE<uint32_t>(buf.data() + 1, static_cast<uint32_t>(key.size()));
  buf.append(key).append(value);
  return Checksum64(AsBytes(buf));
}

// "dirents row 12/model.pt": a key's leading 8 bytes as the big-endian number they hold (an
// inode or content id), the rest printable (other bytes as \xNN).
std::string RowName(Table table, std::string_view key) {
  std::string out = std::string(kRawTableNames[static_cast<int>(table)]) + " row ";
  if (key.size() >= 8) {
    out += std::to_string(GetBE64(key.data()));
    key.remove_prefix(8);
    if (!key.empty()) out += '/';
  }
  for (unsigned char ch : key) {
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      out += static_cast<char>(ch);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", ch);
      out += hex;
    }
  }
  return out;
}

// The value of a raw row without its trailer; Corruption when the checksum does not match.
Result<std::string_view> CheckedValue(bool checked, Table table, std::string_view key,
                                      std::string_view row) {
  if (!checked) return row;
  if (row.size() < kRowTrailerBytes) {
    return Status::Corruption("catalog " + RowName(table, key) +
                              " is damaged (too short for its checksum); run `ckptfs verify`");
  }
  std::string_view value = row.substr(0, row.size() - kRowTrailerBytes);
  if (GetLE<uint64_t>(row.data() + value.size()) != RowChecksum(table, key, value)) {
    return Status::Corruption("catalog " + RowName(table, key) +
                              " is damaged (checksum mismatch); run `ckptfs verify`");
  }
  return value;
}

struct Key64 {
  std::byte b[8];
  explicit Key64(uint64_t v) { PutBE64(b, v); }
  MDB_val val() const { return Val(b, 8); }
};
struct Key32 {
  std::byte b[4];
  explicit Key32(uint32_t v) { PutBE32(b, v); }
  MDB_val val() const { return Val(b, 4); }
};
struct RefKey {
  std::byte b[16];
  RefKey(ContentId c, uint64_t off) {
    PutBE64(b, c);
    PutBE64(b + 8, off);
  }
  MDB_val val() const { return Val(b, 16); }
};

// ChunkRow, version 1: version(1) pack(4) offset(8) length(4) raw_len(4) codec(1)
// checksum(8) refcount(8); version 2 adds transform(1) width(1) depth(1) base(32).
constexpr size_t kChunkRowV1Bytes = 38;
constexpr size_t kChunkRowBytes = 73;
constexpr uint8_t kChunkRowVersion = 2;
void EncodeChunkRow(const ChunkRow& r, std::byte* out) {
  out[0] = std::byte{kChunkRowVersion};
  PutLE<uint32_t>(out + 1, r.pack_id);
  PutLE<uint64_t>(out + 5, r.offset);
  PutLE<uint32_t>(out + 13, r.length);
  PutLE<uint32_t>(out + 17, r.raw_len);
  out[21] = static_cast<std::byte>(r.codec);
  PutLE<uint64_t>(out + 22, r.checksum);
  PutLE<uint64_t>(out + 30, r.refcount);
  out[38] = static_cast<std::byte>(r.transform);
  out[39] = std::byte{r.width};
  out[40] = std::byte{r.depth};
  std::memcpy(out + 41, r.base.bytes.data(), 32);
}
Result<ChunkRow> DecodeChunkRow(const MDB_val& v) {
  const auto* p = static_cast<const std::byte*>(v.mv_data);
  const bool v1 = v.mv_size == kChunkRowV1Bytes && p[0] == std::byte{1};
  const bool v2 = v.mv_size == kChunkRowBytes && p[0] == std::byte{kChunkRowVersion};
  if (!v1 && !v2) return Status::Corruption("catalog chunk row has an unknown layout");
  ChunkRow r;
  r.pack_id = GetLE<uint32_t>(p + 1);
  r.offset = GetLE<uint64_t>(p + 5);
  r.length = GetLE<uint32_t>(p + 13);
  r.raw_len = GetLE<uint32_t>(p + 17);
  r.codec = static_cast<Codec>(p[21]);
  r.checksum = GetLE<uint64_t>(p + 22);
  r.refcount = GetLE<uint64_t>(p + 30);
  if (v2) {
    r.transform = static_cast<Transform>(p[38]);
    r.width = static_cast<uint8_t>(p[39]);
    r.depth = static_cast<uint8_t>(p[40]);
    std::memcpy(r.base.bytes.data(), p + 41, 32);
  }
  return r;
}

constexpr size_t kContentRowBytes = 24;
constexpr size_t kChunkRefBytes = 36;

ChunkRef DecodeChunkRef(const MDB_val& k, const MDB_val& v) {
  ChunkRef ref;
  ref.offset = GetBE64(static_cast<const std::byte*>(k.mv_data) + 8);
  std::memcpy(ref.id.bytes.data(), v.mv_data, 32);
  ref.length = GetLE<uint32_t>(static_cast<const std::byte*>(v.mv_data) + 32);
  return ref;
}

// Runs fn over [first, ...) of a table; `first` null means from the start.
Status Scan(MDB_txn* txn, MDB_dbi dbi, const MDB_val* first,
            const std::function<bool(const MDB_val&, const MDB_val&)>& fn) {
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(txn, dbi, &cur);
  if (rc != 0) return LmdbError(rc, "cursor");
  MDB_val k = first ? *first : MDB_val{}, v{};
  rc = mdb_cursor_get(cur, &k, &v, first ? MDB_SET_RANGE : MDB_FIRST);
  while (rc == 0) {
    if (!fn(k, v)) break;
    rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(cur);
  if (rc != 0 && rc != MDB_NOTFOUND) return LmdbError(rc, "scan");
  return Status::OK();
}

// Gets a value; nullopt when absent.
Result<std::optional<MDB_val>> LmdbGet(MDB_txn* txn, MDB_dbi dbi, MDB_val key) {
  MDB_val v;
  int rc = mdb_get(txn, dbi, &key, &v);
  if (rc == MDB_NOTFOUND) return std::optional<MDB_val>();
  if (rc != 0) return LmdbError(rc, "get");
  return std::optional<MDB_val>(v);
}

Status LmdbPut(MDB_txn* txn, MDB_dbi dbi, MDB_val key, const void* data, size_t size) {
  MDB_val v = Val(data, size);
  int rc = mdb_put(txn, dbi, &key, &v, 0);
  return rc == 0 ? Status::OK() : LmdbError(rc, "put");
}

Status LmdbDel(MDB_txn* txn, MDB_dbi dbi, MDB_val key) {
  int rc = mdb_del(txn, dbi, &key, nullptr);
  return rc == 0 || rc == MDB_NOTFOUND ? Status::OK() : LmdbError(rc, "delete");
}

}  // namespace

uint64_t Catalog::MapBytesFor(const std::filesystem::path& dir) {
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return kMaxMapBytes;
  const uint64_t bytes = uint64_t{fs.f_blocks} * fs.f_frsize;
  if (bytes >= kMaxMapBytes) return kMaxMapBytes;
  return std::max(kMapUnit, (bytes + kMapUnit - 1) / kMapUnit * kMapUnit);
}

Result<std::unique_ptr<Catalog>> Catalog::Open(const std::filesystem::path& dir,
                                               uint64_t reserve_bytes, uint64_t map_bytes) {
  std::unique_ptr<Catalog> c(new Catalog());
  c->dir_ = dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("create " + dir.string() + ": " + ec.message());
  // LMDB trusts its pages: a damaged one would crash a read or, worse, let a write reuse a
  // live page. Nothing opens (or writes) a catalog that fails the structural check.
  if (Status st = CheckLmdbFile(dir / "data.mdb"); !st.ok() && !st.IsNotFound()) return st;
  int rc = mdb_env_create(&c->env_);
  if (map_bytes == 0) map_bytes = MapBytesFor(dir);
  if (rc == 0) rc = mdb_env_set_mapsize(c->env_, map_bytes);
  if (rc == 0) rc = mdb_env_set_maxdbs(c->env_, 32);
  if (rc == 0) rc = mdb_env_set_maxreaders(c->env_, 1024);
  if (rc == 0) rc = mdb_env_open(c->env_, dir.c_str(), MDB_NOTLS, 0600);
  if (rc != 0) return LmdbError(rc, "open " + dir.string());
  const std::pair<const char*, MDB_dbi*> tables[] = {
      {"chunks", &c->t_.chunks},
      {"packs", &c->t_.packs},
      {"contents", &c->t_.contents},
      {"content_chunks", &c->t_.content_chunks},
      {"names", &c->t_.names},
      {"meta", &c->t_.meta},
      {"inodes", &c->t_.raw[static_cast<int>(Table::kInodes)]},
      {"dirents", &c->t_.raw[static_cast<int>(Table::kDirents)]},
      {"xattrs", &c->t_.raw[static_cast<int>(Table::kXattrs)]},
      {"content_meta", &c->t_.raw[static_cast<int>(Table::kContentMeta)]}};
  // The main table holds the tables' names and nothing else. A name that is none of them is
  // a damaged catalog (a flipped byte in a name), not a table to create beside it: creating
  // "content_chunks" again would commit an empty table over the real one.
  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(c->env_, nullptr, MDB_RDONLY, &txn);
  if (rc != 0) return LmdbError(rc, "begin");
  size_t present = 0;
  std::optional<std::string> unknown;
  MDB_dbi main_dbi;
  rc = mdb_dbi_open(txn, nullptr, 0, &main_dbi);
  Status names = rc != 0 ? LmdbError(rc, "open the main table")
                         : Scan(txn, main_dbi, nullptr, [&](const MDB_val& k, const MDB_val&) {
                             std::string_view name(static_cast<const char*>(k.mv_data), k.mv_size);
                             for (const auto& table : tables) {
                               if (name == table.first) {
                                 ++present;
                                 return true;
                               }
                             }
                             unknown = name;
                             return false;
                           });
  if (names.ok() && unknown) {
    names = Status::Corruption("catalog " + dir.string() + " is damaged (a table named \"" +
                               *unknown + "\", none of ckptfs's); nothing was written: restore "
                               "the store's catalog directory from a copy");
  }
  mdb_txn_abort(txn);
  CKPTFS_RETURN_IF_ERROR(names);
  // Every table there: opened read-only (opening the store writes nothing). Otherwise a new
  // catalog, or one from before a table existed: the missing ones are created.
  const bool create = present < std::size(tables);
  rc = mdb_txn_begin(c->env_, nullptr, create ? 0 : MDB_RDONLY, &txn);
  if (rc != 0) return LmdbError(rc, "begin");
  for (const auto& [name, dbi] : tables) {
    rc = mdb_dbi_open(txn, name, create ? MDB_CREATE : 0, dbi);
    if (rc != 0) {
      mdb_txn_abort(txn);
      return LmdbError(rc, std::string("open table ") + name);
    }
  }
  if (present == 0) {  // a new catalog: its raw rows carry checksums from the start
    std::byte one[8];
    PutLE<uint64_t>(one, 1);
    Status st = LmdbPut(txn, c->t_.meta, Val(kRowChecksumsKey, std::strlen(kRowChecksumsKey)),
                        one, sizeof(one));
    if (!st.ok()) {
      mdb_txn_abort(txn);
      return st;
    }
  }
  rc = mdb_txn_commit(txn);
  if (rc != 0) return LmdbError(rc, "commit");
  {
    CKPTFS_ASSIGN_OR_RETURN(auto read, c->BeginRead());
    CKPTFS_ASSIGN_OR_RETURN(uint64_t checksums, read.GetCounter(kRowChecksumsKey));
    c->t_.row_checksums = checksums != 0;
  }
  MDB_envinfo info;
  mdb_env_info(c->env_, &info);
  {
    MutexLock lock(c->map_mu_);
    c->map_bytes_ = info.me_mapsize;
  }
  c->reserve_ = std::make_unique<SpaceReserve>(dir / "reserve", reserve_bytes);
  if (Status st = c->reserve_->Refill(); !st.ok()) {
    spdlog::warn("no space reserve: {}; deleting versions on a full disk may fail", st.ToString());
  }
  return c;
}

Status Catalog::Update(SpaceUse use, const std::function<Status(WriteTxn&)>& body) {
  auto change = [&]() -> Status {
    CKPTFS_ASSIGN_OR_RETURN(WriteTxn txn, BeginWrite());
    CKPTFS_RETURN_IF_ERROR(body(txn));
    return txn.Commit();
  };
  return use == SpaceUse::kFreesSpace ? FreeingSpace(change) : WithRoomInMap(change);
}

Status Catalog::FreeingSpace(const std::function<Status()>& change) {
  Status st = WithRoomInMap(change);
  if (st.IsNoSpace() && reserve_->Release()) {
    spdlog::warn(
        "disk full: released the {} MiB space reserve to delete; run `ckptfs gc` to "
        "free the space of deleted versions",
        reserve_->bytes() >> 20);
    st = WithRoomInMap(change);
  }
  return st;
}

Status Catalog::WithRoomInMap(const std::function<Status()>& change) {
  Status st = change();
  if (st.IsNoSpace() && GrowMap()) st = change();
  return st;
}

bool Catalog::GrowMap() {
  const uint64_t bound = MapBytesFor(dir_);
  MutexLock lock(map_mu_);
  if (map_bytes_ >= bound || open_txns_ != 0 || unusable_) return false;
  // LMDB unmaps the old map before it maps the new one, and is left without a map if that
  // fails: see first that the address space is there.
  void* probe =
      ::mmap(nullptr, bound, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (probe == MAP_FAILED) {
    spdlog::warn("catalog {}: cannot grow its map from {} to {} MiB ({}): the catalog is full",
                 dir_.string(), map_bytes_ >> 20, bound >> 20, std::strerror(errno));
    return false;
  }
  ::munmap(probe, bound);
  // No transaction is open and none can begin while map_mu_ is held: LMDB may remap.
  if (int rc = mdb_env_set_mapsize(env_, bound); rc != 0) {
    unusable_ = true;
    spdlog::error(
        "catalog {}: growing its map to {} MiB failed ({}); the catalog is unusable "
        "until the store is opened again (remount)",
        dir_.string(), bound >> 20, mdb_strerror(rc));
    return false;
  }
  spdlog::info("catalog {}: map grown from {} to {} MiB (the filesystem's size)", dir_.string(),
               map_bytes_ >> 20, bound >> 20);
  map_bytes_ = bound;
  return true;
}

uint64_t Catalog::map_bytes() const {
  MutexLock lock(map_mu_);
  return map_bytes_;
}

Status Catalog::TxnBegins() const {
  MutexLock lock(map_mu_);
  if (unusable_) {
    return Status::IOError("catalog " + dir_.string() +
                           " lost its map (a failed remap, logged); unmount and mount again");
  }
  ++open_txns_;
  return Status::OK();
}

void Catalog::TxnEnded() const {
  MutexLock lock(map_mu_);
  --open_txns_;
}

Status Catalog::RefillReserve() { return reserve_->Refill(); }

Status Catalog::CopyTo(const std::filesystem::path& dir) const {
  CKPTFS_RETURN_IF_ERROR(TxnBegins());  // the copy reads in a transaction of its own
  int rc = mdb_env_copy2(env_, dir.c_str(), MDB_CP_COMPACT);
  TxnEnded();
  if (rc != 0) return LmdbError(rc, "copy to " + dir.string());
  return Status::OK();
}

Catalog::~Catalog() {
  if (env_ != nullptr) mdb_env_close(env_);
}

Result<Catalog::ReadTxn> Catalog::BeginRead() const {
  CKPTFS_RETURN_IF_ERROR(TxnBegins());
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
  if (rc != 0) {
    TxnEnded();
    return LmdbError(rc, "begin read");
  }
  return ReadTxn(this, txn, t_);
}

Result<Catalog::WriteTxn> Catalog::BeginWrite() {
  // Counted from before the wait for LMDB's writer lock: GrowMap waits for none.
  CKPTFS_RETURN_IF_ERROR(TxnBegins());
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
  if (rc != 0) {
    TxnEnded();
    return LmdbError(rc, "begin write");
  }
  return WriteTxn(this, txn, t_);
}

Catalog::ReadTxn::~ReadTxn() {
  if (txn_ == nullptr) return;
  mdb_txn_abort(txn_);
  owner_->TxnEnded();
}

Result<std::optional<ChunkRow>> Catalog::ReadTxn::GetChunk(const ChunkId& id) const {
  CKPTFS_ASSIGN_OR_RETURN(auto v, LmdbGet(txn_, t_.chunks, Val(id.bytes.data(), 32)));
  if (!v) return std::optional<ChunkRow>();
  CKPTFS_ASSIGN_OR_RETURN(ChunkRow row, DecodeChunkRow(*v));
  return std::optional<ChunkRow>(row);
}

Result<std::optional<PackRow>> Catalog::ReadTxn::GetPack(uint32_t pack_id) const {
  CKPTFS_ASSIGN_OR_RETURN(auto v, LmdbGet(txn_, t_.packs, Key32(pack_id).val()));
  if (!v) return std::optional<PackRow>();
  if (v->mv_size != 8) return Status::Corruption("catalog pack row has an unknown layout");
  return std::optional<PackRow>(PackRow{GetLE<uint64_t>(v->mv_data)});
}

Result<std::optional<ContentRow>> Catalog::ReadTxn::GetContent(ContentId id) const {
  CKPTFS_ASSIGN_OR_RETURN(auto v, LmdbGet(txn_, t_.contents, Key64(id).val()));
  if (!v) return std::optional<ContentRow>();
  if (v->mv_size != kContentRowBytes) {
    return Status::Corruption("catalog content row has an unknown layout");
  }
  const auto* p = static_cast<const std::byte*>(v->mv_data);
  return std::optional<ContentRow>(
      ContentRow{GetLE<uint64_t>(p), GetLE<uint64_t>(p + 8), GetLE<uint64_t>(p + 16)});
}

Result<std::optional<ContentId>> Catalog::ReadTxn::GetName(std::string_view name) const {
  CKPTFS_ASSIGN_OR_RETURN(auto v, LmdbGet(txn_, t_.names, Val(name.data(), name.size())));
  if (!v) return std::optional<ContentId>();
  if (v->mv_size != 8) return Status::Corruption("catalog name row has an unknown layout");
  return std::optional<ContentId>(GetLE<uint64_t>(v->mv_data));
}

Result<uint64_t> Catalog::ReadTxn::GetCounter(std::string_view key) const {
  CKPTFS_ASSIGN_OR_RETURN(auto v, LmdbGet(txn_, t_.meta, Val(key.data(), key.size())));
  if (!v) return uint64_t{0};
  if (v->mv_size != 8) return Status::Corruption("catalog counter has an unknown layout");
  return GetLE<uint64_t>(v->mv_data);
}

Result<std::optional<ChunkRef>> Catalog::ReadTxn::ChunkAt(ContentId content,
                                                          uint64_t offset) const {
  std::optional<ChunkRef> found;
  CKPTFS_RETURN_IF_ERROR(ForEachChunkRef(content, offset, [&](const ChunkRef& ref) {
    found = ref;
    return false;
  }));
  if (found && offset >= found->offset + found->length) found.reset();
  return found;
}

Status Catalog::ReadTxn::ForEachChunk(
    const std::function<bool(const ChunkId&, const ChunkRow&)>& fn) const {
  Status err;
  Status s = Scan(txn_, t_.chunks, nullptr, [&](const MDB_val& k, const MDB_val& v) {
    auto row = DecodeChunkRow(v);
    if (!row.ok() || k.mv_size != 32) {
      err = row.ok() ? Status::Corruption("catalog chunk key has an unknown layout") : row.status();
      return false;
    }
    ChunkId id;
    std::memcpy(id.bytes.data(), k.mv_data, 32);
    return fn(id, *row);
  });
  return s.ok() ? err : s;
}

Status Catalog::ReadTxn::ForEachPack(
    const std::function<bool(uint32_t, const PackRow&)>& fn) const {
  return Scan(txn_, t_.packs, nullptr, [&](const MDB_val& k, const MDB_val& v) {
    return fn(GetBE32(k.mv_data), PackRow{GetLE<uint64_t>(v.mv_data)});
  });
}

Status Catalog::ReadTxn::ForEachContent(
    const std::function<bool(ContentId, const ContentRow&)>& fn) const {
  return Scan(txn_, t_.contents, nullptr, [&](const MDB_val& k, const MDB_val& v) {
    const auto* p = static_cast<const std::byte*>(v.mv_data);
    return fn(GetBE64(k.mv_data),
              ContentRow{GetLE<uint64_t>(p), GetLE<uint64_t>(p + 8), GetLE<uint64_t>(p + 16)});
  });
}

Status Catalog::ReadTxn::ForEachChunkRef(ContentId content, uint64_t from,
                                         const std::function<bool(const ChunkRef&)>& fn) const {
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(txn_, t_.content_chunks, &cur);
  if (rc != 0) return LmdbError(rc, "cursor");
  RefKey start(content, from);
  MDB_val k = start.val(), v{};
  // Find the first ref at or after `from`, then step back if the previous ref covers it.
  rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
  bool exact = rc == 0 && std::memcmp(k.mv_data, start.b, 16) == 0;
  if (!exact) {
    int prev =
        rc == 0 ? mdb_cursor_get(cur, &k, &v, MDB_PREV) : mdb_cursor_get(cur, &k, &v, MDB_LAST);
    if (prev == 0 && GetBE64(k.mv_data) == content) {
      rc = 0;  // the ref before `from` covers it
    } else if (rc == 0) {
      k = start.val();  // no ref covers `from`: start at the first one after it
      rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    }
  }
  while (rc == 0 && k.mv_size == 16 && GetBE64(k.mv_data) == content) {
    if (!fn(DecodeChunkRef(k, v))) break;
    rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(cur);
  if (rc != 0 && rc != MDB_NOTFOUND) return LmdbError(rc, "scan chunk refs");
  return Status::OK();
}

Status Catalog::ReadTxn::ForEachName(
    const std::function<bool(std::string_view, ContentId)>& fn) const {
  return Scan(txn_, t_.names, nullptr, [&](const MDB_val& k, const MDB_val& v) {
    return fn(std::string_view(static_cast<const char*>(k.mv_data), k.mv_size),
              GetLE<uint64_t>(v.mv_data));
  });
}

Result<std::optional<std::string>> Catalog::ReadTxn::Get(Table table, std::string_view key) const {
  CKPTFS_ASSIGN_OR_RETURN(
      auto v, LmdbGet(txn_, t_.raw[static_cast<int>(table)], Val(key.data(), key.size())));
  if (!v) return std::optional<std::string>();
  CKPTFS_ASSIGN_OR_RETURN(
      std::string_view value,
      CheckedValue(t_.row_checksums, table, key,
                   std::string_view(static_cast<const char*>(v->mv_data), v->mv_size)));
  return std::optional<std::string>(std::string(value));
}

Status Catalog::ReadTxn::ForEach(
    Table table, std::string_view prefix, std::string_view from,
    const std::function<bool(std::string_view, std::string_view)>& fn) const {
  std::string start = from > prefix ? std::string(from) : std::string(prefix);
  MDB_val first = Val(start.data(), start.size());
  Status err;
  Status s = Scan(txn_, t_.raw[static_cast<int>(table)], start.empty() ? nullptr : &first,
                  [&](const MDB_val& k, const MDB_val& v) {
                    std::string_view key(static_cast<const char*>(k.mv_data), k.mv_size);
                    if (key.substr(0, prefix.size()) != prefix) return false;
                    auto value = CheckedValue(
                        t_.row_checksums, table, key,
                        std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
                    if (!value.ok()) {
                      err = value.status();
                      return false;
                    }
                    return fn(key, *value);
                  });
  return s.ok() ? err : s;
}

Status Catalog::ReadTxn::CheckRows(const std::function<void(const Status&)>& damaged) const {
  if (!t_.row_checksums) return Status::OK();
  for (int t = 0; t < static_cast<int>(std::size(kRawTableNames)); ++t) {
    const Table table = static_cast<Table>(t);
    CKPTFS_RETURN_IF_ERROR(Scan(txn_, t_.raw[t], nullptr, [&](const MDB_val& k, const MDB_val& v) {
      auto value = CheckedValue(true, table,
                                std::string_view(static_cast<const char*>(k.mv_data), k.mv_size),
                                std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
      if (!value.ok()) damaged(value.status());
      return true;
    }));
  }
  return Status::OK();
}

Status Catalog::WriteTxn::Put(Table table, std::string_view key, std::string_view value) {
  if (!t_.row_checksums) {
    return LmdbPut(txn_, t_.raw[static_cast<int>(table)], Val(key.data(), key.size()),
                   value.data(), value.size());
  }
  std::string row(value);
  row.resize(value.size() + kRowTrailerBytes);
  PutLE<uint64_t>(row.data() + value.size(), RowChecksum(table, key, value));
  return LmdbPut(txn_, t_.raw[static_cast<int>(table)], Val(key.data(), key.size()), row.data(),
                 row.size());
}

Status Catalog::WriteTxn::Delete(Table table, std::string_view key) {
  return LmdbDel(txn_, t_.raw[static_cast<int>(table)], Val(key.data(), key.size()));
}

Status Catalog::WriteTxn::PutChunk(const ChunkId& id, const ChunkRow& row) {
  std::byte buf[kChunkRowBytes];
  EncodeChunkRow(row, buf);
  return LmdbPut(txn_, t_.chunks, Val(id.bytes.data(), 32), buf, sizeof(buf));
}

Status Catalog::WriteTxn::DeleteChunk(const ChunkId& id) {
  return LmdbDel(txn_, t_.chunks, Val(id.bytes.data(), 32));
}

Status Catalog::WriteTxn::PutPack(uint32_t pack_id, const PackRow& row) {
  std::byte buf[8];
  PutLE<uint64_t>(buf, row.committed);
  return LmdbPut(txn_, t_.packs, Key32(pack_id).val(), buf, sizeof(buf));
}

Status Catalog::WriteTxn::DeletePack(uint32_t pack_id) {
  return LmdbDel(txn_, t_.packs, Key32(pack_id).val());
}

Status Catalog::WriteTxn::PutContent(ContentId id, const ContentRow& row) {
  std::byte buf[kContentRowBytes];
  PutLE<uint64_t>(buf, row.size);
  PutLE<uint64_t>(buf + 8, row.chunk_count);
  PutLE<uint64_t>(buf + 16, row.created_unix_ns);
  return LmdbPut(txn_, t_.contents, Key64(id).val(), buf, sizeof(buf));
}

Status Catalog::WriteTxn::DeleteContent(ContentId id) {
  std::vector<uint64_t> offsets;
  CKPTFS_RETURN_IF_ERROR(ForEachChunkRef(id, 0, [&](const ChunkRef& ref) {
    offsets.push_back(ref.offset);
    return true;
  }));
  for (uint64_t offset : offsets) {
    CKPTFS_RETURN_IF_ERROR(LmdbDel(txn_, t_.content_chunks, RefKey(id, offset).val()));
  }
  CKPTFS_RETURN_IF_ERROR(
      LmdbDel(txn_, t_.raw[static_cast<int>(Table::kContentMeta)], Key64(id).val()));
  return LmdbDel(txn_, t_.contents, Key64(id).val());
}

Status Catalog::WriteTxn::PutChunkRef(ContentId content, const ChunkRef& ref) {
  std::byte buf[kChunkRefBytes];
  std::memcpy(buf, ref.id.bytes.data(), 32);
  PutLE<uint32_t>(buf + 32, ref.length);
  return LmdbPut(txn_, t_.content_chunks, RefKey(content, ref.offset).val(), buf, sizeof(buf));
}

Status Catalog::WriteTxn::PutName(std::string_view name, ContentId id) {
  if (name.empty() || name.size() > 511) {
    return Status::InvalidArgument("a name must be 1 to 511 bytes");
  }
  std::byte buf[8];
  PutLE<uint64_t>(buf, id);
  return LmdbPut(txn_, t_.names, Val(name.data(), name.size()), buf, sizeof(buf));
}

Status Catalog::WriteTxn::DeleteName(std::string_view name) {
  return LmdbDel(txn_, t_.names, Val(name.data(), name.size()));
}

Status Catalog::WriteTxn::PutCounter(std::string_view key, uint64_t value) {
  std::byte buf[8];
  PutLE<uint64_t>(buf, value);
  return LmdbPut(txn_, t_.meta, Val(key.data(), key.size()), buf, sizeof(buf));
}

uint64_t Catalog::ReadTxn::id() const { return mdb_txn_id(txn_); }

Status Catalog::WriteTxn::Commit() {
  int rc = mdb_txn_commit(txn_);
  txn_ = nullptr;
  owner_->TxnEnded();
  if (rc == EIO) {
    // LMDB reports a short page write as EIO ("short write, filesystem full?"): on a disk
    // with (almost) nothing left it is the disk being full, which the space reserve handles.
    struct statvfs fs;
    if (::statvfs(owner_->dir_.c_str(), &fs) == 0 &&
        uint64_t{fs.f_bavail} * fs.f_frsize < kShortWriteFreeBytes) {
      return Status::NoSpace("catalog commit: a short write, the disk is full");
    }
  }
  return rc == 0 ? Status::OK() : LmdbError(rc, "commit");
}

}  // namespace ckptfs
