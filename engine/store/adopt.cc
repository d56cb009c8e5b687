// Store: packs written by other processes (the snapshot engine, docs/snapshot.md). The daemon
// reserves a pack id the store's own PackWriter never uses and creates the file; the snapshot
// process appends records to it in the record format of record.h and syncs it; the daemon
// checks every record and then adopts the chunks in the catalog transaction that publishes
// the version. A reserved pack that is never adopted is deleted (DiscardExternalPack, or by
// Recover at the next open: no pack row refers to it). Records may be encoded as the store's
// own are (planes, deltas); a delta's base must be stored, and gains a reference.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "engine/store/record.h"
#include "engine/store/store.h"

namespace ckptfs {
namespace {

// The content id counter of store.cc (the same meta key).
constexpr char kNextContentKey[] = "next_content_id";

uint64_t NowUnixNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

Result<std::pair<uint32_t, std::filesystem::path>> Store::CreateExternalPack(uint32_t uid,
                                                                             uint32_t gid) {
  const uint32_t id = packs_->ReserveId();
  const auto path = PackPath(id);
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(path, O_WRONLY | O_CREAT | O_EXCL, 0600));
  std::byte header[kPackHeaderBytes];
  EncodePackHeader(id, header);
  Status s = PWriteFull(fd.get(), 0, {header, kPackHeaderBytes}, path);
  if (s.ok() && ::fchown(fd.get(), uid, gid) != 0)
    s = Status::FromErrno(errno, "chown " + path.string());
  if (s.ok()) s = DataSync(fd.get(), path);
  if (s.ok()) s = SyncDir(dir_ / "packs");
  if (!s.ok()) {
    ::unlink(path.c_str());
    return s;
  }
  return std::make_pair(id, path);
}

Status Store::CheckExternalPack(uint32_t pack_id, uint64_t length,
                                std::vector<AdoptedChunk>* chunks) {
  const auto path = PackPath(pack_id);
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(path, O_RDONLY));
  CKPTFS_ASSIGN_OR_RETURN(uint64_t size, FileSize(fd.get(), path));
  if (size < length || length < kPackHeaderBytes) {
    return Status::Corruption(path.string() + " holds " + std::to_string(size) +
                              " bytes, not the " + std::to_string(length) + " announced");
  }
  std::byte header[kPackHeaderBytes];
  CKPTFS_RETURN_IF_ERROR(PReadFull(fd.get(), 0, {header, kPackHeaderBytes}, path));
  CKPTFS_RETURN_IF_ERROR(CheckPackHeader({header, kPackHeaderBytes}, pack_id));
  // The records, each once (a chunk that appears twice in a file shares its record), must
  // tile the pack from its header to `length`.
  std::map<uint64_t, AdoptedChunk*> by_offset;
  for (AdoptedChunk& c : *chunks) {
    if (!c.record) continue;
    if (c.record->pack_id != pack_id) return Status::InvalidArgument("a record in another pack");
    auto [it, fresh] = by_offset.emplace(c.record->offset, &c);
    if (!fresh && (it->second->id != c.id || it->second->record->length != c.record->length)) {
      return Status::InvalidArgument("two chunks claim the record at offset " +
                                     std::to_string(c.record->offset));
    }
  }
  uint64_t expected = kPackHeaderBytes;
  std::map<uint64_t, ChunkRow> rows;
  Buffer record;
  for (const auto& [offset, c] : by_offset) {
    const std::string where = "pack " + PackFileName(pack_id) + " offset " + std::to_string(offset);
    if (offset != expected) return Status::Corruption(where + ": records do not tile the pack");
    const uint32_t len = c->record->length;
    if (len < kRecordHeaderBytes || len > kRecordHeaderBytes + kMaxRecordRawBytes + 1024) {
      return Status::Corruption(where + ": impossible record length");
    }
    record.Resize(len);
    CKPTFS_RETURN_IF_ERROR(PReadFull(fd.get(), offset, record.mutable_bytes(), path));
    auto h = RecordHeader::Decode(record.bytes());
    if (!h.ok()) return Status::Corruption(where + ": " + h.status().message());
    Bytes payload = record.bytes().subspan(kRecordHeaderBytes);
    if (h->id != c->id || h->raw_len != c->raw_len || h->stored_len != payload.size()) {
      return Status::Corruption(where + ": record does not match its commit (chunk " +
                                c->id.ShortHex() + ")");
    }
    if (Checksum64(payload) != h->payload_checksum) {
      return Status::Corruption(where + ": checksum mismatch in chunk " + c->id.ShortHex());
    }
    auto body = SplitRecordPayload(*h, payload);
    if (!body.ok()) return Status::Corruption(where + ": " + body.status().message());
    ChunkRow row = RowOf(*h, PackLocation{pack_id, offset, len});
    if (body->base) {  // its depth and the base's reference come at adoption
      if (*body->base == c->id) return Status::Corruption(where + ": a delta against itself");
      row.base = *body->base;
    }
    rows[offset] = row;
    expected += len;
  }
  if (expected != length) {
    return Status::Corruption("pack " + PackFileName(pack_id) + ": records end at " +
                              std::to_string(expected) + ", not at " + std::to_string(length));
  }
  for (AdoptedChunk& c : *chunks) {
    if (c.record) c.row = rows[c.record->offset];
  }
  return DataSync(fd.get(), path);  // the writer synced; this makes it the daemon's fact too
}

