#include "engine/store/store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "engine/store/content_writer.h"
#include "engine/store/record.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr char kConfigFile[] = "ckptfs.json";
constexpr char kNextContentKey[] = "next_content_id";

uint64_t NowUnixNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::string ContentMetaKey(ContentId id) {
  std::string key(8, '\0');
  PutBE64(key.data(), id);
  return key;
}

// What ckptfs.json fixes or records for a store.
struct StoreConfig {
  FastCdc::Params chunking;
  CodecSpec codec;  // for new records (StoreOptions::codec)
};

// Reads or creates ckptfs.json: the chunking parameters the store was created with and the
// codec for new records (options.codec if given, else the recorded one, else the default).
Result<StoreConfig> LoadConfig(const std::filesystem::path& dir, const StoreOptions& options,
                               bool create) {
  const auto path = dir / kConfigFile;
  if (create) {
    const CodecSpec codec = options.codec.value_or(CodecSpec{});
    nlohmann::json config = {{"format", kStoreFormatVersion},
                             {"created_by", "ckptfs " CKPTFS_VERSION},
                             {"chunking",
                              {{"min", options.chunking.min_size},
                               {"avg", options.chunking.avg_size},
                               {"max", options.chunking.max_size}}},
                             {"codec", codec.ToString()}};
    CKPTFS_RETURN_IF_ERROR(WriteFileAtomic(path, config.dump(2) + "\n"));
    return StoreConfig{options.chunking, codec};
  }
  CKPTFS_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object() || !config.contains("format") ||
      !config["format"].is_number_unsigned()) {
    return Status::Corruption(path.string() + " is not a ckptfs store configuration");
  }
  uint64_t format = config["format"].get<uint64_t>();
  if (format > kStoreFormatVersion) {
    return Status::NotSupported("the store at " + dir.string() + " has format " +
                                std::to_string(format) + "; this ckptfs reads formats up to " +
                                std::to_string(kStoreFormatVersion) + ": upgrade ckptfs");
  }
  if (format < kStoreFormatVersion) {
    if (!options.upgrade_format) {
      return Status::NotSupported("the store at " + dir.string() + " has format " +
                                  std::to_string(format) + "; this ckptfs writes format " +
                                  std::to_string(kStoreFormatVersion) + ": run `ckptfs upgrade " +
                                  dir.string() + "` to upgrade it in place (older ckptfs " +
                                  "versions cannot open it afterwards)");
    }
    // Older stores read as they are; what this version writes needs the newer format.
    spdlog::info("upgrading the store at {} from format {} to {}", dir.string(), format,
                 kStoreFormatVersion);
    config["format"] = kStoreFormatVersion;
    CKPTFS_RETURN_IF_ERROR(WriteFileAtomic(path, config.dump(2) + "\n"));
  }
  FastCdc::Params p;
  if (config.contains("chunking")) {
    const auto& c = config["chunking"];
    auto field = [&](const char* key, size_t* out) {
      if (!c.is_object() || !c.contains(key)) return false;
      if (!c[key].is_number_unsigned()) return false;
      *out = c[key].get<size_t>();
      return true;
    };
    if (!field("min", &p.min_size) || !field("avg", &p.avg_size) || !field("max", &p.max_size)) {
      return Status::Corruption(path.string() + ": \"chunking\" must hold unsigned min/avg/max");
    }
  }
  CKPTFS_RETURN_IF_ERROR(FastCdc::Validate(p));
  CodecSpec codec;
  if (config.contains("codec")) {
    auto recorded = config["codec"].is_string()
                        ? CodecSpec::Parse(config["codec"].get<std::string>())
                        : Result<CodecSpec>(Status::InvalidArgument("not a string"));
    if (!recorded.ok()) {
      return Status::Corruption(path.string() + ": \"codec\" is not a codec this ckptfs knows");
    }
    codec = *recorded;
  }
  if (options.codec && options.codec->ToString() != codec.ToString()) {
    spdlog::info("store {} records codec {}; new records use {} while it is open", dir.string(),
                 codec.ToString(), options.codec->ToString());
  }
  return StoreConfig{p, options.codec.value_or(codec)};
}

