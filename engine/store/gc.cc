// Store::Gc: drops unreferenced chunks (and then the delta bases only they referred to), stores
// whole again the deltas whose bases only deltas refer to (so that deleting old versions frees
// their chains), then rewrites packs whose live fraction is low.
//
// Crash safety: every step is one catalog transaction. Copies of live records are appended
// and synced before the transaction that points the chunks at them; a victim pack file is
// unlinked only after the transaction that forgets it. Killed at any point, the store opens
// consistent: uncommitted copies are cut as a pack tail, a forgotten pack file is deleted.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "engine/store/record.h"
#include "engine/store/store.h"

namespace ckptfs {

Result<GcReport> Store::Gc(const GcOptions& options) {
  std::lock_guard run(gc_run_mu_);
  GcReport report;
  report.pack_bytes_before = PackBytesOnDisk();

  // 1. Chunks no content refers to (and no writer has pinned) are forgotten.
  {
    std::unique_lock gc(gc_mu_);
    std::lock_guard lock(mu_);
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginWrite());
    std::vector<ChunkId> dead;
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRow& row) {
      if (row.refcount == 0 && pinned_.count(id) == 0) dead.push_back(id);
      return true;
    }));
    CKPTFS_RETURN_IF_ERROR(DropChunksInTxn(txn, std::move(dead), &report));
    CKPTFS_RETURN_IF_ERROR(txn.Commit());
  }

  // 1b. Bases that only deltas still refer to (their versions were deleted): the deltas on
  // them that contents use are stored whole again, and the chains below them go.
  CKPTFS_RETURN_IF_ERROR(RematerializeOrphanedDeltas(&report));

  // 2. Live records per pack, and the packs to rewrite: mostly dead ones no writer is using.
  // Pins are read before the snapshot, under gc_mu_, where no writer is between appending a
  // record and pinning it (PutChunk does both under gc_mu_): a pack without pins gains no chunk
  // row after the snapshot unless it is the active pack, which is closed here if it is a victim
  // (before a writer's record or a gc copy can land in it).
  std::map<uint32_t, std::vector<std::pair<ChunkId, ChunkRow>>> live;
  std::vector<uint32_t> victims;
  {
    std::unique_lock gc(gc_mu_);
    std::set<uint32_t> busy;
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, pinned] : pinned_) busy.insert(pinned.row.pack_id);
    }
    std::map<uint32_t, uint64_t> committed;
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
    CKPTFS_RETURN_IF_ERROR(txn.ForEachPack([&](uint32_t id, const PackRow& row) {
      committed[id] = row.committed;
      return true;
    }));
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRow& row) {
      live[row.pack_id].emplace_back(id, row);
      return true;
    }));
    for (const auto& [pack_id, length] : committed) {
      uint64_t live_bytes = kPackHeaderBytes;
      for (const auto& entry : live[pack_id]) live_bytes += entry.second.length;
      if (length > 0 && static_cast<double>(live_bytes) >= options.rewrite_below * length) {
        continue;
      }
      if (busy.count(pack_id) != 0) {
        report.skipped.push_back(PackFileName(pack_id) + ": a writer is using it");
        continue;
      }
      victims.push_back(pack_id);
    }
    if (std::count(victims.begin(), victims.end(), packs_->active_pack_id()) != 0) {
      CKPTFS_RETURN_IF_ERROR(packs_->Rotate());
    }
  }
  // 3. Rewrite them.
  for (uint32_t pack_id : victims) {
    Status s = RewritePack(pack_id, live[pack_id], options, &report);
    if (!s.ok()) {
      if (s.IsCorruption()) {
        report.skipped.push_back(PackFileName(pack_id) + ": " + s.message());
        continue;
      }
      return s;
    }
  }
  report.pack_bytes_after = PackBytesOnDisk();
  spdlog::info(
      "gc: dropped {} chunks, stored {} deltas whole, moved {} records, deleted {} packs, {} -> "
      "{} bytes",
      report.chunks_dropped, report.deltas_rematerialized, report.records_moved,
      report.packs_deleted, report.pack_bytes_before, report.pack_bytes_after);
  return report;
}

