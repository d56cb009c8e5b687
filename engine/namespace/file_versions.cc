// File versions (file_versions.h).
#include "engine/namespace/file_versions.h"

#include <set>

#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr int kMaxDepth = 4096;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Calls fn(file, name, dir) for every regular file below `dir`, depth first.
template <typename Fn>
Status ForEachFileBelow(const Catalog::ReadTxn& txn, Ino dir, int depth, Fn&& fn) {
  if (depth > kMaxDepth) return Status::Corruption("directory tree deeper than 4096");
  CKPTFS_ASSIGN_OR_RETURN(auto entries, ListDirents(txn, dir));
  for (const DirEntry& e : entries) {
    if (S_ISDIR(e.mode)) {
      CKPTFS_RETURN_IF_ERROR(ForEachFileBelow(txn, e.ino, depth + 1, fn));
    } else if (S_ISREG(e.mode)) {
      CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, e.ino));
      if (!inode) return Status::Corruption("directory entry " + e.name + " has no inode");
      CKPTFS_RETURN_IF_ERROR(fn(*inode, e.name, dir));
    }
  }
  return Status::OK();
}

// The path of directory `dir` from the root ("" for the root itself), with a trailing '/'.
Result<std::string> DirPath(const Catalog::ReadTxn& txn, Ino dir) {
  std::string path;
  for (int depth = 0; dir != kRootIno; ++depth) {
    if (depth > kMaxDepth) return Status::Corruption("directory tree deeper than 4096");
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, dir));
    if (!inode || inode->nlink == 0) return Status::NotFound("directory removed");
    CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> name, NameIn(txn, inode->parent, dir));
    if (!name) return Status::NotFound("directory removed");
    path = *name + "/" + path;
    dir = inode->parent;
  }
  return path;
}

}  // namespace

bool IsCheckpointFileName(std::string_view name) {
  for (std::string_view suffix : {".ckpt", ".pt", ".pth", ".bin", ".safetensors"}) {
    if (EndsWith(name, suffix)) return true;
  }
  return false;
}

Result<bool> HoldsFileVersions(const Catalog::ReadTxn& txn, Ino dir) {
  for (int depth = 0; depth <= kMaxDepth; ++depth) {
    CKPTFS_ASSIGN_OR_RETURN(auto mark, txn.Get(Table::kXattrs, XattrKey(dir, kFileVersionsAttr)));
    if (mark && *mark == "1") return true;
    if (dir == kRootIno) return false;
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, dir));
    if (!inode) return false;
    dir = inode->parent;
  }
  return Status::Corruption("directory tree deeper than 4096");
}

Result<bool> UpdateFileVersionFlag(Catalog::WriteTxn& txn, Inode& file, std::string_view name,
                                   Ino dir) {
  if (!file.is_reg()) return false;
  bool want = IsCheckpointFileName(name);
  if (want) {
    CKPTFS_ASSIGN_OR_RETURN(want, HoldsFileVersions(txn, dir));
  }
  if (want == file.file_version()) return want;
  if (want) {
    file.flags |= Inode::kFileVersion;
    if (file.version_seq == 0) {
      CKPTFS_ASSIGN_OR_RETURN(file.version_seq, TakeVersionSeq(txn));
    }
  } else {
    file.flags &= ~Inode::kFileVersion;
  }
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, file));
  return want;
}

Status MarkFileVersions(Catalog::WriteTxn& txn, Ino dir, bool on) {
  if (on) {
    CKPTFS_RETURN_IF_ERROR(txn.Put(Table::kXattrs, XattrKey(dir, kFileVersionsAttr), "1"));
  } else {
    CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kXattrs, XattrKey(dir, kFileVersionsAttr)));
  }
  return RefreshFileVersions(txn, dir);
}

Status RefreshFileVersions(Catalog::WriteTxn& txn, Ino dir) {
  return ForEachFileBelow(txn, dir, 0, [&](Inode file, const std::string& name, Ino parent) {
    return UpdateFileVersionFlag(txn, file, name, parent).status();
  });
}

Result<std::vector<FileVersionEntry>> ListFileVersions(const Catalog::ReadTxn& txn) {
  // The marked directories: the attribute rows are keyed by (ino, name).
  std::vector<Ino> marked;
  CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kXattrs, "", "", [&](auto key, auto value) {
    if (key.size() == 8 + kFileVersionsAttr.size() && key.substr(8) == kFileVersionsAttr &&
        value == "1") {
      marked.push_back(GetBE64(key.data()));
    }
    return true;
  }));
  std::vector<FileVersionEntry> out;
  std::set<Ino> seen;
  for (Ino dir : marked) {
    auto prefix = DirPath(txn, dir);
    if (!prefix.ok() && prefix.status().IsNotFound()) continue;  // removed, attribute pending
    CKPTFS_RETURN_IF_ERROR(prefix.status());
    // Paths below `dir`, built as the walk descends.
    std::vector<std::pair<Ino, std::string>> stack = {{dir, *prefix}};
    while (!stack.empty()) {
      auto [at, path] = stack.back();
      stack.pop_back();
      CKPTFS_ASSIGN_OR_RETURN(auto entries, ListDirents(txn, at));
      for (const DirEntry& e : entries) {
        if (S_ISDIR(e.mode)) {
          stack.emplace_back(e.ino, path + e.name + "/");
        } else if (S_ISREG(e.mode) && seen.insert(e.ino).second) {
          CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, e.ino));
          if (inode && inode->file_version()) out.push_back({path + e.name, *inode});
        }
      }
    }
  }
  return out;
}

}  // namespace ckptfs