// The pack writer's queue of records not yet written is part of the in-flight budget: a
// quarter of it, at most 16 MiB; the writers share the rest. (Uncounted, a 64-entry queue
// held up to 64 MiB of payloads beyond the budget: fs.sh's daemon peaked above
// cache + inflight + 64 MiB.)
size_t PackQueueBytes(size_t inflight_bytes) {
  return std::min<size_t>(inflight_bytes / 4, 16u << 20);
}

}  // namespace

Store::Store(std::filesystem::path dir, const StoreOptions& options)
    : dir_(std::move(dir)),
      options_(options),
      cache_(options.cache_bytes),
      inflight_(options.inflight_bytes - PackQueueBytes(options.inflight_bytes)) {}

Store::~Store() {
  if (reencoder_.joinable()) {  // finishes what is queued: the newest version's re-encoding
    {
      MutexLock lock(reencode_mu_);
      reencode_stopping_ = true;
    }
    reencode_cv_.NotifyAll();
    reencoder_.join();
  }
  pool_.reset();  // runs what is queued; writers must be gone by now
  packs_.reset();
}

std::filesystem::path Store::PackPath(uint32_t pack_id) const {
  return dir_ / "packs" / PackFileName(pack_id);
}

Result<uint32_t> Store::ReadFormat(const std::filesystem::path& dir) {
  const auto path = dir / kConfigFile;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return Status::NotFound("no ckptfs store at " + dir.string());
  CKPTFS_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object() || !config.contains("format") ||
      !config["format"].is_number_unsigned()) {
    return Status::Corruption(path.string() + " is not a ckptfs store configuration");
  }
  return static_cast<uint32_t>(config["format"].get<uint64_t>());
}

