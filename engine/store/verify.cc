// Store::Verify: reads every record and checks it end to end, and checks every reference.
#include <map>
#include <unordered_map>

#include "engine/store/record.h"
#include "engine/store/store.h"

namespace ckptfs {

Result<VerifyReport> Store::Verify() const {
  VerifyReport report;
  std::shared_lock gc(gc_mu_);
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());

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
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, 0, [&](const ChunkRef& ref) {
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
  for (const auto& [id, row] : chunks) {
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
    auto record = ReadRecord(id, row);
    if (!record.ok()) {
      report.problems.push_back(record.status().message());
      continue;
    }
    Buffer raw(row.raw_len);
    Status s =
        Decompress(row.codec, record->bytes().subspan(kRecordHeaderBytes), raw.mutable_bytes());
    if (!s.ok()) {
      report.problems.push_back(where + ": " + s.message());
    } else if (ChunkId::Of(raw.bytes()) != id) {
      report.problems.push_back(where + ": chunk " + id.ShortHex() +
                                " decodes to bytes with another SHA-256");
    }
  }
  for (const auto& [id, count] : refs) {
    report.problems.push_back("chunk " + id.ShortHex() + ": referenced " + std::to_string(count) +
                              " times but missing from the catalog");
  }
  return report;
}

}  // namespace ckptfs