Status Store::DropChunksInTxn(Catalog::WriteTxn& txn, std::vector<ChunkId> dead, GcReport* report) {
  // A dropped delta releases its base, which may go in turn. REQUIRES: mu_ held.
  while (!dead.empty()) {
    const ChunkId id = dead.back();
    dead.pop_back();
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(id));
    if (!row) continue;
    CKPTFS_RETURN_IF_ERROR(txn.DeleteChunk(id));
    ++report->chunks_dropped;
    if (!IsDelta(row->transform)) continue;
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> base, txn.GetChunk(row->base));
    if (!base || base->refcount == 0) continue;  // verify reports such a base
    if (--base->refcount == 0 && pinned_.count(row->base) == 0) dead.push_back(row->base);
    CKPTFS_RETURN_IF_ERROR(txn.PutChunk(row->base, *base));
  }
  return Status::OK();
}

Status Store::RematerializeOrphanedDeltas(GcReport* report) {
  // Which chunks are referenced by deltas only, and which deltas contents use rest on them.
  std::vector<std::pair<ChunkId, ChunkRow>> todo;
  {
    std::shared_lock gc(gc_mu_);
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
    std::unordered_map<ChunkId, uint64_t> children;
    std::vector<std::pair<ChunkId, ChunkRow>> deltas;
    std::unordered_map<ChunkId, uint64_t> refcounts;
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRow& row) {
      refcounts[id] = row.refcount;
      if (IsDelta(row.transform)) {
        ++children[row.base];
        deltas.emplace_back(id, row);
      }
      return true;
    }));
    auto only_deltas = [&](const ChunkId& id) {
      auto it = children.find(id);
      return it != children.end() && refcounts[id] == it->second;
    };
    for (const auto& [id, row] : deltas) {
      if (only_deltas(row.base) && !only_deltas(id)) todo.emplace_back(id, row);
    }
  }
  // In batches: decode, store whole, then one transaction repoints the batch.
  constexpr uint64_t kBatchRawBytes = 256u << 20;
  for (size_t i = 0; i < todo.size();) {
    std::vector<std::pair<ChunkId, ChunkRow>> batch;  // old row, new row
    std::vector<ChunkRow> fresh;
    uint64_t bytes = 0;
    for (; i < todo.size() && bytes < kBatchRawBytes; ++i) {
      const auto& [id, row] = todo[i];
      Result<Buffer> raw = [&]() -> Result<Buffer> {
        std::shared_lock gc(gc_mu_);
        return reader_->Decode(id, row);
      }();
      if (!raw.ok()) {
        report->skipped.push_back("chunk " + id.ShortHex() + ": " + raw.status().message());
        continue;
      }
      EncodedPiece piece = EncodePiece(options_.codec, raw->bytes(), row.width, nullptr);
      Buffer payload = piece.stored_raw() ? std::move(*raw) : std::move(piece.stored);
      const RecordHeader header =
          RecordHeader::For(id, row.raw_len, piece.encoding, payload.bytes());
      CKPTFS_ASSIGN_OR_RETURN(PackLocation loc, packs_->Append(header, std::move(payload)));
      ChunkRow whole = RowOf(header, loc);
      bytes += row.raw_len;
      batch.emplace_back(id, row);
      fresh.push_back(whole);
    }
    Status synced = packs_->Sync();
    for (const ChunkRow& row : fresh) {
      if (!packs_->IsDurable(PackLocation{row.pack_id, row.offset, row.length})) {
        return synced.ok() ? Status::IOError("gc copy lost") : synced;
      }
    }
    std::unique_lock gc(gc_mu_);
    std::lock_guard lock(mu_);
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginWrite());
    std::map<uint32_t, uint64_t> pack_ends;
    std::vector<ChunkId> dead;
    for (size_t k = 0; k < batch.size(); ++k) {
      const auto& [id, old] = batch[k];
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(id));
      // Skipped if it changed since (dropped meanwhile) or a writer holds it pinned.
      if (!row || row->pack_id != old.pack_id || row->offset != old.offset ||
          pinned_.count(id) != 0) {
        continue;
      }
      ChunkRow whole = fresh[k];
      whole.refcount = row->refcount;
      CKPTFS_RETURN_IF_ERROR(txn.PutChunk(id, whole));
      uint64_t& end = pack_ends[whole.pack_id];
      end = std::max(end, whole.offset + whole.length);
      ++report->deltas_rematerialized;
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> base, txn.GetChunk(old.base));
      if (!base || base->refcount == 0) continue;
      if (--base->refcount == 0 && pinned_.count(old.base) == 0) dead.push_back(old.base);
      CKPTFS_RETURN_IF_ERROR(txn.PutChunk(old.base, *base));
    }
    for (const auto& [pack_id, end] : pack_ends) {
      CKPTFS_ASSIGN_OR_RETURN(std::optional<PackRow> prow, txn.GetPack(pack_id));
      CKPTFS_RETURN_IF_ERROR(
          txn.PutPack(pack_id, PackRow{std::max(prow ? prow->committed : 0, end)}));
    }
    CKPTFS_RETURN_IF_ERROR(DropChunksInTxn(txn, std::move(dead), report));
    CKPTFS_RETURN_IF_ERROR(txn.Commit());
  }
  return Status::OK();
}

