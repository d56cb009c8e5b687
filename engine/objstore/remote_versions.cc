#include "engine/objstore/remote_versions.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "engine/namespace/filesystem.h"
#include "engine/namespace/inode.h"
#include "engine/store/catalog.h"
#include "engine/store/record.h"
#include "engine/store/store.h"
#include "engine/util/file.h"

namespace ckptfs::objstore {
namespace {

namespace fs = std::filesystem;
constexpr int kPartFormat = 1;

std::string VersionsPrefix(const S3Location& loc) { return loc.Key("versions/"); }

// "rank-R-of-N" -> (R, N).
bool ParsePartName(const std::string& name, int* rank, int* world) {
  int r = -1, n = -1, used = 0;
  if (std::sscanf(name.c_str(), "rank-%d-of-%d%n", &r, &n, &used) != 2 ||
      static_cast<size_t>(used) != name.size() || r < 0 || n < 1 || r >= n) {
    return false;
  }
  *rank = r;
  *world = n;
  return true;
}

// The sealed versions of the local namespace with the regular files directly in each.
Result<std::map<std::string, std::vector<std::string>>> SealedVersions(const Catalog& catalog) {
  std::map<std::string, std::vector<std::string>> out;
  CKPTFS_ASSIGN_OR_RETURN(Catalog::ReadTxn txn, catalog.BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::vector<DirEntry> top, ListDirents(txn, kRootIno));
  for (const DirEntry& e : top) {
    if (!S_ISDIR(e.mode)) continue;
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> dir, GetInode(txn, e.ino));
    if (!dir || !dir->sealed()) continue;
    CKPTFS_ASSIGN_OR_RETURN(std::vector<DirEntry> files, ListDirents(txn, e.ino));
    std::vector<std::string>& names = out[e.name];
    for (const DirEntry& f : files) {
      if (S_ISREG(f.mode)) names.push_back(f.name);
    }
  }
  return out;
}

}  // namespace

std::string RemoteVersions::PartKey(const S3Location& loc, const std::string& version, int rank,
                                    int world_size) {
  return VersionsPrefix(loc) + version + "/rank-" + std::to_string(rank) + "-of-" +
         std::to_string(world_size);
}

Result<std::vector<VersionPart>> RemoteVersions::ListParts(
    S3Client& s3, const S3Location& loc, std::map<std::string, VersionPart>* known) {
  const std::string prefix = VersionsPrefix(loc);
  CKPTFS_ASSIGN_OR_RETURN(std::vector<ObjectEntry> keys, s3.List(loc.bucket, prefix));
  std::vector<VersionPart> parts;
  for (const ObjectEntry& e : keys) {
    const std::string rest = e.key.substr(prefix.size());
    const size_t slash = rest.find('/');
    VersionPart part;
    if (slash == std::string::npos ||
        !ParsePartName(rest.substr(slash + 1), &part.rank, &part.world_size)) {
      continue;
    }
    part.version = rest.substr(0, slash);
    if (known) {
      auto it = known->find(e.key);
      if (it != known->end()) {
        parts.push_back(it->second);
        continue;
      }
    }
    Result<Buffer> body = s3.Get(loc.bucket, e.key);
    if (!body.ok() && body.status().IsNotFound()) continue;  // deleted since the listing
    CKPTFS_RETURN_IF_ERROR(body.status());
    nlohmann::json doc = nlohmann::json::parse(AsChars(body->bytes()), nullptr, false);
    if (doc.is_discarded() || !doc.is_object() || doc.value("format", 0) != kPartFormat ||
        !doc["node"].is_string() || !doc["seq"].is_number_unsigned() ||
        !doc["files"].is_array()) {
      spdlog::warn("ignoring s3://{}/{}: not a version part this ckptfs reads", loc.bucket,
                   e.key);
      continue;
    }
    part.node = doc["node"].get<std::string>();
    part.seq = doc["seq"].get<uint64_t>();
    for (const auto& f : doc["files"]) {
      if (f.is_string()) part.files.push_back(f.get<std::string>());
    }
    if (known) (*known)[e.key] = part;
    parts.push_back(std::move(part));
  }
  return parts;
}

