// FileSystem: versions written outside FUSE by the snapshot engine (docs/snapshot.md). The
// daemon's control server calls AddExternalVersion once every rank committed; the version
// directory, its files, their contents and chunk references and the seal are one catalog
// transaction (the manifest writer's commit hook).
#include <unistd.h>

#include <chrono>

#include "engine/namespace/filesystem.h"

namespace ckptfs {
namespace {

// The namespace counters of filesystem.cc (the same meta keys).
constexpr char kNextInoKey[] = "next_ino";

Status CheckVersionName(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 255 ||
      name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("bad version name");
  }
  return Status::OK();
}

// A new inode under `parent` with the next inode number.
Result<Inode> NewInode(Catalog::WriteTxn& txn, Ino parent, Ino version, uint32_t mode,
                       const Caller& owner, int64_t now) {
  CKPTFS_ASSIGN_OR_RETURN(uint64_t last, txn.GetCounter(kNextInoKey));
  Inode n;
  n.ino = last + 1;
  CKPTFS_RETURN_IF_ERROR(txn.PutCounter(kNextInoKey, n.ino));
  n.mode = mode;
  n.uid = owner.uid;
  n.gid = owner.gid;
  n.nlink = S_ISDIR(mode) ? 2 : 1;
  n.atime_ns = n.mtime_ns = n.ctime_ns = now;
  n.parent = parent;
  n.version = version == 0 ? n.ino : version;
  return n;
}

Status AddFile(Catalog::WriteTxn& txn, const Inode& dir, std::string_view name, ContentId content,
               uint64_t size, const Caller& owner, int64_t now) {
  CKPTFS_ASSIGN_OR_RETURN(Inode f, NewInode(txn, dir.ino, dir.ino, S_IFREG | 0644, owner, now));
  f.content = content;
  f.size = size;
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, f));
  return txn.Put(Table::kDirents, DirentKey(dir.ino, name), EncodeDirent(f.ino, f.mode));
}

}  // namespace

Status FileSystem::CheckVersionNameFree(std::string_view name) {
  CKPTFS_RETURN_IF_ERROR(CheckVersionName(name));
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> existing, GetDirent(txn, kRootIno, name));
  if (existing) return Status::AlreadyExists("version " + std::string(name) + " exists");
  return Status::OK();
}

Status FileSystem::AddExternalVersion(std::string_view name, const std::vector<ExternalFile>& files,
                                      std::string_view manifest, const Caller& owner) {
  CKPTFS_RETURN_IF_ERROR(CheckVersionName(name));
  for (const ExternalFile& f : files) {
    CKPTFS_RETURN_IF_ERROR(CheckVersionName(f.name));
    if (f.name == "manifest.json") return Status::InvalidArgument("manifest.json is reserved");
  }
  auto writer = store_->NewWriter();
  CKPTFS_RETURN_IF_ERROR(writer->Append(AsBytes(manifest)));
  auto hook = [&](Catalog::WriteTxn& txn, ContentId manifest_id) -> Status {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> existing, GetDirent(txn, kRootIno, name));
    if (existing) return Status::AlreadyExists("version " + std::string(name) + " exists");
    const int64_t now = NowUnixNs();
    CKPTFS_ASSIGN_OR_RETURN(Inode root, MustGet(txn, kRootIno));
    CKPTFS_ASSIGN_OR_RETURN(Inode dir, NewInode(txn, kRootIno, 0, S_IFDIR | 0755, owner, now));
    CKPTFS_ASSIGN_OR_RETURN(dir.version_seq, TakeVersionSeq(txn));
    dir.flags |= Inode::kSealed;  // complete when it appears
    CKPTFS_RETURN_IF_ERROR(PutInode(txn, dir));
    CKPTFS_RETURN_IF_ERROR(
        txn.Put(Table::kDirents, DirentKey(kRootIno, name), EncodeDirent(dir.ino, dir.mode)));
    root.mtime_ns = root.ctime_ns = now;
    ++root.nlink;
    CKPTFS_RETURN_IF_ERROR(PutInode(txn, root));
    for (const ExternalFile& f : files) {
      CKPTFS_ASSIGN_OR_RETURN(
          ContentId content,
          store_->AdoptContentInTxn(txn, f.chunks, f.size, f.pack_id, f.pack_length));
      CKPTFS_RETURN_IF_ERROR(AddFile(txn, dir, f.name, content, f.size, owner, now));
    }
    return AddFile(txn, dir, "manifest.json", manifest_id, manifest.size(), owner, now);
  };
  return writer->Finish(hook).status();
}

}  // namespace ckptfs