Status Store::RewritePack(uint32_t pack_id, const std::vector<std::pair<ChunkId, ChunkRow>>& live,
                          const GcOptions& options, GcReport* report) {
  // Copy the live records; a record that fails its checksum stops the rewrite of this pack,
  // which then stays as it is for `ckptfs verify` to report.
  std::vector<std::pair<ChunkId, PackLocation>> moved;
  for (const auto& [id, row] : live) {
    CKPTFS_ASSIGN_OR_RETURN(CheckedRecord record, reader_->ReadRecord(id, row));
    CKPTFS_ASSIGN_OR_RETURN(PackLocation loc,
                            packs_->Append(record.header, std::move(record.payload)));
    moved.emplace_back(id, loc);
    if (options.after_record_copied) options.after_record_copied();
  }
  Status synced = packs_->Sync();
  for (const auto& entry : moved) {
    if (!packs_->IsDurable(entry.second))
      return synced.ok() ? Status::IOError("gc copy lost") : synced;
  }

  std::unique_lock gc(gc_mu_);
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, pinned] : pinned_) {
      if (pinned.row.pack_id == pack_id) {
        report->skipped.push_back(PackFileName(pack_id) + ": a writer is using it");
        return Status::OK();
      }
    }
  }
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginWrite());
  std::map<uint32_t, uint64_t> pack_ends;
  for (const auto& [id, loc] : moved) {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(id));
    if (!row || row->pack_id != pack_id) continue;
    row->pack_id = loc.pack_id;
    row->offset = loc.offset;
    CKPTFS_RETURN_IF_ERROR(txn.PutChunk(id, *row));
    uint64_t& end = pack_ends[loc.pack_id];
    end = std::max(end, loc.offset + loc.length);
  }
  for (const auto& [id, end] : pack_ends) {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<PackRow> row, txn.GetPack(id));
    CKPTFS_RETURN_IF_ERROR(txn.PutPack(id, PackRow{std::max(row ? row->committed : 0, end)}));
  }
  CKPTFS_RETURN_IF_ERROR(txn.DeletePack(pack_id));
  CKPTFS_RETURN_IF_ERROR(txn.Commit());
  report->records_moved += moved.size();
  ++report->packs_deleted;
  return DeletePackFile(pack_id);
}

}  // namespace ckptfs
