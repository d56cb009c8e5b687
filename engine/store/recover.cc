// Store::RecoverPacks: what opening a store does to its packs after a crash (store.h).
//
// A pack's row holds its committed length; a crash leaves an uncommitted tail past it (records
// written, their catalog transaction not committed), and a pack that no commit ever referred
// to. Both go. But a row is one catalog value, and a flipped byte in it must not destroy data:
// a flipped length would cut committed records off, a flipped key would leave a live pack
// without a row. So neither cut nor removal happens on the word of the pack row alone: the
// chunk rows that point into the pack are checked against the records they name (each record
// header carries its chunk id, its length and a checksum), and a record so confirmed past the
// cut, or in a pack about to be removed, keeps the pack as it is (an error in the log; `ckptfs
// verify` names the rows). A chunk row whose record does not confirm it is itself damaged and
// proves nothing.
#include <spdlog/spdlog.h>

#include <array>
#include <map>
#include <set>

#include "engine/store/record.h"
#include "engine/store/store.h"
#include "engine/util/file.h"

namespace ckptfs {
namespace {

// How many of the newest packs are looked at for each lane's pack to go on appending to.
constexpr int kResumeCandidates = 8;

struct PackFile {
  std::filesystem::path path;
  uint64_t size = 0;
};

// Whether the record that `row` names lies at row.offset of pack `fd` as the row says: its
// header decodes (magic, checksum), names chunk `id` and has the row's length.
bool RecordConfirms(int fd, const std::filesystem::path& path, const ChunkId& id,
                    const ChunkRow& row) {
  std::byte header[kRecordHeaderBytes];
  if (!PReadFull(fd, row.offset, {header, kRecordHeaderBytes}, path).ok()) return false;
  auto h = RecordHeader::Decode({header, kRecordHeaderBytes});
  return h.ok() && h->id == id && kRecordHeaderBytes + uint64_t{h->stored_len} == row.length;
}

// The end of the last record of pack `id` (open as fd) past `from` that a chunk row points at
// and the record confirms; 0 when there is none.
Result<uint64_t> ConfirmedEndPast(const Catalog& catalog, uint32_t id, int fd,
                                  const std::filesystem::path& path, uint64_t from) {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog.BeginRead());
  uint64_t end = 0;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& chunk, const ChunkRow& row) {
    if (row.pack_id == id && row.offset + row.length > from &&
        RecordConfirms(fd, path, chunk, row)) {
      end = std::max(end, row.offset + row.length);
    }
    return true;
  }));
  return end;
}

}  // namespace

Result<Store::RecoveredPacks> Store::RecoverPacks() {
  std::map<uint32_t, PackRow> rows;
  {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
    CKPTFS_RETURN_IF_ERROR(txn.ForEachPack([&](uint32_t id, const PackRow& row) {
      rows[id] = row;
      return true;
    }));
  }
  std::map<uint32_t, PackFile> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator dir(dir_ / "packs", ec), end; !ec && dir != end;
       dir.increment(ec)) {
    uint32_t id;
    if (!ParsePackFileName(dir->path().filename().string(), &id)) continue;
    files[id].path = dir->path();
  }
  if (ec) return Status::IOError("list " + (dir_ / "packs").string() + ": " + ec.message());

  uint32_t max_id = 0;
  for (auto& [id, file] : files) {
    max_id = std::max(max_id, id);
    auto it = rows.find(id);
    const uint64_t committed = it == rows.end() ? 0 : it->second.committed;
    CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(file.path, O_RDWR));
    CKPTFS_ASSIGN_OR_RETURN(file.size, FileSize(fd.get(), file.path));
    if (it != rows.end() && file.size < committed) {
      spdlog::error(
          "pack {} is shorter than its committed length ({} < {}): records past the "
          "end are lost; run `ckptfs verify`",
          file.path.string(), file.size, committed);
      continue;
    }
    if (it != rows.end() && file.size == committed) continue;
    // A tail past the committed length, or a pack without a row: only bytes no confirmed
    // record lies in may go (a scan of the chunk rows; after a crash only).
    CKPTFS_ASSIGN_OR_RETURN(uint64_t confirmed,
                            ConfirmedEndPast(*catalog_, id, fd.get(), file.path, committed));
    if (confirmed > 0) {
      spdlog::error(
          "pack {}: {}, but chunk rows point at records up to byte {} and the records are "
          "there: the catalog is damaged. The pack is kept as it is; run `ckptfs verify`",
          file.path.string(),
          it == rows.end()
              ? std::string("the catalog has no row for it")
              : "the catalog's row says " + std::to_string(committed) + " bytes are committed",
          confirmed);
      continue;
    }
    if (it == rows.end()) {
      // Created, but no commit ever referred to it (or gc deleted it and crashed before unlink).
      spdlog::info("removing pack {}: no committed record refers to it", file.path.string());
      fd = FileDescriptor();
      CKPTFS_RETURN_IF_ERROR(DeletePackFile(id));
      file.size = 0;
      continue;
    }
    spdlog::info("cutting the uncommitted tail of pack {}: {} -> {} bytes", file.path.string(),
                 file.size, committed);
    if (::ftruncate(fd.get(), static_cast<off_t>(committed)) != 0) {
      return Status::FromErrno(errno, "truncate " + file.path.string());
    }
    CKPTFS_RETURN_IF_ERROR(DataSync(fd.get(), file.path));
    file.size = committed;
  }
  for (const auto& [id, row] : rows) max_id = std::max(max_id, id);

  // Each lane goes on appending to its last pack (the header says whose it is) where the pack
  // is whole up to its committed length. The newest few packs are looked at: a lane without
  // one among them (a store written before lanes) starts a pack when it is first used.
  RecoveredPacks out{{}, max_id + 1};
  std::array<bool, kPackLanes> seen{};
  int looked = 0;
  for (auto it = rows.rbegin(); it != rows.rend() && looked < kResumeCandidates; ++it, ++looked) {
    auto file = files.find(it->first);
    if (file == files.end() || file->second.size < kPackHeaderBytes) continue;
    std::byte header[kPackHeaderBytes];
    CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(file->second.path, O_RDONLY));
    if (!PReadFull(fd.get(), 0, {header, kPackHeaderBytes}, file->second.path).ok() ||
        !CheckPackHeader({header, kPackHeaderBytes}, it->first).ok()) {
      continue;
    }
    const PackLane lane = PackLaneOf({header, kPackHeaderBytes});
    if (seen[static_cast<size_t>(lane)]) continue;
    seen[static_cast<size_t>(lane)] = true;
    if (file->second.size == it->second.committed) {
      out.resume.push_back(PackExtent{it->first, file->second.size, lane});
    }
  }
  return out;
}

}  // namespace ckptfs
