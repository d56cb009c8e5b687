// Store::Gc: drops unreferenced chunks (and then the delta bases only they referred to), stores
// whole again the deltas whose bases only deltas refer to (so that deleting old versions frees
// their chains), gives dead records' blocks back in place (holes), then rewrites packs whose
// live fraction is low.
//
// Crash safety: every step is one catalog transaction. Copies of live records are appended
// and synced before the transaction that points the chunks at them; a victim pack file is
// unlinked only after the transaction that forgets it. Killed at any point, the store opens
// consistent: uncommitted copies are cut as a pack tail, a forgotten pack file is deleted.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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
    MutexLock lock(mu_);
    CKPTFS_RETURN_IF_ERROR(
        catalog_->Update(Catalog::SpaceUse::kFreesSpace, [&](Catalog::WriteTxn& txn) {
          mu_.AssertHeld();           // runs inside Update, under the lock above
          report.chunks_dropped = 0;  // counted again if the transaction runs twice
          std::vector<ChunkId> dead;
          CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRow& row) {
            mu_.AssertHeld();
            if (row.refcount == 0 && pinned_.count(id) == 0) dead.push_back(id);
            return true;
          }));
          return DropChunksInTxn(txn, std::move(dead), &report);
        }));
  }

  // 1b. Bases that only deltas still refer to (their versions were deleted): the deltas on
  // them that contents use are stored whole again, and the chains below them go.
  CKPTFS_RETURN_IF_ERROR(RematerializeOrphanedDeltas(&report));

  // 2. Live records per pack, and the packs to rewrite: mostly dead ones no writer is using.
  // Pins are read before the snapshot, under gc_mu_, where no writer is between appending a
  // record and pinning it (PutChunk does both under gc_mu_): a pack without pins gains no chunk
  // row after the snapshot unless it is an active pack (one per lane), and the active packs are
  // closed here if one is a victim (before a writer's record or a gc copy can land in it).
  std::map<uint32_t, std::vector<std::pair<ChunkId, ChunkRow>>> live;
  std::vector<uint32_t> victims;
  std::map<uint32_t, uint64_t> committed;
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> in_use;  // record extents
  {
    std::unique_lock gc(gc_mu_);
    std::set<uint32_t> busy;
    {
      MutexLock lock(mu_);
      for (const auto& [id, pinned] : pinned_) {
        busy.insert(pinned.row.pack_id);
        in_use[pinned.row.pack_id].emplace_back(pinned.row.offset, pinned.row.length);
      }
      for (const PackLocation& loc : reencode_appended_) {
        busy.insert(loc.pack_id);
        in_use[loc.pack_id].emplace_back(loc.offset, loc.length);
      }
    }
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
    CKPTFS_RETURN_IF_ERROR(txn.ForEachPack([&](uint32_t id, const PackRow& row) {
      committed[id] = row.committed;
      return true;
    }));
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRow& row) {
      live[row.pack_id].emplace_back(id, row);
      in_use[row.pack_id].emplace_back(row.offset, row.length);
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
    std::vector<uint32_t> active_victims;
    for (const PackExtent& e : packs_->active_extents()) {
      if (std::find(victims.begin(), victims.end(), e.pack_id) != victims.end())
        active_victims.push_back(e.pack_id);
    }
    if (!active_victims.empty()) {
      Status rotated = packs_->Rotate();
      if (rotated.IsNoSpace()) {  // no room for a new pack: the active ones stay
        for (uint32_t id : active_victims) {
          report.skipped.push_back(PackFileName(id) + ": no room for a new pack to write to");
          victims.erase(std::find(victims.begin(), victims.end(), id));
        }
      } else {
        CKPTFS_RETURN_IF_ERROR(rotated);
      }
    }
  }

  // 2b. Dead records give their blocks back where they lie (holes punched between the records
  // in use), which needs no room for copies: on a full disk this is what frees the space of
  // deleted versions whose records share packs with live ones. Ranges below a pack's committed
  // length that no row or pin pointed at in the snapshot above stay dead: records are only
  // ever appended at a pack's end.
  for (const auto& [pack_id, length] : committed) {
    PunchDeadRanges(pack_id, length, std::move(in_use[pack_id]), &report);
  }
  // 3. Rewrite them, emptiest first: a dead pack is deleted without copying anything, so on a
  // full disk those free the space that the copies of the others need.
  auto live_bytes = [&](uint32_t pack_id) {
    uint64_t bytes = 0;
    for (const auto& entry : live[pack_id]) bytes += entry.second.length;
    return bytes;
  };
  std::stable_sort(victims.begin(), victims.end(),
                   [&](uint32_t a, uint32_t b) { return live_bytes(a) < live_bytes(b); });
  uint64_t to_copy = 0, copied = 0;
  for (uint32_t pack_id : victims) to_copy += live_bytes(pack_id);
  auto on_copied = [&](uint64_t bytes) {
    copied += bytes;
    if (options.progress) options.progress(std::min(copied, to_copy), to_copy);
  };
  if (options.progress && to_copy > 0) options.progress(0, to_copy);
  for (uint32_t pack_id : victims) {
    Status s = RewritePack(pack_id, live[pack_id], options, on_copied, &report);
    if (!s.ok()) {
      if (s.IsCorruption()) {
        report.skipped.push_back(PackFileName(pack_id) + ": " + s.message());
        continue;
      }
      if (s.IsNoSpace()) {
        report.skipped.push_back(PackFileName(pack_id) +
                                 ": no room to copy its live records (delete more versions, "
                                 "then run gc again)");
        continue;
      }
      return s;
    }
  }
  if (options.progress && to_copy > 0) options.progress(to_copy, to_copy);  // skips included
  report.pack_bytes_after = PackBytesOnDisk();
  if (!catalog_->reserve_held()) {
    Status refill = catalog_->RefillReserve();
    if (!refill.ok())
      spdlog::warn("gc: the space reserve is still released: {}", refill.ToString());
  }
  spdlog::info(
      "gc: dropped {} chunks, stored {} deltas whole, moved {} records, deleted {} packs, freed "
      "{} bytes in place, {} -> {} bytes",
      report.chunks_dropped, report.deltas_rematerialized, report.records_moved,
      report.packs_deleted, report.pack_bytes_punched, report.pack_bytes_before,
      report.pack_bytes_after);
  return report;
}