Result<std::unique_ptr<Store>> Store::Open(const std::filesystem::path& dir,
                                           const StoreOptions& options) {
  CKPTFS_RETURN_IF_ERROR(FastCdc::Validate(options.chunking));
  if (options.chunking.max_size > kMaxRecordRawBytes) {
    return Status::InvalidArgument("the maximum chunk size is " +
                                   std::to_string(kMaxRecordRawBytes >> 20) + " MiB");
  }
  std::error_code ec;
  bool exists = std::filesystem::exists(dir / kConfigFile, ec);
  if (!exists && !options.create_if_missing) {
    return Status::NotFound("no ckptfs store at " + dir.string());
  }
  if (!exists) {
    std::filesystem::create_directories(dir / "packs", ec);
    if (ec) return Status::IOError("create store " + dir.string() + ": " + ec.message());
    // Private to its owner (docs/threat-model.md): nothing below a 0700 directory can be
    // reached by other users, whatever the modes of the files in it.
    for (const auto& d : {dir, dir / "packs"}) {
      std::filesystem::permissions(d, std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::replace, ec);
      if (ec) return Status::IOError("chmod 0700 " + d.string() + ": " + ec.message());
    }
  }
  std::unique_ptr<Store> store(new Store(dir, options));
  CKPTFS_ASSIGN_OR_RETURN(store->lock_fd_, OpenFile(dir / "LOCK", O_RDWR | O_CREAT));
  if (::flock(store->lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    std::string holder = ReadSmallFile(dir / "LOCK").ok() ? *ReadSmallFile(dir / "LOCK") : "";
    return Status::Busy("the store at " + dir.string() + " is open in another process" +
                        (holder.empty() ? "" : " (pid " + holder + ")") +
                        "; unmount it or stop that process first");
  }
  std::string pid = std::to_string(::getpid());
  (void)::ftruncate(store->lock_fd_.get(), 0);
  (void)PWriteFull(store->lock_fd_.get(), 0, AsBytes(pid), dir / "LOCK");

  CKPTFS_ASSIGN_OR_RETURN(StoreConfig config, LoadConfig(dir, options, !exists));
  store->options_.chunking = config.chunking;
  store->options_.codec = config.codec;
  CKPTFS_ASSIGN_OR_RETURN(store->catalog_,
                          Catalog::Open(dir / "catalog", options.space_reserve_bytes));
  store->reader_ = std::make_unique<ChunkReader>(
      dir / "packs", store->catalog_.get(), &store->cache_, options.remote_records,
      options.direct_reads ? ChunkReader::DirectReads::kWhereUncached
                           : ChunkReader::DirectReads::kOff);
  CKPTFS_RETURN_IF_ERROR(store->Recover());
  int threads = options.worker_threads > 0
                    ? options.worker_threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  store->pool_ = std::make_unique<WorkerPool>(threads);
  if (options.reverse_deltas && options.max_delta_chain > 1) {
    store->reencoder_ = std::thread([p = store.get()] { p->RunReencoder(); });
    CKPTFS_RETURN_IF_ERROR(store->QueuePendingReverseDeltas());
  }
  return store;
}

Status Store::Recover() {
  CKPTFS_ASSIGN_OR_RETURN(RecoveredPacks packs, RecoverPacks());
  PackWriter::Options popts{options_.pack_target_bytes, options_.use_io_uring,
                            PackQueueBytes(options_.inflight_bytes)};
  CKPTFS_ASSIGN_OR_RETURN(packs_,
                          PackWriter::Open(dir_ / "packs", popts, packs.resume, packs.next_id));
  return Status::OK();
}

std::unique_ptr<ContentWriter> Store::NewWriter() {
  return std::unique_ptr<ContentWriter>(new ContentWriter(this, std::nullopt, 0));
}

Result<std::unique_ptr<ContentWriter>> Store::NewAppender(ContentId base) {
  CKPTFS_ASSIGN_OR_RETURN(ContentRow row, StatContent(base));
  return std::unique_ptr<ContentWriter>(new ContentWriter(this, base, row.size));
}

Result<std::optional<ChunkRow>> Store::PinIfStored(const ChunkId& id) {
  std::shared_lock gc(gc_mu_);
  {
    MutexLock lock(mu_);
    auto it = pinned_.find(id);
    if (it != pinned_.end()) {
      ++it->second.pins;
      return std::optional<ChunkRow>(it->second.row);
    }
  }
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(id));
  if (!row) return row;
  MutexLock lock(mu_);
  Pinned& p = pinned_[id];
  if (p.pins++ == 0) p.row = *row;
  return std::optional<ChunkRow>(p.row);
}

std::optional<std::pair<ChunkId, ChunkRow>> Store::PinDeltaBase(ContentId content, uint64_t offset,
                                                                uint32_t length) {
  std::optional<ChunkRef> ref;
  {
    std::shared_lock gc(gc_mu_);
    auto txn = catalog_->BeginRead();
    if (!txn.ok()) return std::nullopt;
    auto at = txn->ChunkAt(content, offset);
    if (!at.ok() || !*at || (*at)->offset != offset || (*at)->length != length) {
      return std::nullopt;
    }
    ref = **at;
  }
  auto row = PinIfStored(ref->id);
  if (!row.ok() || !*row) return std::nullopt;
  if ((*row)->depth >= options_.max_delta_chain) {
    Unpin(ref->id);
    return std::nullopt;
  }
  return std::make_pair(ref->id, **row);
}

ChunkRow Store::RowOf(const RecordHeader& header, const PackLocation& loc) {
  ChunkRow row;
  row.pack_id = loc.pack_id;
  row.offset = loc.offset;
  row.length = loc.length;
  row.raw_len = header.raw_len;
  row.codec = header.codec;
  row.checksum = header.payload_checksum;
  row.transform = header.transform();
  row.width = header.width();
  return row;
}

