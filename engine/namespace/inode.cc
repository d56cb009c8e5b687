#include "engine/namespace/inode.h"

#include <chrono>

#include "engine/util/coding.h"

namespace ckptfs {
namespace {
constexpr uint8_t kInodeRowVersion = 1;
constexpr size_t kFixedBytes = 1 + 4 * 5 + 8 * 8;
}  // namespace

std::string Inode::Encode() const {
  std::string out(kFixedBytes + symlink.size(), '\0');
  char* p = out.data();
  p[0] = static_cast<char>(kInodeRowVersion);
  PutLE<uint32_t>(p + 1, mode);
  PutLE<uint32_t>(p + 5, uid);
  PutLE<uint32_t>(p + 9, gid);
  PutLE<uint32_t>(p + 13, nlink);
  PutLE<uint32_t>(p + 17, flags);
  PutLE<uint64_t>(p + 21, size);
  PutLE<int64_t>(p + 29, atime_ns);
  PutLE<int64_t>(p + 37, mtime_ns);
  PutLE<int64_t>(p + 45, ctime_ns);
  PutLE<uint64_t>(p + 53, content);
  PutLE<uint64_t>(p + 61, parent);
  PutLE<uint64_t>(p + 69, version);
  PutLE<uint64_t>(p + 77, version_seq);
  std::memcpy(p + kFixedBytes, symlink.data(), symlink.size());
  return out;
}

Result<Inode> Inode::Decode(std::string_view row) {
  if (row.size() < kFixedBytes || static_cast<uint8_t>(row[0]) != kInodeRowVersion) {
    return Status::Corruption("inode row has an unknown layout");
  }
  const char* p = row.data();
  Inode n;
  n.mode = GetLE<uint32_t>(p + 1);
  n.uid = GetLE<uint32_t>(p + 5);
  n.gid = GetLE<uint32_t>(p + 9);
  n.nlink = GetLE<uint32_t>(p + 13);
  n.flags = GetLE<uint32_t>(p + 17);
  n.size = GetLE<uint64_t>(p + 21);
  n.atime_ns = GetLE<int64_t>(p + 29);
  n.mtime_ns = GetLE<int64_t>(p + 37);
  n.ctime_ns = GetLE<int64_t>(p + 45);
  n.content = GetLE<uint64_t>(p + 53);
  n.parent = GetLE<uint64_t>(p + 61);
  n.version = GetLE<uint64_t>(p + 69);
  n.version_seq = GetLE<uint64_t>(p + 77);
  n.symlink.assign(p + kFixedBytes, row.size() - kFixedBytes);
  return n;
}

std::string InodeKey(Ino ino) {
  std::string k(8, '\0');
  PutBE64(k.data(), ino);
  return k;
}

std::string DirentPrefix(Ino parent) { return InodeKey(parent); }
std::string DirentKey(Ino parent, std::string_view name) {
  return InodeKey(parent) + std::string(name);
}
std::string XattrPrefix(Ino ino) { return InodeKey(ino); }
std::string XattrKey(Ino ino, std::string_view name) { return InodeKey(ino) + std::string(name); }

Result<std::optional<Inode>> GetInode(const Catalog::ReadTxn& txn, Ino ino) {
  CKPTFS_ASSIGN_OR_RETURN(auto row, txn.Get(Table::kInodes, InodeKey(ino)));
  if (!row) return std::optional<Inode>();
  CKPTFS_ASSIGN_OR_RETURN(Inode inode, Inode::Decode(*row));
  inode.ino = ino;
  return std::optional<Inode>(std::move(inode));
}

Status PutInode(Catalog::WriteTxn& txn, const Inode& inode) {
  return txn.Put(Table::kInodes, InodeKey(inode.ino), inode.Encode());
}

Result<uint64_t> TakeVersionSeq(Catalog::WriteTxn& txn) {
  constexpr char kNextVersionKey[] = "next_version_seq";
  CKPTFS_ASSIGN_OR_RETURN(uint64_t last, txn.GetCounter(kNextVersionKey));
  CKPTFS_RETURN_IF_ERROR(txn.PutCounter(kNextVersionKey, last + 1));
  return last + 1;
}

Result<std::optional<Ino>> GetDirent(const Catalog::ReadTxn& txn, Ino parent,
                                     std::string_view name) {
  CKPTFS_ASSIGN_OR_RETURN(auto row, txn.Get(Table::kDirents, DirentKey(parent, name)));
  if (!row) return std::optional<Ino>();
  if (row->size() != 12) return Status::Corruption("directory entry has an unknown layout");
  return std::optional<Ino>(GetLE<uint64_t>(row->data()));
}

Result<std::vector<DirEntry>> ListDirents(const Catalog::ReadTxn& txn, Ino dir) {
  std::vector<DirEntry> entries;
  const std::string prefix = DirentPrefix(dir);
  Status err;
  CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kDirents, prefix, "", [&](auto key, auto value) {
    if (value.size() != 12) {
      err = Status::Corruption("directory entry has an unknown layout");
      return false;
    }
    const DirentValue d = DecodeDirent(value);
    entries.push_back(DirEntry{std::string(key.substr(prefix.size())), d.ino, d.mode});
    return true;
  }));
  CKPTFS_RETURN_IF_ERROR(err);
  return entries;
}

Result<std::optional<std::string>> NameIn(const Catalog::ReadTxn& txn, Ino dir, Ino ino) {
  std::optional<std::string> name;
  const std::string prefix = DirentPrefix(dir);
  CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kDirents, prefix, "", [&](auto key, auto value) {
    if (value.size() != 12 || DecodeDirent(value).ino != ino) return true;
    name = std::string(key.substr(prefix.size()));
    return false;
  }));
  return name;
}

}  // namespace ckptfs

namespace ckptfs {

std::string EncodeDirent(Ino child, uint32_t mode) {
  std::string v(12, '\0');
  PutLE<uint64_t>(v.data(), child);
  PutLE<uint32_t>(v.data() + 8, mode);
  return v;
}

DirentValue DecodeDirent(std::string_view v) {
  return DirentValue{GetLE<uint64_t>(v.data()), GetLE<uint32_t>(v.data() + 8)};
}

int64_t NowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ckptfs