Status Store::DropChunksInTxn(Catalog::WriteTxn& txn, std::vector<ChunkId> dead, GcReport* report) {
  // A dropped delta releases its base, which may go in turn.
  while (!dead.empty()) {
    const ChunkId id = dead.back();
    dead.pop_back();
    CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(id));
    if (!row) continue;
    CKPTFS_RETURN_IF_ERROR(txn.DeleteChunk(id));
    // Stored again later (a first version's piece), the chunk would look promoted.
    CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kContentMeta, PromotedKey(id)));
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
      // Bindings are captured through init-captures (clang 14 cannot capture them directly).
      Result<Buffer> raw = [&, &id = id, &row = row]() -> Result<Buffer> {
        std::shared_lock gc(gc_mu_);
        return reader_->Decode(id, row);
      }();
      if (!raw.ok()) {
        report->skipped.push_back("chunk " + id.ShortHex() + ": " + raw.status().message());
        continue;
      }
      EncodedPiece piece = EncodePiece(*options_.codec, raw->bytes(), row.width, nullptr);
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
    MutexLock lock(mu_);
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
                          const GcOptions& options, const std::function<void(uint64_t)>& copied,
                          GcReport* report) {
  // Copy the live records; a record that fails its checksum stops the rewrite of this pack,
  // which then stays as it is for `ckptfs verify` to report.
  std::vector<std::pair<ChunkId, PackLocation>> moved;
  for (const auto& [id, row] : live) {
    CKPTFS_ASSIGN_OR_RETURN(CheckedRecord record, reader_->ReadRecord(id, row));
    CKPTFS_ASSIGN_OR_RETURN(PackLocation loc,
                            packs_->Append(record.header, std::move(record.payload)));
    moved.emplace_back(id, loc);
    copied(row.length);
    if (options.after_record_copied) options.after_record_copied();
  }
  Status synced = packs_->Sync();
  for (const auto& entry : moved) {
    if (!packs_->IsDurable(entry.second))
      return synced.ok() ? Status::IOError("gc copy lost") : synced;
  }

  std::unique_lock gc(gc_mu_);
  {
    MutexLock lock(mu_);
    for (const auto& [id, pinned] : pinned_) {
      if (pinned.row.pack_id == pack_id) {
        report->skipped.push_back(PackFileName(pack_id) + ": a writer is using it");
        return Status::OK();
      }
    }
  }
  CKPTFS_RETURN_IF_ERROR(
      catalog_->Update(Catalog::SpaceUse::kFreesSpace, [&](Catalog::WriteTxn& txn) {
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
        return txn.DeletePack(pack_id);
      }));
  report->records_moved += moved.size();
  ++report->packs_deleted;
  return DeletePackFile(pack_id);
}

void Store::PunchDeadRanges(uint32_t pack_id, uint64_t committed,
                            std::vector<std::pair<uint64_t, uint64_t>> in_use, GcReport* report) {
  // Not worth the syscalls below this. It was 1 MiB, counted over the pack: a forgotten
  // version smaller than that (a 1 MiB tensor stored as a delta) stayed in a pack whose live
  // fraction was above rewrite_below until more garbage joined it, so whether the space came
  // back depended on how forgets were batched into gc passes (cli_retention, flaky).
  constexpr uint64_t kMinDeadBytes = 64u << 10;
  uint64_t used = kPackHeaderBytes;
  for (const auto& extent : in_use) used += extent.second;
  if (committed < used + kMinDeadBytes) return;
  std::sort(in_use.begin(), in_use.end());
  const std::filesystem::path path = PackPath(pack_id);
  auto fd = OpenFile(path, O_RDONLY | O_CLOEXEC);  // for the allocated blocks
  if (!fd.ok()) {
    report->skipped.push_back(PackFileName(pack_id) + ": " + fd.status().message());
    return;
  }
  auto allocated = [&]() -> uint64_t {
    struct stat st {};
    return ::fstat(fd->get(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
  };
  const uint64_t before = allocated();
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  uint64_t from = kPackHeaderBytes;   // start of the current gap
  in_use.emplace_back(committed, 0);  // the gap before the committed end
  for (const auto& [offset, length] : in_use) {
    const uint64_t to = std::min(offset, committed);
    if (to > from) gaps.emplace_back(from, to);
    from = std::max(from, offset + length);
  }
  Status s = packs_->PunchDead(pack_id, gaps);
  // NotSupported: a filesystem without holes; gc then frees space only by rewriting packs.
  if (!s.ok() && !s.IsNotSupported()) {
    report->skipped.push_back(PackFileName(pack_id) + ": punching a hole failed: " + s.message());
  }
  const uint64_t after = allocated();
  if (before > after) report->pack_bytes_punched += before - after;
}

}  // namespace ckptfs
