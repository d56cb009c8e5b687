#include "fs/fuse_ops.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <sys/xattr.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/namespace/filesystem.h"
#include "fs/passthrough.h"

namespace ckptfs {
namespace {

constexpr double kAttrTimeout = 1.0;
constexpr uint32_t kBlockSize = 1 << 20;  // st_blksize: cp and friends then use 1 MiB I/O
// Replies made of more chunks than this are copied into one buffer (IOV_MAX is 1024).
constexpr size_t kMaxReplySlices = 256;

std::string& ControlSocketPath() {
  static std::string path;
  return path;
}

FileSystem& Fs(fuse_req_t req) { return *static_cast<FileSystem*>(fuse_req_userdata(req)); }

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Caller{ctx->uid, ctx->gid};
}

void ReplyError(fuse_req_t req, const Status& s) {
  int err = s.ToErrno();
  // Only real failures: an ordinary errno (ENODATA for a missing xattr, asked before every
  // write for security.capability) is the caller's business, not the log's.
  if (err == EIO || err == 0) spdlog::error("{}", s.ToString());
  fuse_reply_err(req, err == 0 ? EIO : err);
}

// The reply of a request that returns no data: success, or the error (logged as ReplyError's).
void ReplyStatus(fuse_req_t req, const Status& s) {
  if (s.ok()) return (void)fuse_reply_err(req, 0);
  ReplyError(req, s);
}

struct stat ToStat(const Inode& n) {
  struct stat st {};
  st.st_ino = n.ino;
  st.st_mode = n.mode;
  st.st_nlink = n.nlink;
  st.st_uid = n.uid;
  st.st_gid = n.gid;
  st.st_size = static_cast<off_t>(n.size);
  st.st_blksize = kBlockSize;
  st.st_blocks = static_cast<blkcnt_t>((n.size + 511) / 512);
  st.st_atim = {static_cast<time_t>(n.atime_ns / 1000000000), n.atime_ns % 1000000000};
  st.st_mtim = {static_cast<time_t>(n.mtime_ns / 1000000000), n.mtime_ns % 1000000000};
  st.st_ctim = {static_cast<time_t>(n.ctime_ns / 1000000000), n.ctime_ns % 1000000000};
  return st;
}

fuse_entry_param ToEntry(const Inode& n) {
  fuse_entry_param e{};
  e.ino = n.ino;
  e.generation = 1;
  e.attr = ToStat(n);
  e.attr_timeout = kAttrTimeout;
  e.entry_timeout = kAttrTimeout;
  return e;
}

void ReplyEntry(fuse_req_t req, const Result<Inode>& n) {
  if (!n.ok()) return ReplyError(req, n.status());
  fuse_entry_param e = ToEntry(*n);
  fuse_reply_entry(req, &e);
}

int64_t ToNs(const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

void OnInit(void*, fuse_conn_info* conn) {
  conn->max_write = 1 << 20;
  conn->max_readahead = 1 << 20;
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;  // see docs/fs.md: writes stream in order
  // Measurement switch only (scripts/bench/fs.sh, docs/fs.md "Tuning choices"): the daemon
  // started with CKPTFS_WRITEBACK_CACHE=1 in its environment asks for the writeback cache.
  const char* wb = std::getenv("CKPTFS_WRITEBACK_CACHE");
  if (wb != nullptr && std::strcmp(wb, "1") == 0 && (conn->capable & FUSE_CAP_WRITEBACK_CACHE)) {
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    spdlog::warn("CKPTFS_WRITEBACK_CACHE=1: kernel writeback cache on (benchmark only)");
  }
  if (conn->capable & FUSE_CAP_SPLICE_READ) conn->want &= ~FUSE_CAP_SPLICE_READ;
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  FileSystem& fs = Fs(req);
  Result<Inode> n = fs.Lookup(parent, name);
  // A view inode lives while the kernel holds a reference (FileSystem::ViewReferenced): taken
  // before the reply, and given back if the reply does not reach the kernel. One dropped
  // between the lookup and the reference is looked up again (a new inode).
  for (int tries = 1; n.ok() && FileSystem::IsViewIno(n->ino) && !fs.ViewReferenced(n->ino);
       ++tries) {
    if (tries == 3) return ReplyError(req, Status::FromErrno(ESTALE, "view inode dropped"));
    n = fs.Lookup(parent, name);
  }
  if (!n.ok() && n.status().IsNotFound()) {
    fuse_entry_param e{};  // negative entry, not cached
    fuse_reply_entry(req, &e);
    return;
  }
  if (!n.ok()) return ReplyError(req, n.status());
  fuse_entry_param e = ToEntry(*n);
  if (fuse_reply_entry(req, &e) != 0 && FileSystem::IsViewIno(n->ino)) fs.ViewForget(n->ino, 1);
}

// The kernel lets go of inodes: only view inodes are counted (real ones live in the catalog).
void OnForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  if (FileSystem::IsViewIno(ino)) Fs(req).ViewForget(ino, nlookup);
  fuse_reply_none(req);
}

void OnForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) {
    if (FileSystem::IsViewIno(forgets[i].ino))
      Fs(req).ViewForget(forgets[i].ino, forgets[i].nlookup);
  }
  fuse_reply_none(req);
}

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  auto n = Fs(req).GetAttr(ino);
  if (!n.ok()) return ReplyError(req, n.status());
  struct stat st = ToStat(*n);
  fuse_reply_attr(req, &st, kAttrTimeout);
}

void OnSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  SetAttrRequest r;
  if (to_set & FUSE_SET_ATTR_MODE) r.mode = attr->st_mode;
  if (to_set & FUSE_SET_ATTR_UID) r.uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) r.gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) r.size = static_cast<uint64_t>(attr->st_size);
  if (to_set & FUSE_SET_ATTR_ATIME) r.atime_ns = ToNs(attr->st_atim);
  if (to_set & FUSE_SET_ATTR_MTIME) r.mtime_ns = ToNs(attr->st_mtim);
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) r.atime_ns = NowUnixNs();
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) r.mtime_ns = NowUnixNs();
  auto n = Fs(req).SetAttr(ino, r);
  if (!n.ok()) return ReplyError(req, n.status());
  struct stat st = ToStat(*n);
  fuse_reply_attr(req, &st, kAttrTimeout);
}

void OnReadlink(fuse_req_t req, fuse_ino_t ino) {
  auto target = Fs(req).Readlink(ino);
  if (!target.ok()) return ReplyError(req, target.status());
  fuse_reply_readlink(req, target->c_str());
}

void OnMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  ReplyEntry(req, Fs(req).Mkdir(parent, name, mode, CallerOf(req)));
}

void OnSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  ReplyEntry(req, Fs(req).Symlink(parent, name, target, CallerOf(req)));
}

void OnLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) {
  fuse_reply_err(req, EPERM);  // hard links are not supported (docs/fs.md)
}

void OnMknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) {
  fuse_reply_err(req, EPERM);  // regular files come through create; no device nodes
}

void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ReplyStatus(req, Fs(req).Unlink(parent, name));
}

void OnRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ReplyStatus(req, Fs(req).Rmdir(parent, name));
}

void OnRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
              const char* newname, unsigned int flags) {
  ReplyStatus(req, Fs(req).Rename(parent, name, newparent, newname, flags));
}

// Every change to a file's bytes comes through this mount, so the kernel's page cache is
// never stale: keep it across opens for all files (sealed ones in particular). docs/fs.md.
// Files generated at open (.ckptfs/stats) bypass the page cache: their size is not known.
void SetOpenFlags(FileSystem& fs, fuse_ino_t ino, fuse_file_info* fi, uint64_t fh) {
  fi->fh = fh;
  const bool generated = fs.IsGeneratedFile(ino);
  fi->keep_cache = generated ? 0 : 1;
  fi->direct_io = generated ? 1 : 0;
}

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
  auto made = Fs(req).Create(parent, name, mode, fi->flags, CallerOf(req));
  if (!made.ok()) return ReplyError(req, made.status());
  fuse_entry_param e = ToEntry(made->first);
  SetOpenFlags(Fs(req), e.ino, fi, made->second);
  if (FusePassthrough* pt = FusePassthrough::Get()) pt->Opened(Fs(req), e.ino, made->second);
  if (fuse_reply_create(req, &e, fi) != 0) (void)FusePassthrough::Release(Fs(req), made->second);
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto fh = Fs(req).Open(ino, fi->flags);
  if (!fh.ok()) return ReplyError(req, fh.status());
  SetOpenFlags(Fs(req), ino, fi, *fh);
  if (FusePassthrough* pt = FusePassthrough::Get()) pt->Opened(Fs(req), ino, *fh);
  if (fuse_reply_open(req, fi) != 0) (void)FusePassthrough::Release(Fs(req), *fh);
}

// The reply goes out straight from the decoded chunks (fuse_reply_iov: one copy, into the
// kernel); they stay alive in `slices` until it has been written.
void OnRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  std::vector<ChunkSlice> slices;
  auto n = Fs(req).ReadSlices(fi->fh, static_cast<uint64_t>(off), size, &slices);
  if (!n.ok()) return ReplyError(req, n.status());
  if (slices.size() > kMaxReplySlices) {
    // Many tiny chunks (small tensors and zip headers): one buffer, not an iovec per chunk
    // (writev takes at most IOV_MAX).
    Buffer buf(*n);
    size_t done = 0;
    for (const ChunkSlice& slice : slices) {
      std::memcpy(buf.data() + done, slice.bytes().data(), slice.length);
      done += slice.length;
    }
    fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), done);
    return;
  }
  std::vector<iovec> iov(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    iov[i].iov_base = const_cast<std::byte*>(slices[i].chunk->data() + slices[i].offset);
    iov[i].iov_len = slices[i].length;
  }
  fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
}

void OnWrite(fuse_req_t req, fuse_ino_t, const char* data, size_t size, off_t off,
             fuse_file_info* fi) {
  Status s = Fs(req).Write(fi->fh, static_cast<uint64_t>(off),
                           {reinterpret_cast<const std::byte*>(data), size});
  if (!s.ok()) return ReplyError(req, s);
  fuse_reply_write(req, size);
}

void OnFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  ReplyStatus(req, Fs(req).Flush(fi->fh));
}

void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  ReplyStatus(req, FusePassthrough::Release(Fs(req), fi->fh));
}

void OnFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  ReplyStatus(req, Fs(req).Fsync(fi->fh));
}

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto dh = Fs(req).OpenDir(ino);
  if (!dh.ok()) return ReplyError(req, dh.status());
  fi->fh = *dh;
  if (fuse_reply_open(req, fi) != 0) Fs(req).ReleaseDir(*dh);
}

void OnReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  Buffer buf(size);
  size_t used = 0;
  auto add = [&](const char* name, fuse_ino_t child, uint32_t mode, off_t next) {
    struct stat st {};
    st.st_ino = child;
    st.st_mode = mode;
    size_t need = fuse_add_direntry(req, nullptr, 0, name, nullptr, 0);
    if (used + need > size) return false;
    fuse_add_direntry(req, reinterpret_cast<char*>(buf.data()) + used, size - used, name, &st,
                      next);
    used += need;
    return true;
  };
  // Offsets: 1 after ".", 2 after "..", 2 + i after the i-th entry.
  if (off < 1 && !add(".", ino, S_IFDIR, 1)) return (void)fuse_reply_buf(req, nullptr, 0);
  if (off < 2 && !add("..", ino, S_IFDIR, 2)) {
    return (void)fuse_reply_buf(req, reinterpret_cast<char*>(buf.data()), used);
  }
  uint64_t from = off < 2 ? 0 : static_cast<uint64_t>(off) - 2;
  Status s = Fs(req).ReadDir(fi->fh, from, [&](const DirEntry& e, uint64_t next) {
    return add(e.name.c_str(), e.ino, e.mode, static_cast<off_t>(next + 2));
  });
  if (!s.ok()) return ReplyError(req, s);
  fuse_reply_buf(req, reinterpret_cast<char*>(buf.data()), used);
}

void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Fs(req).ReleaseDir(fi->fh);
  fuse_reply_err(req, 0);
}

void OnFsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  fuse_reply_err(req, 0);  // every namespace change is committed when it returns
}

void OnStatfs(fuse_req_t req, fuse_ino_t) {
  auto st = Fs(req).StatFs();
  if (!st.ok()) return ReplyError(req, st.status());
  fuse_reply_statfs(req, &*st);
}

void OnSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) {
  ReplyStatus(req, Fs(req).SetXattr(ino, name, {value, size}, flags));
}

void ReplyXattrBytes(fuse_req_t req, const std::string& bytes, size_t size) {
  if (size == 0) return (void)fuse_reply_xattr(req, bytes.size());
  if (bytes.size() > size) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, bytes.data(), bytes.size());
}

void OnGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (ino == FUSE_ROOT_ID && std::strcmp(name, "user.ckptfs.control") == 0 &&
      !ControlSocketPath().empty()) {
    return ReplyXattrBytes(req, ControlSocketPath(), size);
  }
  auto v = Fs(req).GetXattr(ino, name);
  if (!v.ok()) return ReplyError(req, v.status());
  ReplyXattrBytes(req, *v, size);
}

void OnListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto names = Fs(req).ListXattr(ino);
  if (!names.ok()) return ReplyError(req, names.status());
  std::string all;
  for (const auto& n : *names) all += n + '\0';
  ReplyXattrBytes(req, all, size);
}

void OnRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  ReplyStatus(req, Fs(req).RemoveXattr(ino, name));
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = OnLookup;
  ops.forget = OnForget;
  ops.forget_multi = OnForgetMulti;
  ops.getattr = OnGetattr;
  ops.setattr = OnSetattr;
  ops.readlink = OnReadlink;
  ops.mknod = OnMknod;
  ops.mkdir = OnMkdir;
  ops.unlink = OnUnlink;
  ops.rmdir = OnRmdir;
  ops.symlink = OnSymlink;
  ops.rename = OnRename;
  ops.link = OnLink;
  ops.open = OnOpen;
  ops.read = OnRead;
  ops.write = OnWrite;
  ops.flush = OnFlush;
  ops.release = OnRelease;
  ops.fsync = OnFsync;
  ops.opendir = OnOpendir;
  ops.readdir = OnReaddir;
  ops.releasedir = OnReleasedir;
  ops.fsyncdir = OnFsyncdir;
  ops.statfs = OnStatfs;
  ops.setxattr = OnSetxattr;
  ops.getxattr = OnGetxattr;
  ops.listxattr = OnListxattr;
  ops.removexattr = OnRemovexattr;
  ops.create = OnCreate;
  return ops;
}

}  // namespace

void SetControlSocketPath(std::string path) { ControlSocketPath() = std::move(path); }

const fuse_lowlevel_ops& FuseOps() {
  static const fuse_lowlevel_ops ops = MakeOps();
  return ops;
}

}  // namespace ckptfs