Result<ChunkRow> Store::PutChunk(const ChunkId& id, Buffer raw, const PieceHint& hint) {
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> stored, PinIfStored(id));
  if (stored) return *stored;
  std::shared_ptr<const Buffer> base;
  if (hint.base && hint.base->second.raw_len == raw.size() &&
      hint.base->second.depth < options_.max_delta_chain && !WritesWhole(hint.base->second)) {
    auto loaded = LoadChunk(hint.base->first, hint.base->second);  // pinned: cannot move
    if (loaded.ok()) {
      base = *loaded;
    } else {
      spdlog::warn("chunk {} is stored without a delta: its base {} did not load: {}",
                   id.ShortHex(), hint.base->first.ShortHex(), loaded.status().ToString());
    }
  }
  EncodedPiece piece;
  const bool raw_behind = base == nullptr && !hint.encode && CompressesBehind(raw.size());
  if (raw_behind) {
    // Stored raw: the commit queues it for the re-encoder, which compresses it.
    piece.encoding = {Transform::kPlain, std::clamp<uint8_t>(hint.width, 1, kMaxPieceWidth),
                      Codec::kNone};
  } else {
    piece = EncodePiece(*options_.codec, raw.bytes(), hint.width, base.get());
  }
  const bool delta = IsDelta(piece.encoding.transform);
  // Which lane (record.h): when the re-encoder replaces the record, if ever. A delta is
  // written only against a base that is a delta already (WritesWhole), which the re-encoder
  // leaves as it is: it lasts.
  PackLane lane = PackLane::kLasting;
  if (reencoder_.joinable()) {
    if (raw_behind) {
      lane = PackLane::kTransient;  // compressed once the re-encoder gets here
    } else if (hint.base && !delta) {
      lane = PackLane::kMain;  // whole: the next version makes it a delta
    }
  }
  // A delta's payload is its base's id, then the encoded bytes: the pack writer writes the id
  // from the header's buffer, so the encoded bytes are not copied behind it.
  std::optional<ChunkId> delta_base;
  if (delta) delta_base = hint.base->first;
  const bool encoded = delta || !piece.stored_raw();
  const uint32_t raw_len = static_cast<uint32_t>(raw.size());
  // The record's payload: the encoded bytes, or the raw ones as they are (no copy), which the
  // cache and the pack write share when the piece is cached too.
  std::shared_ptr<const Buffer> payload =
      std::make_shared<const Buffer>(encoded ? std::move(piece.stored) : std::move(raw));
  if (hint.cache)
    cache_.Insert(id, encoded ? std::make_shared<const Buffer>(std::move(raw)) : payload);
  const RecordHeader header =
      delta ? RecordHeader::ForDelta(id, raw_len, piece.encoding, *delta_base, payload->bytes())
            : RecordHeader::For(id, raw_len, piece.encoding, payload->bytes());
  // Appended and pinned under gc_mu_, so that gc never finds a record neither pinned nor
  // committed in a pack it is about to rewrite.
  std::shared_lock gc(gc_mu_);
  CKPTFS_ASSIGN_OR_RETURN(PackLocation loc,
                          packs_->Append(header, std::move(payload), delta_base, lane));
  ChunkRow row = RowOf(header, loc);
  if (delta) {
    row.base = hint.base->first;
    row.depth = static_cast<uint8_t>(hint.base->second.depth + 1);
  }
  MutexLock lock(mu_);
  Pinned& p = pinned_[id];
  if (p.pins++ == 0) p.row = row;  // else another writer stored it too: share the first copy
  return p.row;
}

bool Store::WritesWhole(const ChunkRow& base_row) const {
  return reencoder_.joinable() && !IsDelta(base_row.transform);
}

bool Store::CompressibleBehind(uint64_t raw_len) const {
  return raw_len >= options_.compress_behind_min_bytes &&
         (options_.codec->codec != Codec::kNone || options_.codec->entropy);
}

bool Store::CompressesBehind(uint64_t raw_len) const {
  return options_.compress_behind && reencoder_.joinable() && CompressibleBehind(raw_len);
}

void Store::Unpin(const ChunkId& id) {
  MutexLock lock(mu_);
  auto it = pinned_.find(id);
  if (it != pinned_.end() && --it->second.pins == 0) pinned_.erase(it);
}

