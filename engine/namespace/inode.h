// engine/namespace/inode.h
//
// Rows of the filesystem namespace, stored in the catalog's raw tables:
//
//   inodes   ino (BE64)               -> Inode (attributes, content id, version, symlink target)
//   dirents  parent ino (BE64) + name -> child ino (LE64), child mode (LE32)
//   xattrs   ino (BE64) + name        -> value
//
// Inode 1 is the root. Each directory directly under the root is a checkpoint version; every
// inode records the version it belongs to (0 for the root and files directly under it).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/store/catalog.h"
#include "engine/util/status.h"

namespace ckptfs {

using Ino = uint64_t;
inline constexpr Ino kRootIno = 1;

struct Inode {
  // flags: kSealed on a version (top-level directory) or on a file version (file_versions.h)
  // refuses changes; kFileVersion marks a regular file that is a version of its own.
  static constexpr uint32_t kSealed = 1;
  static constexpr uint32_t kFileVersion = 2;

  Ino ino = 0;
  uint32_t mode = 0;  // S_IFDIR / S_IFREG / S_IFLNK | permission bits
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t nlink = 1;
  uint32_t flags = 0;
  uint64_t size = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  ContentId content = 0;  // 0: no bytes
  Ino parent = 0;
  Ino version = 0;        // the top-level directory this inode is in (itself for one)
  uint64_t version_seq = 0;  // versions (top-level directories, file versions): creation order
  std::string symlink;

  bool is_dir() const { return S_ISDIR(mode); }
  bool is_reg() const { return S_ISREG(mode); }
  bool is_symlink() const { return S_ISLNK(mode); }
  bool sealed() const { return (flags & kSealed) != 0; }
  bool file_version() const { return (flags & kFileVersion) != 0; }

  std::string Encode() const;
  static Result<Inode> Decode(std::string_view row);
};

std::string InodeKey(Ino ino);
std::string DirentKey(Ino parent, std::string_view name);
std::string DirentPrefix(Ino parent);
std::string XattrKey(Ino ino, std::string_view name);
std::string XattrPrefix(Ino ino);

struct DirentValue {
  Ino ino;
  uint32_t mode;
};
std::string EncodeDirent(Ino child, uint32_t mode);
// REQUIRES: v.size() == 12 (checked by GetDirent; ForEach callers check it themselves).
DirentValue DecodeDirent(std::string_view v);

// One entry of a directory, as listed.
struct DirEntry {
  std::string name;
  Ino ino = 0;
  uint32_t mode = 0;
};

// Typed access over a catalog transaction.
Result<std::optional<Inode>> GetInode(const Catalog::ReadTxn& txn, Ino ino);
Status PutInode(Catalog::WriteTxn& txn, const Inode& inode);
// The next version sequence number (one counter for directory and file versions).
Result<uint64_t> TakeVersionSeq(Catalog::WriteTxn& txn);
// The wall clock in nanoseconds since the Unix epoch: what inode times hold.
int64_t NowUnixNs();
Result<std::optional<Ino>> GetDirent(const Catalog::ReadTxn& txn, Ino parent,
                                     std::string_view name);
// The entries of directory `dir` in name order (Corruption on a malformed row).
Result<std::vector<DirEntry>> ListDirents(const Catalog::ReadTxn& txn, Ino dir);
// The name under which `dir` holds `ino` (nullopt: none), by a scan of dir's entries.
Result<std::optional<std::string>> NameIn(const Catalog::ReadTxn& txn, Ino dir, Ino ino);

}  // namespace ckptfs
