// Store::Verify: reads every record and checks it end to end, and checks every reference.
#include <map>
#include <unordered_map>

#include "engine/store/record.h"
#include "engine/store/store.h"

namespace ckptfs {

Result<VerifyReport> Store::Verify(const ProgressFn& progress) const {
  VerifyReport report;
  std::shared_lock gc(gc_mu_);
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
  // Namespace rows (inodes, directory entries, xattrs, content layouts) against their checksums.
  CKPTFS_RETURN_IF_ERROR(
      txn.CheckRows([&](const Status& s) { report.problems.push_back(s.message()); }));

  // References, recounted from the contents.
  std::unordered_map<ChunkId, uint64_t> refs;
  std::vector<std::pair<ContentId, ContentRow>> contents;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachContent([&](ContentId id, const ContentRow& row) {
    contents.emplace_back(id, row);
    return true;
  }));
  for (const auto& [id, row] : contents) {
    ++report.contents_checked;
    uint64_t expected = 0, count = 0;
    // id through an init-capture: clang 14 cannot capture a structured binding.
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, 0, [&, id = id](const ChunkRef& ref) {
      if (ref.offset != expected) {
        report.problems.push_back("content " + std::to_string(id) + ": chunk at offset " +
                                  std::to_string(ref.offset) + " leaves a gap or overlap");
      }
      expected = ref.offset + ref.length;
      ++count;
      ++refs[ref.id];
      return true;
    }));
    if (expected != row.size || count != row.chunk_count) {
      report.problems.push_back("content " + std::to_string(id) + ": chunks cover " +
                                std::to_string(expected) + " bytes, size is " +
                                std::to_string(row.size));
    }
  }

  std::map<uint32_t, PackRow> packs;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachPack([&](uint32_t id, const PackRow& row) {
    packs[id] = row;
    return true;
  }));
  for (const auto& [id, row] : packs) {
    std::error_code ec;
    auto size = std::filesystem::file_size(PackPath(id), ec);
    if (ec) {
      report.problems.push_back("pack " + PackFileName(id) + ": missing (" + ec.message() + ")");
    } else if (size < row.committed) {
      report.problems.push_back("pack " + PackFileName(id) + ": truncated to " +
                                std::to_string(size) + " bytes, " + std::to_string(row.committed) +
                                " were committed");
    }
  }

  std::vector<std::pair<ChunkId, ChunkRow>> chunks;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRow& row) {
    chunks.emplace_back(id, row);
    return true;
  }));
  // A delta references its base like a content does.
  std::unordered_map<ChunkId, const ChunkRow*> rows;
  for (const auto& [id, row] : chunks) {
    rows.emplace(id, &row);
    if (IsDelta(row.transform)) ++refs[row.base];
  }
  uint64_t total_bytes = 0, checked_bytes = 0;
  for (const auto& entry : chunks) total_bytes += entry.second.length;
  for (const auto& [id, row] : chunks) {
    if (progress) progress(checked_bytes, total_bytes);
    checked_bytes += row.length;
    ++report.chunks_checked;
    const std::string where =
        "pack " + PackFileName(row.pack_id) + " offset " + std::to_string(row.offset);
    auto it = refs.find(id);
    uint64_t counted = it == refs.end() ? 0 : it->second;
    if (counted != row.refcount) {
      report.problems.push_back(where + ": chunk " + id.ShortHex() + " has refcount " +
                                std::to_string(row.refcount) + " but " + std::to_string(counted) +
                                " references");
    }
    if (it != refs.end()) refs.erase(it);
    if (packs.count(row.pack_id) == 0) {
      report.problems.push_back(where + ": chunk " + id.ShortHex() + " is in a pack the " +
                                "catalog does not know");
      continue;
    }
    if (row.offset + row.length > packs[row.pack_id].committed) {
      report.problems.push_back(where + ": chunk " + id.ShortHex() + " lies past the pack's " +
                                "committed length " + std::to_string(packs[row.pack_id].committed) +
                                " (a damaged pack row, or the chunk row is)");
      report.damaged.emplace_back(id, report.problems.back());
    }
    if (IsDelta(row.transform)) {
      auto base = rows.find(row.base);
      if (base == rows.end()) {
        report.problems.push_back(where + ": chunk " + id.ShortHex() + " is a delta against " +
                                  row.base.ShortHex() + ", which the catalog lacks");
        report.damaged.emplace_back(id, report.problems.back());
        continue;
      }
      // An upper bound: gc may store a base whole again without touching the deltas above it.
      if (row.depth <= base->second->depth) {
        report.problems.push_back(where + ": chunk " + id.ShortHex() + " has delta depth " +
                                  std::to_string(row.depth) + " on a base of depth " +
                                  std::to_string(base->second->depth));
      }
    } else if (row.depth != 1) {
      report.problems.push_back(where + ": chunk " + id.ShortHex() + " is no delta but has depth " +
                                std::to_string(row.depth));
    }
    auto raw = reader_->Decode(id, row);
    if (!raw.ok()) {
      report.problems.push_back(raw.status().message());
      report.damaged.emplace_back(id, report.problems.back());
    } else if (ChunkId::Of(raw->bytes()) != id) {
      report.problems.push_back(where + ": chunk " + id.ShortHex() +
                                " decodes to bytes with another SHA-256");
      report.damaged.emplace_back(id, report.problems.back());
    }
  }
  if (progress) progress(checked_bytes, total_bytes);
  for (const auto& [id, count] : refs) {
    report.problems.push_back("chunk " + id.ShortHex() + ": referenced " + std::to_string(count) +
                              " times but missing from the catalog");
    report.damaged.emplace_back(id, report.problems.back());
  }
  return report;
}

}  // namespace ckptfs