Result<Store::Committed> Store::CommitContent(
    std::optional<ContentId> base, const std::vector<CommitRef>& refs, uint64_t size,
    const std::string& layout, const std::function<Status(Catalog::WriteTxn&, ContentId)>& hook) {
  Status synced = packs_->Sync();
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginWrite());
  CKPTFS_ASSIGN_OR_RETURN(uint64_t last_id, txn.GetCounter(kNextContentKey));
  const ContentId id = last_id + 1;
  CKPTFS_RETURN_IF_ERROR(txn.PutCounter(kNextContentKey, id));
  uint64_t chunk_count = refs.size();
  if (base) {
    // The base's chunks are referenced once more, by the new content.
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> base_row, txn.GetContent(*base));
    if (!base_row) {
      return Status::NotFound("content " + std::to_string(*base) +
                              " that this writer continues was released meanwhile");
    }
    std::vector<ChunkRef> base_refs;
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(*base, 0, [&](const ChunkRef& ref) {
      base_refs.push_back(ref);
      return true;
    }));
    for (const ChunkRef& ref : base_refs) {
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(ref.id));
      if (!row) return Status::Corruption("base content refers to a missing chunk");
      ++row->refcount;
      CKPTFS_RETURN_IF_ERROR(txn.PutChunk(ref.id, *row));
      CKPTFS_RETURN_IF_ERROR(txn.PutChunkRef(id, ref));
    }
    chunk_count += base_refs.size();
  }
  std::map<uint32_t, uint64_t> pack_ends;
  bool new_deltas = false;  // then the re-encoder looks at this content
  for (const auto& [ref, pinned_row, reverse_base] : refs) {
    CKPTFS_RETURN_IF_ERROR(txn.PutChunkRef(id, ref));
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(ref.id));
    if (!row) {
      // First reference: the record must be on disk before the catalog points at it.
      PackLocation loc{pinned_row.pack_id, pinned_row.offset, pinned_row.length};
      if (!packs_->IsDurable(loc)) {
        return synced.ok() ? Status::IOError("a record of this content failed to reach disk")
                           : synced;
      }
      row = pinned_row;
      row->refcount = 0;
      uint64_t& end = pack_ends[loc.pack_id];
      end = std::max(end, loc.offset + loc.length);
      if (IsDelta(row->transform)) {
        new_deltas = true;
        // The base is pinned by the writer, so it is still in the catalog.
        CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> base_row, txn.GetChunk(row->base));
        if (!base_row) {
          return Status::Corruption("the delta base " + row->base.ShortHex() + " of chunk " +
                                    ref.id.ShortHex() + " is missing");
        }
        ++base_row->refcount;
        CKPTFS_RETURN_IF_ERROR(txn.PutChunk(row->base, *base_row));
      } else if (reverse_base && *reverse_base != ref.id && reencoder_.joinable()) {
        // Written whole against a whole base: the re-encoder makes the base a delta of it
        // (and compresses this piece first if it was written raw).
        new_deltas = true;
        CKPTFS_RETURN_IF_ERROR(MarkReverseBase(txn, id, ref.id, *reverse_base));
      } else if (CompressesBehind(row->raw_len) && row->stored_raw()) {
        // Written raw, without a base: the re-encoder compresses it.
        new_deltas = true;
        CKPTFS_RETURN_IF_ERROR(MarkReverseBase(txn, id, ref.id, std::nullopt));
      }
    }
    ++row->refcount;
    CKPTFS_RETURN_IF_ERROR(txn.PutChunk(ref.id, *row));
  }
  for (const auto& [pack_id, end] : pack_ends) {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<PackRow> row, txn.GetPack(pack_id));
    uint64_t committed = std::max(row ? row->committed : 0, end);
    CKPTFS_RETURN_IF_ERROR(txn.PutPack(pack_id, PackRow{committed}));
  }
  CKPTFS_RETURN_IF_ERROR(txn.PutContent(id, ContentRow{size, chunk_count, NowUnixNs()}));
  if (!layout.empty()) {
    CKPTFS_RETURN_IF_ERROR(txn.Put(Table::kContentMeta, ContentMetaKey(id), layout));
  }
  if (hook) CKPTFS_RETURN_IF_ERROR(hook(txn, id));
  const bool reencode = new_deltas && reencoder_.joinable();
  if (reencode) CKPTFS_RETURN_IF_ERROR(MarkForReverseDeltas(txn, id));
  CKPTFS_RETURN_IF_ERROR(txn.Commit());
  return Committed{id, reencode};
}