std::unique_ptr<RemoteVersions> RemoteVersions::Start(S3Client* s3, BucketMirror* mirror,
                                                      Store* store, FileSystem* fs,
                                                      RemotePacks* remote,
                                                      RemoteVersionsOptions options) {
  std::unique_ptr<RemoteVersions> v(new RemoteVersions(s3, mirror, store, fs, remote, options));
  v->thread_ = std::thread([p = v.get()] { p->Loop(); });
  return v;
}

RemoteVersions::RemoteVersions(S3Client* s3, BucketMirror* mirror, Store* store, FileSystem* fs,
                               RemotePacks* remote, RemoteVersionsOptions options)
    : s3_(s3),
      mirror_(mirror),
      store_(store),
      fs_(fs),
      remote_(remote),
      options_(options) {}

RemoteVersions::~RemoteVersions() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void RemoteVersions::Loop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    lock.Unlock();
    if (Status st = PollOnce(); !st.ok()) {
      spdlog::warn("versions in {}: {}", mirror_->location().ToString(), st.ToString());
    }
    lock.Lock();
    if (stopping_) break;
    cv_.WaitFor(lock, options_.poll);
  }
}

Status RemoteVersions::PollOnce() {
  MutexLock poll(poll_mu_);
  const S3Location& loc = mirror_->location();
  CKPTFS_ASSIGN_OR_RETURN(std::vector<VersionPart> parts, ListParts(*s3_, loc, &known_));
  // version -> world size -> rank -> part
  std::map<std::string, std::map<int, std::map<int, VersionPart>>> by_version;
  // Not announced (again): versions whose part of this rank exists (from this node, or a node
  // that held this rank before it), and versions complete in the bucket (one this node added
  // from there is one of those).
  std::set<std::string> skip;
  for (VersionPart& p : parts) {
    if (options_.world_size > 0 && p.rank == options_.rank &&
        p.world_size == options_.world_size) {
      skip.insert(p.version);
    }
    by_version[p.version][p.world_size][p.rank] = std::move(p);
  }
  for (const auto& [version, worlds] : by_version) {
    for (const auto& [world, ranks] : worlds) {
      if (static_cast<int>(ranks.size()) == world) skip.insert(version);
    }
  }
  if (options_.world_size > 0) CKPTFS_RETURN_IF_ERROR(Announce(skip));

  std::set<std::string> local;
  {
    CKPTFS_ASSIGN_OR_RETURN(Catalog::ReadTxn txn, store_->catalog().BeginRead());
    CKPTFS_ASSIGN_OR_RETURN(std::vector<DirEntry> top, ListDirents(txn, kRootIno));
    for (const DirEntry& e : top) local.insert(e.name);
  }
  for (const auto& [version, worlds] : by_version) {
    if (local.count(version) > 0) continue;
    for (const auto& [world, ranks] : worlds) {
      if (static_cast<int>(ranks.size()) != world) continue;  // not every rank committed yet
      std::vector<VersionPart> complete;
      for (const auto& [rank, part] : ranks) complete.push_back(part);
      Status st = Import(version, complete);
      if (st.ok()) {
        failed_.erase(version);
        spdlog::info("version {} of {} ranks added from {}", version, world, loc.ToString());
      } else if (failed_.insert(version).second) {
        spdlog::warn("cannot add version {} from {} (retried every poll): {}", version,
                     loc.ToString(), st.ToString());
      }
      break;
    }
  }
  return Status::OK();
}