Status Store::ReferenceDeltaBase(Catalog::WriteTxn& txn, const ChunkId& id, ChunkRow* row) {
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> base, txn.GetChunk(row->base));
  if (!base) {
    return Status::NotFound("chunk " + id.ShortHex() + " is a delta against " +
                            row->base.ShortHex() +
                            ", which is no longer stored (was the previous version deleted and "
                            "collected?)");
  }
  if (base->raw_len != row->raw_len) {
    return Status::Corruption("chunk " + id.ShortHex() + " is a delta against a chunk of " +
                              std::to_string(base->raw_len) + " bytes, not " +
                              std::to_string(row->raw_len));
  }
  // The writer bounds its chains by max_delta_chain, counting from what it stored itself; a
  // base whose bytes the store held already (written through the mount, a longer chain) can
  // make this chain longer. Readers decode such chains up to 255 records.
  if (base->depth >= 254) {  // readers stop at 255 records
    return Status::NotSupported("chunk " + id.ShortHex() +
                                " would be rebuilt from more than 254 "
                                "records; snapshot again with max_delta_chain 1");
  }
  row->depth = static_cast<uint8_t>(base->depth + 1);
  if (row->depth > options_.max_delta_chain) {
    spdlog::warn("adopted chunk {} is rebuilt from {} records (max_delta_chain {})", id.ShortHex(),
                 row->depth, options_.max_delta_chain);
  }
  ++base->refcount;
  return txn.PutChunk(row->base, *base);
}

Result<ContentId> Store::AdoptContentInTxn(Catalog::WriteTxn& txn,
                                           const std::vector<AdoptedChunk>& chunks, uint64_t size,
                                           uint32_t pack_id, uint64_t pack_length) {
  CKPTFS_ASSIGN_OR_RETURN(uint64_t last_id, txn.GetCounter(kNextContentKey));
  const ContentId id = last_id + 1;
  CKPTFS_RETURN_IF_ERROR(txn.PutCounter(kNextContentKey, id));
  uint64_t offset = 0;
  for (const AdoptedChunk& c : chunks) {
    CKPTFS_RETURN_IF_ERROR(txn.PutChunkRef(id, ChunkRef{offset, c.id, c.raw_len}));
    offset += c.raw_len;
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(c.id));
    if (row) {  // stored already (an unchanged block, or the same bytes elsewhere)
      if (row->raw_len != c.raw_len) {
        return Status::Corruption("chunk " + c.id.ShortHex() + " is stored with another length");
      }
    } else if (c.record) {
      row = c.row;
      row->refcount = 0;
      if (IsDelta(row->transform)) CKPTFS_RETURN_IF_ERROR(ReferenceDeltaBase(txn, c.id, &*row));
    } else {
      return Status::NotFound("chunk " + c.id.ShortHex() +
                              " that an unchanged block refers to is no longer stored (was the "
                              "previous version deleted and collected?)");
    }
    ++row->refcount;
    CKPTFS_RETURN_IF_ERROR(txn.PutChunk(c.id, *row));
  }
  if (offset != size) {
    return Status::InvalidArgument("the chunks add up to " + std::to_string(offset) +
                                   " bytes, not " + std::to_string(size));
  }
  if (pack_length > 0) {
    // Records whose bytes were already stored are dead from the start: gc reclaims them.
    CKPTFS_ASSIGN_OR_RETURN(std::optional<PackRow> prow, txn.GetPack(pack_id));
    const uint64_t committed = std::max(prow ? prow->committed : 0, pack_length);
    CKPTFS_RETURN_IF_ERROR(txn.PutPack(pack_id, PackRow{committed}));
  }
  CKPTFS_RETURN_IF_ERROR(txn.PutContent(id, ContentRow{size, chunks.size(), NowUnixNs()}));
  return id;
}

Status Store::DiscardExternalPack(uint32_t pack_id) { return DeletePackFile(pack_id); }

}  // namespace ckptfs