Result<ContentRow> Store::StatContent(ContentId id) const {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> row, txn.GetContent(id));
  if (!row) return Status::NotFound("content " + std::to_string(id) + " does not exist");
  return *row;
}

Result<std::optional<ContentLayout>> Store::GetLayout(ContentId id) const {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> row,
                          txn.Get(Table::kContentMeta, ContentMetaKey(id)));
  if (!row) return std::optional<ContentLayout>();
  CKPTFS_ASSIGN_OR_RETURN(ContentLayout layout, ContentLayout::Decode(*row));
  return std::optional<ContentLayout>(std::move(layout));
}

Result<std::optional<ContentId>> Store::FindContentByLayout(uint64_t signature,
                                                            uint64_t max_scan) const {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(const uint64_t last, txn.GetCounter(kNextContentKey));
  for (ContentId id = last; id > 0 && last - id < max_scan; --id) {
    std::optional<std::optional<uint64_t>> cached;
    {
      MutexLock lock(signatures_mu_);
      auto it = signatures_.find(id);
      if (it != signatures_.end()) cached = it->second;
    }
    if (!cached) {
      CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> row,
                              txn.Get(Table::kContentMeta, ContentMetaKey(id)));
      std::optional<uint64_t> sig;
      if (row) {
        Result<ContentLayout> layout = ContentLayout::Decode(*row);
        if (layout.ok()) sig = LayoutSignature(*layout);
      }
      cached = sig;
      MutexLock lock(signatures_mu_);
      if (signatures_.size() >= kMaxCachedSignatures) signatures_.clear();
      signatures_[id] = sig;
    }
    if (*cached != signature) continue;
    // Deleted since it was cached: not a reference.
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> content, txn.GetContent(id));
    if (content) return std::optional<ContentId>(id);
  }
  return std::optional<ContentId>();
}

Result<ContentEncoding> Store::DescribeContent(ContentId id) const {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> content, txn.GetContent(id));
  if (!content) return Status::NotFound("content " + std::to_string(id) + " does not exist");
  ContentEncoding e;
  Status err;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, 0, [&](const ChunkRef& ref) {
    auto row = txn.GetChunk(ref.id);
    if (!row.ok() || !*row) {
      err = row.ok() ? Status::Corruption("content refers to a missing chunk") : row.status();
      return false;
    }
    ++e.chunks;
    e.raw_bytes += (*row)->raw_len;
    e.record_bytes += (*row)->length;
    ++e.chunks_by_transform[static_cast<size_t>((*row)->transform) & 3];
    e.max_depth = std::max<uint32_t>(e.max_depth, (*row)->depth);
    return true;
  }));
  CKPTFS_RETURN_IF_ERROR(err);
  return e;
}

Result<size_t> Store::Read(ContentId id, uint64_t offset, MutableBytes out) const {
  std::vector<ChunkSlice> slices;
  CKPTFS_ASSIGN_OR_RETURN(size_t n, ReadSlices(id, offset, out.size(), &slices));
  size_t done = 0;
  for (const ChunkSlice& slice : slices) {
    std::memcpy(out.data() + done, slice.chunk->data() + slice.offset, slice.length);
    done += slice.length;
  }
  return n;
}