Status RemoteVersions::Announce(const std::set<std::string>& skip) {
  CKPTFS_ASSIGN_OR_RETURN(auto sealed, SealedVersions(store_->catalog()));
  bool published = false;
  for (const auto& [version, files] : sealed) {
    if (skip.count(version) > 0 || files.empty()) continue;
    if (!published) {
      // The part names a manifest that holds the version's files: publish first.
      CKPTFS_RETURN_IF_ERROR(mirror_->Publish());
      published = true;
    }
    nlohmann::json doc = {{"format", kPartFormat},
                          {"version", version},
                          {"rank", options_.rank},
                          {"world_size", options_.world_size},
                          {"node", mirror_->node()},
                          {"seq", mirror_->published_seq()},
                          {"files", files}};
    const std::string text = doc.dump();
    CKPTFS_RETURN_IF_ERROR(s3_->Put(mirror_->location().bucket,
                                    PartKey(mirror_->location(), version, options_.rank,
                                            options_.world_size),
                                    AsBytes(text)));
    spdlog::info("version {}: rank {} of {} published ({} files, manifest {})", version,
                 options_.rank, options_.world_size, files.size(), mirror_->published_seq());
  }
  return Status::OK();
}

Status RemoteVersions::Import(const std::string& version, const std::vector<VersionPart>& parts) {
  const S3Location& loc = mirror_->location();
  struct Found {
    ChunkRow row;   // as in the owner's catalog
    size_t part;    // whose packs it lies in
  };
  std::unordered_map<ChunkId, Found> found;
  std::vector<BucketMirror::Publication> pubs;
  std::vector<FileSystem::ExternalFile> files;
  nlohmann::json listing = nlohmann::json::array();
  const fs::path scratch = store_->dir() / "import-image";
  std::error_code ec;
  for (size_t i = 0; i < parts.size(); ++i) {
    const VersionPart& part = parts[i];
    listing.push_back({{"rank", part.rank},
                       {"node", part.node},
                       {"manifest", part.seq},
                       {"files", part.files}});
    CKPTFS_ASSIGN_OR_RETURN(BucketMirror::Publication pub,
                            BucketMirror::ReadPublication(*s3_, loc, part.node, part.seq));
    CKPTFS_ASSIGN_OR_RETURN(Buffer image, BucketMirror::GetObject(*s3_, loc, pub.image_sha256));
    fs::remove_all(scratch, ec);
    fs::create_directories(scratch, ec);
    if (ec) return Status::FromErrno(ec.value(), "create " + scratch.string());
    CKPTFS_RETURN_IF_ERROR(
        WriteFileAtomic(scratch / "data.mdb", std::string_view(AsChars(image.bytes()))));
    {
      CKPTFS_ASSIGN_OR_RETURN(auto theirs, Catalog::Open(scratch));
      CKPTFS_ASSIGN_OR_RETURN(Catalog::ReadTxn txn, theirs->BeginRead());
      CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> dir, GetDirent(txn, kRootIno, version));
      if (!dir) {
        return Status::Corruption("node " + part.node + "'s manifest " +
                                  std::to_string(part.seq) + " lacks version " + version);
      }
      for (const std::string& name : part.files) {
        CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> ino, GetDirent(txn, *dir, name));
        std::optional<Inode> inode;
        if (ino) {
          CKPTFS_ASSIGN_OR_RETURN(inode, GetInode(txn, *ino));
        }
        if (!inode || !inode->is_reg()) {
          return Status::Corruption("node " + part.node + " lists " + version + "/" + name +
                                    ", which its catalog lacks");
        }
        FileSystem::ExternalFile file;
        file.name = name;
        file.size = inode->size;
        std::vector<ChunkId> todo;
        if (inode->content != 0) {
          CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(inode->content, 0, [&](const ChunkRef& r) {
            file.chunks.push_back({r.id, r.length, std::nullopt, {}});
            todo.push_back(r.id);
            return true;
          }));
        }
        // The chunks and the delta bases they are rebuilt from.
        while (!todo.empty()) {
          ChunkId id = todo.back();
          todo.pop_back();
          if (found.count(id) > 0) continue;
          CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(id));
          if (!row) {
            return Status::Corruption("node " + part.node + "'s catalog lacks chunk " +
                                      id.ShortHex() + " of " + version + "/" + name);
          }
          found[id] = {*row, i};
          if (IsDelta(row->transform)) todo.push_back(row->base);
        }
        files.push_back(std::move(file));
      }
    }
    pubs.push_back(std::move(pub));
  }
  fs::remove_all(scratch, ec);

  // The chunks this store lacks, and the packs of other nodes they lie in: each becomes a
  // local pack id whose bytes are the owner's segments (remote_packs.h), recorded (synced)
  // before the catalog points at them.
  {
    CKPTFS_ASSIGN_OR_RETURN(Catalog::ReadTxn txn, store_->catalog().BeginRead());
    for (auto it = found.begin(); it != found.end();) {
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> mine, txn.GetChunk(it->first));
      it = mine ? found.erase(it) : std::next(it);
    }
  }
  std::map<std::pair<size_t, uint32_t>, std::pair<uint32_t, uint64_t>> mapped;  // -> id, length
  std::map<uint32_t, std::vector<PackSegment>> new_packs;
  for (auto& [id, f] : found) {
    const auto key = std::make_pair(f.part, f.row.pack_id);
    if (mapped.count(key) == 0) {
      auto segs = pubs[f.part].packs.find(PackFileName(f.row.pack_id));
      if (segs == pubs[f.part].packs.end() || segs->second.empty()) {
        return Status::Corruption("node " + parts[f.part].node + "'s manifest " +
                                  std::to_string(parts[f.part].seq) + " lacks pack " +
                                  PackFileName(f.row.pack_id));
      }
      const uint64_t length = segs->second.back().offset + segs->second.back().length;
      CKPTFS_ASSIGN_OR_RETURN(auto pack, store_->CreateExternalPack(::getuid(), ::getgid()));
      {
        CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(pack.second, O_WRONLY));
        if (::ftruncate(fd.get(), static_cast<off_t>(length)) != 0) {
          return Status::FromErrno(errno, "truncate " + pack.second.string());
        }
        CKPTFS_RETURN_IF_ERROR(DataSync(fd.get(), pack.second));
      }
      mapped[key] = {pack.first, length};
      new_packs[pack.first] = segs->second;
    }
    const auto& [local_id, length] = mapped[key];
    if (f.row.offset + f.row.length > length) {
      return Status::Corruption("chunk " + id.ShortHex() + " lies past the published end of " +
                                "its pack on node " + parts[f.part].node);
    }
    f.row.pack_id = local_id;
  }
  if (!new_packs.empty()) CKPTFS_RETURN_IF_ERROR(remote_->AddPacks(new_packs));
  if (!found.empty()) {
    CKPTFS_RETURN_IF_ERROR(
        store_->catalog().Update(Catalog::SpaceUse::kNormal, [&](Catalog::WriteTxn& txn) {
          std::vector<ChunkId> added;
          for (const auto& [id, f] : found) {
            CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> mine, txn.GetChunk(id));
            if (mine) continue;  // stored meanwhile
            ChunkRow row = f.row;
            row.refcount = 0;  // the version's files and the deltas below add theirs
            CKPTFS_RETURN_IF_ERROR(txn.PutChunk(id, row));
            added.push_back(id);
          }
          for (const ChunkId& id : added) {
            const ChunkRow& row = found.at(id).row;
            if (!IsDelta(row.transform)) continue;
            CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> base, txn.GetChunk(row.base));
            if (!base) return Status::Corruption("delta base " + row.base.ShortHex() + " lost");
            ++base->refcount;
            CKPTFS_RETURN_IF_ERROR(txn.PutChunk(row.base, *base));
          }
          for (const auto& [key, pack] : mapped) {
            CKPTFS_RETURN_IF_ERROR(txn.PutPack(pack.first, PackRow{pack.second}));
          }
          return Status::OK();
        }));
  }
  nlohmann::json manifest = {{"version", version},
                             {"store", loc.ToString()},
                             {"world_size", parts.size()},
                             {"parts", listing}};
  Status added = fs_->AddExternalVersion(version, files, manifest.dump(1) + "\n",
                                         Caller{::getuid(), ::getgid()});
  if (added.code() == Status::Code::kAlreadyExists) return Status::OK();  // made here meanwhile
  return added;
}

}  // namespace ckptfs::objstore
