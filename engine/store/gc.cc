// Store::Gc: drops unreferenced chunks, then rewrites packs whose live fraction is low.
//
// Crash safety: every step is one catalog transaction. Copies of live records are appended
// and synced before the transaction that points the chunks at them; a victim pack file is
// unlinked only after the transaction that forgets it. Killed at any point, the store opens
// consistent: uncommitted copies are cut as a pack tail, a forgotten pack file is deleted.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>

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
    for (const ChunkId& id : dead) CKPTFS_RETURN_IF_ERROR(txn.DeleteChunk(id));
    CKPTFS_RETURN_IF_ERROR(txn.Commit());
    report.chunks_dropped = dead.size();
  }

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
  spdlog::info("gc: dropped {} chunks, moved {} records, deleted {} packs, {} -> {} bytes",
               report.chunks_dropped, report.records_moved, report.packs_deleted,
               report.pack_bytes_before, report.pack_bytes_after);
  return report;
}

Status Store::RewritePack(uint32_t pack_id, const std::vector<std::pair<ChunkId, ChunkRow>>& live,
                          const GcOptions& options, GcReport* report) {
  // Copy the live records; a record that fails its checksum stops the rewrite of this pack,
  // which then stays as it is for `ckptfs verify` to report.
  std::vector<std::pair<ChunkId, PackLocation>> moved;
  for (const auto& [id, row] : live) {
    CKPTFS_ASSIGN_OR_RETURN(Buffer record, ReadRecord(id, row));
    CKPTFS_ASSIGN_OR_RETURN(RecordHeader header, RecordHeader::Decode(record.bytes()));
    Buffer payload(record.bytes().subspan(kRecordHeaderBytes));
    CKPTFS_ASSIGN_OR_RETURN(PackLocation loc, packs_->Append(header, std::move(payload)));
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