Result<size_t> Store::ReadSlices(ContentId id, uint64_t offset, size_t length,
                                 std::vector<ChunkSlice>* out, ChunkReader::CacheMode mode) const {
  std::shared_lock gc(gc_mu_);
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> content, txn.GetContent(id));
  if (!content) return Status::NotFound("content " + std::to_string(id) + " does not exist");
  if (offset >= content->size || length == 0) return size_t{0};
  const size_t want = static_cast<size_t>(std::min<uint64_t>(length, content->size - offset));
  // The chunks the range covers, then one read-ahead of the records not cached (a request
  // that spans several chunks reads them from disk in one go, not one pread after another),
  // then the loads.
  std::vector<std::pair<ChunkRef, ChunkRow>> chunks;
  Status err;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, offset, [&](const ChunkRef& ref) {
    auto row = txn.GetChunk(ref.id);
    if (!row.ok() || !*row) {
      err = row.ok() ? Status::Corruption("content " + std::to_string(id) + " refers to chunk " +
                                          ref.id.ShortHex() + ", which the catalog lacks")
                     : row.status();
      return false;
    }
    chunks.emplace_back(ref, **row);
    return ref.offset + ref.length < offset + want;
  }));
  CKPTFS_RETURN_IF_ERROR(err);
  if (chunks.size() > 1) {
    std::vector<ChunkRow> cold;
    for (const auto& [ref, row] : chunks) {
      if (!cache_.Contains(ref.id)) cold.push_back(row);
    }
    if (cold.size() > 1) reader_->WillNeed(std::move(cold));
  }
  size_t done = 0;
  for (const auto& [ref, row] : chunks) {
    bool decoded_here = false;
    CKPTFS_ASSIGN_OR_RETURN(auto chunk, reader_->Load(ref.id, row, mode, &decoded_here));
    if (decoded_here) read_loads_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t pos = offset + done;
    if (pos < ref.offset || pos - ref.offset >= chunk->size()) {
      return Status::Corruption("content " + std::to_string(id) + " has a gap in its chunk " +
                                "list at offset " + std::to_string(pos) + "; run `ckptfs verify`");
    }
    const size_t in_chunk = static_cast<size_t>(pos - ref.offset);
    const size_t n = std::min(want - done, chunk->size() - in_chunk);
    out->push_back(ChunkSlice{std::move(chunk), in_chunk, n, ref.id, ref.offset + ref.length});
    done += n;
    if (done == want) break;
  }
  if (done < want) {
    return Status::Corruption("content " + std::to_string(id) + " has fewer chunk bytes than " +
                              "its recorded size");
  }
  return done;
}

void Store::Prefetch(ContentId id, uint64_t offset, uint64_t length, WorkerPool::Priority priority,
                     ChunkReader::CacheMode mode,
                     std::shared_ptr<const ReadProgress> progress) const {
  const bool streamed = mode == ChunkReader::CacheMode::kStream;
  std::vector<std::tuple<ChunkId, ChunkRow, uint64_t>> todo;  // with the chunk's end
  {
    std::shared_lock gc(gc_mu_);
    auto txn = catalog_->BeginRead();
    if (!txn.ok()) return;
    (void)txn->ForEachChunkRef(id, offset, [&](const ChunkRef& ref) {
      if (ref.offset >= offset + length) return false;
      if (cache_.Lookup(ref.id, streamed) == nullptr) {
        auto row = txn->GetChunk(ref.id);
        if (row.ok() && *row) todo.emplace_back(ref.id, **row, ref.offset + ref.length);
      }
      return true;
    });
  }
  prefetch_loads_.fetch_add(todo.size(), std::memory_order_relaxed);
  if (todo.empty()) return;
  {
    // One large read-ahead of the window's records (mostly adjacent in their packs) rather
    // than a small synchronous pread per record on the workers: cold restores were bound by
    // the disk's latency per request (docs/fs.md).
    std::vector<ChunkRow> rows;
    rows.reserve(todo.size());
    for (const auto& [chunk, row, end] : todo) rows.push_back(row);
    reader_->WillNeed(std::move(rows));
  }
  for (const auto& [chunk, row, end] : todo) {
    pool_->Submit(
        // Init-captures: clang 14 cannot capture structured bindings directly.
        [this, chunk = chunk, row = row, end = end, mode, progress] {
          if (progress && !progress->Wants(chunk, end)) return;
          std::shared_lock gc(gc_mu_);  // the row's location is valid while gc cannot move it
          (void)reader_->Load(chunk, row, mode);  // errors surface when the data is really read
        },
        priority);
  }
}

Status Store::ReleaseInTxn(Catalog::WriteTxn& txn, ContentId id) {
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> content, txn.GetContent(id));
  if (!content) return Status::NotFound("content " + std::to_string(id) + " does not exist");
  std::vector<ChunkId> chunks;
  chunks.reserve(content->chunk_count);
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, 0, [&](const ChunkRef& ref) {
    chunks.push_back(ref.id);
    return true;
  }));
  for (const ChunkId& chunk : chunks) {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(chunk));
    if (!row || row->refcount == 0) {
      return Status::Corruption("content " + std::to_string(id) + " refers to chunk " +
                                chunk.ShortHex() + " with no references; run `ckptfs verify`");
    }
    --row->refcount;
    CKPTFS_RETURN_IF_ERROR(txn.PutChunk(chunk, *row));
  }
  return txn.DeleteContent(id);
}

Status Store::Release(ContentId id) {
  return catalog_->Update(Catalog::SpaceUse::kFreesSpace,
                          [&](Catalog::WriteTxn& txn) { return ReleaseInTxn(txn, id); });
}

Status Store::BindNameInTxn(Catalog::WriteTxn& txn, std::string_view name, ContentId id) {
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentId> old, txn.GetName(name));
  if (old && *old != id) CKPTFS_RETURN_IF_ERROR(ReleaseInTxn(txn, *old));
  return txn.PutName(name, id);
}

Result<ContentId> Store::LookupName(std::string_view name) const {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentId> id, txn.GetName(name));
  if (!id) return Status::NotFound("no content is named '" + std::string(name) + "'");
  return *id;
}

Status Store::RemoveName(std::string_view name) {
  return catalog_->Update(Catalog::SpaceUse::kFreesSpace, [&](Catalog::WriteTxn& txn) {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentId> id, txn.GetName(name));
    if (!id) return Status::NotFound("no content is named '" + std::string(name) + "'");
    CKPTFS_RETURN_IF_ERROR(ReleaseInTxn(txn, *id));
    return txn.DeleteName(name);
  });
}

uint64_t Store::PackBytesOnDisk() const {
  uint64_t total = 0;
  // An active pack counts what was appended, not the padding of a direct pack's last block.
  std::map<uint32_t, uint64_t> active;  // active packs' appended lengths
  if (packs_) {
    for (const PackExtent& e : packs_->active_extents()) active[e.pack_id] = e.length;
  }
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_ / "packs", ec), end; !ec && it != end;
       it.increment(ec)) {
    uint32_t id;
    struct stat st {};
    if (ParsePackFileName(it->path().filename().string(), &id) &&
        ::stat(it->path().c_str(), &st) == 0) {
      // The file's length, less the holes gc punched (allocated blocks, when fewer).
      uint64_t size = static_cast<uint64_t>(st.st_size);
      if (auto a = active.find(id); a != active.end()) size = std::min(size, a->second);
      total += std::min(size, static_cast<uint64_t>(st.st_blocks) * 512);
    }
  }
  return total;
}

Result<StoreStats> Store::Stats() const {
  StoreStats st;
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  CKPTFS_RETURN_IF_ERROR(txn.ForEachContent([&](ContentId, const ContentRow& row) {
    ++st.contents;
    st.logical_bytes += row.size;
    return true;
  }));
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId&, const ChunkRow& row) {
    if (row.refcount == 0) return true;
    ++st.chunks;
    st.chunk_bytes += row.raw_len;
    st.record_bytes += row.length;
    ++st.chunks_by_transform[static_cast<size_t>(row.transform) & 3];
    st.max_depth = std::max<uint32_t>(st.max_depth, row.depth);
    return true;
  }));
  CKPTFS_RETURN_IF_ERROR(txn.ForEachPack([&](uint32_t, const PackRow&) {
    ++st.packs;
    return true;
  }));
  st.pack_bytes = PackBytesOnDisk();
  return st;
}

Status Store::DeletePackFile(uint32_t pack_id) {
  reader_->ForgetPack(pack_id);
  if (::unlink(PackPath(pack_id).c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "remove " + PackPath(pack_id).string());
  }
  return SyncDir(dir_ / "packs");
}

}  // namespace ckptfs
