#include "engine/namespace/filesystem.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <spdlog/spdlog.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "engine/namespace/file_versions.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr char kNextInoKey[] = "next_ino";
// Each ingest thread carries spooled bytes to the writer in pieces of this size.
constexpr size_t kIngestScratchBytes = 4 << 20;

Status CheckName(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return Status::InvalidArgument("bad name");
  if (name.size() > 255) return Status::FromErrno(ENAMETOOLONG, std::string(name.substr(0, 32)));
  if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("a name may not hold '/' or NUL");
  }
  return Status::OK();
}

Status Errno(int err, std::string_view what) { return Status::FromErrno(err, what); }

}  // namespace

FileSystem::FileSystem(Store* store, const FileSystemOptions& options)
    : store_(store), options_(options), staging_dir_(store->dir() / "staging") {}

Result<std::unique_ptr<FileSystem>> FileSystem::Open(Store* store,
                                                     const FileSystemOptions& options) {
  std::unique_ptr<FileSystem> fs(new FileSystem(store, options));
  CKPTFS_RETURN_IF_ERROR(fs->Init());
  if (options.spool_backlog_bytes > 0) {
    fs->spool_backlog_ = std::make_unique<ByteBudget>(options.spool_backlog_bytes);
    fs->ingester_ = std::make_unique<Ingester>(options.ingest_threads, kIngestScratchBytes);
  }
  fs->committer_ = std::make_unique<Committer>(
      [p = fs.get()](const std::shared_ptr<OpenInode>& file) { p->ForgetReleased(file); });
  CKPTFS_RETURN_IF_ERROR(fs->RecoverJournals());
  if (options.seal_after.count() > 0) fs->sealer_ = std::thread([p = fs.get()] { p->RunSealer(); });
  return fs;
}

FileSystem::~FileSystem() {
  {  // the sealer first: it may be waiting on the committer
    MutexLock lock(sealer_mu_);
    sealer_stopping_ = true;
  }
  sealer_cv_.NotifyAll();
  if (sealer_.joinable()) sealer_.join();
  if (committer_) {
    Status s = Sync();
    if (!s.ok()) spdlog::error("committing open files at shutdown failed: {}", s.ToString());
    committer_.reset();
  }
  ingester_.reset();  // after the commits: they wait for their files' ingest
}

// Whether every write to a file in `dir` gives it a new ctime, also right after a stat (the
// kernel's multigrain timestamps, Linux >= 6.13 on ext4, xfs, btrfs, tmpfs): passthrough files
// are known to have changed by their times alone.
bool ChangeTimesAreFine(const std::filesystem::path& dir) {
  auto fd = OpenFile(dir, O_TMPFILE | O_RDWR, 0600);
  if (!fd.ok()) return false;
  const std::byte one{1};
  for (int i = 0; i < 64; ++i) {
    struct stat before {
    }, after{};
    if (::fstat(fd->get(), &before) != 0) return false;
    if (!PWriteFull(fd->get(), 0, {&one, 1}, dir).ok()) return false;
    if (::fstat(fd->get(), &after) != 0) return false;
    if (before.st_ctim.tv_sec == after.st_ctim.tv_sec &&
        before.st_ctim.tv_nsec == after.st_ctim.tv_nsec) {
      return false;
    }
  }
  return true;
}

Status FileSystem::Init() {
  std::error_code ec;
  std::filesystem::create_directories(staging_dir_, ec);
  if (ec) return Status::IOError("create " + staging_dir_.string() + ": " + ec.message());
  fine_change_times_ = ChangeTimesAreFine(staging_dir_);
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> root, GetInode(txn, kRootIno));
  if (!root) {
    Inode r;
    r.ino = kRootIno;
    r.mode = S_IFDIR | 0755;
    r.uid = ::getuid();
    r.gid = ::getgid();
    r.nlink = 2;
    r.atime_ns = r.mtime_ns = r.ctime_ns = NowUnixNs();
    CKPTFS_RETURN_IF_ERROR(PutInode(txn, r));
    CKPTFS_RETURN_IF_ERROR(txn.PutCounter(kNextInoKey, kRootIno));
  }
  // Inodes unlinked while open when the last mount ended: drop them now.
  std::vector<Inode> orphans;
  Status err;
  CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kInodes, "", "", [&](auto key, auto value) {
    auto inode = Inode::Decode(value);
    if (!inode.ok()) {
      err = inode.status();
      return false;
    }
    if (inode->nlink == 0) {
      inode->ino = GetBE64(key.data());
      orphans.push_back(*inode);
    }
    return true;
  }));
  CKPTFS_RETURN_IF_ERROR(err);
  for (const Inode& orphan : orphans) CKPTFS_RETURN_IF_ERROR(DropInode(txn, orphan));
  return txn.Commit();
}

Status FileSystem::RecoverJournals() {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(staging_dir_, ec)) {
    found.push_back(entry.path());
  }
  if (ec) return Status::IOError("list " + staging_dir_.string() + ": " + ec.message());
  std::sort(found.begin(), found.end());
  for (const std::filesystem::path& path : found) {
    const std::string name = path.filename().string();
    if (name.rfind("journal-", 0) != 0) continue;  // nothing else in staging/ has a name
    auto journal = OpenInode::ParseJournalName(name);
    std::optional<Inode> inode;
    if (journal) {
      CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
      CKPTFS_ASSIGN_OR_RETURN(inode, GetInode(txn, journal->first));
    }
    if (!journal || !inode || !inode->is_reg() || inode->nlink == 0 ||
        inode->content != journal->second) {
      // A link being made (".new"), or a journal whose file was committed or removed since.
      if (journal) spdlog::info("journal {}: its file changed since; dropped", name);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        return Errno(errno, "remove stale journal " + path.string());
      }
      continue;
    }
    CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, ckptfs::OpenFile(path, O_RDWR, 0));
    CKPTFS_ASSIGN_OR_RETURN(std::shared_ptr<OpenInode> file, OpenInodeFor(inode->ino));
    Status adopted = file->AdoptJournal(std::move(fd), name);
    {
      MutexLock lock(open_mu_);
      --open_files_[inode->ino].handles;
    }
    CKPTFS_RETURN_IF_ERROR(adopted);
    spdlog::warn(
        "inode {}: {} bytes that an fsync acknowledged before the daemon stopped are "
        "committed now (journal {})",
        inode->ino, file->size_view(), name);
    CKPTFS_RETURN_IF_ERROR(committer_->Commit(file, /*release=*/true, /*wait=*/false));
  }
  return Status::OK();
}

// ---- Namespace ------------------------------------------------------------------------------

Result<Inode> FileSystem::MustGet(const Catalog::ReadTxn& txn, Ino ino) {
  CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, ino));
  if (!inode) return Status::NotFound("inode " + std::to_string(ino));
  return *inode;
}

Status FileSystem::CheckWritable(const Catalog::ReadTxn& txn, const Inode& inode) {
  if (inode.is_reg() && inode.sealed()) {
    return Status::ReadOnly("file version is sealed; write a new checkpoint file instead");
  }
  if (inode.version == 0) return Status::OK();
  CKPTFS_ASSIGN_OR_RETURN(Inode version, MustGet(txn, inode.version));
  if (version.sealed()) {
    return Status::ReadOnly("version is sealed; write a new version instead");
  }
  return Status::OK();
}

Result<Inode> FileSystem::Lookup(Ino parent, std::string_view name) {
  if (IsViewIno(parent)) return ViewLookup(parent, name);  // views.cc
  std::optional<Ino> child;
  {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
    CKPTFS_ASSIGN_OR_RETURN(child, GetDirent(txn, parent, name));
  }
  if (!child) return ViewLookup(parent, name);  // a hidden view name, else NotFound
  NoteLookup(*child, name);
  return GetAttr(*child);
}

bool FileSystem::IsOptimizerStateName(std::string_view name) {
  return name.find("optim") != std::string_view::npos;
}

void FileSystem::NoteLookup(Ino ino, std::string_view name) {
  constexpr size_t kMaxNoted = 1 << 16;  // a few hundred KiB at most; forgetting is harmless
  if (!IsOptimizerStateName(name)) return;
  MutexLock lock(priority_mu_);
  if (optimizer_inos_.size() >= kMaxNoted) optimizer_inos_.clear();
  optimizer_inos_.insert(ino);
}

WorkerPool::Priority FileSystem::PrefetchPriorityOf(Ino ino) {
  MutexLock lock(priority_mu_);
  return optimizer_inos_.count(ino) != 0 ? WorkerPool::Priority::kLow
                                         : WorkerPool::Priority::kNormal;
}

Result<Inode> FileSystem::GetAttr(Ino ino) {
  if (IsViewIno(ino)) return ViewInode(ino);  // views.cc
  // The open file first, then the catalog: the committer forgets an open file only after its
  // commit is in the catalog, so a file not found open has its last size there. (The other
  // order could read the catalog before that commit and miss the file forgotten right after:
  // the kernel then cached the old size, and a read of the file came back empty.)
  std::shared_ptr<OpenInode> open;
  {
    MutexLock lock(open_mu_);
    auto it = open_files_.find(ino);
    if (it != open_files_.end()) open = it->second.file;
  }
  Inode inode;
  {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
    CKPTFS_ASSIGN_OR_RETURN(inode, MustGet(txn, ino));
  }
  if (open) {
    inode.size = open->size_view();
    inode.mtime_ns = std::max(inode.mtime_ns, open->mtime_view());
  }
  return inode;
}

Result<Inode> FileSystem::MakeNode(Ino parent, std::string_view name, uint32_t mode,
                                   const Caller& caller, std::string_view symlink) {
  CKPTFS_RETURN_IF_ERROR(CheckName(name));
  if (IsViewIno(parent)) return Status::ReadOnly("views are read-only");
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
  CKPTFS_ASSIGN_OR_RETURN(Inode dir, MustGet(txn, parent));
  if (!dir.is_dir()) return Errno(ENOTDIR, "parent");
  if (dir.nlink == 0) return Status::NotFound("parent directory was removed");
  CKPTFS_RETURN_IF_ERROR(CheckWritable(txn, dir));
  CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> existing, GetDirent(txn, parent, name));
  if (existing) return Status::AlreadyExists(std::string(name));
  CKPTFS_ASSIGN_OR_RETURN(uint64_t last, txn.GetCounter(kNextInoKey));
  Inode n;
  n.ino = last + 1;
  n.mode = mode;
  n.uid = caller.uid;
  n.gid = caller.gid;
  n.nlink = S_ISDIR(mode) ? 2 : 1;
  n.atime_ns = n.mtime_ns = n.ctime_ns = NowUnixNs();
  n.parent = parent;
  n.symlink = std::string(symlink);
  n.size = symlink.size();
  if (parent == kRootIno) {
    n.version = S_ISDIR(mode) ? n.ino : 0;
    if (S_ISDIR(mode)) {
      CKPTFS_ASSIGN_OR_RETURN(n.version_seq, TakeVersionSeq(txn));
    }
  } else {
    n.version = dir.version;
  }
  CKPTFS_RETURN_IF_ERROR(txn.PutCounter(kNextInoKey, n.ino));
  CKPTFS_RETURN_IF_ERROR(UpdateFileVersionFlag(txn, n, name, parent).status());
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, n));
  CKPTFS_RETURN_IF_ERROR(
      txn.Put(Table::kDirents, DirentKey(parent, name), EncodeDirent(n.ino, mode)));
  dir.mtime_ns = dir.ctime_ns = n.ctime_ns;
  if (S_ISDIR(mode)) ++dir.nlink;
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, dir));
  CKPTFS_RETURN_IF_ERROR(txn.Commit());
  return n;
}

Result<Inode> FileSystem::Mkdir(Ino parent, std::string_view name, uint32_t mode,
                                const Caller& caller) {
  return MakeNode(parent, name, S_IFDIR | (mode & 07777), caller, "");
}

Result<Inode> FileSystem::Symlink(Ino parent, std::string_view name, std::string_view target,
                                  const Caller& caller) {
  if (target.empty() || target.size() > 4095) return Status::InvalidArgument("symlink target");
  return MakeNode(parent, name, S_IFLNK | 0777, caller, target);
}

Result<std::string> FileSystem::Readlink(Ino ino) {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(Inode inode, MustGet(txn, ino));
  if (!inode.is_symlink()) return Status::InvalidArgument("not a symbolic link");
  return inode.symlink;
}

Status FileSystem::DropInode(Catalog::WriteTxn& txn, const Inode& inode) {
  std::vector<std::string> xattrs;
  CKPTFS_RETURN_IF_ERROR(
      txn.ForEach(Table::kXattrs, XattrPrefix(inode.ino), "", [&](auto key, auto) {
        xattrs.emplace_back(key);
        return true;
      }));
  for (const auto& key : xattrs) CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kXattrs, key));
  if (inode.content != 0) CKPTFS_RETURN_IF_ERROR(store_->ReleaseInTxn(txn, inode.content));
  return txn.Delete(Table::kInodes, InodeKey(inode.ino));
}

Status FileSystem::RemoveEntry(Catalog::WriteTxn& txn, Ino parent, std::string_view name,
                               const Inode& child) {
  CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kDirents, DirentKey(parent, name)));
  CKPTFS_ASSIGN_OR_RETURN(Inode dir, MustGet(txn, parent));
  dir.mtime_ns = dir.ctime_ns = NowUnixNs();
  if (child.is_dir()) --dir.nlink;
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, dir));
  if (open_files_.count(child.ino) == 0) return DropInode(txn, child);
  Inode orphan = child;  // dropped when its last handle goes (or at the next mount)
  orphan.nlink = 0;
  return PutInode(txn, orphan);
}

// Unlink and Rmdir free space: on a full disk they use the catalog's space reserve.
Status FileSystem::Unlink(Ino parent, std::string_view name) {
  if (IsViewIno(parent)) return Status::ReadOnly("views are read-only");
  return store_->catalog().FreeingSpace([&]() -> Status {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> ino, GetDirent(txn, parent, name));
    if (!ino) return Status::NotFound(std::string(name));
    CKPTFS_ASSIGN_OR_RETURN(Inode child, MustGet(txn, *ino));
    if (child.is_dir()) return Errno(EISDIR, std::string(name));
    // Held until the commit: an Open() in between would get a handle on a dropped inode.
    MutexLock open_lock(open_mu_);
    CKPTFS_RETURN_IF_ERROR(RemoveEntry(txn, parent, name, child));
    return txn.Commit();
  });
}

Status FileSystem::Rmdir(Ino parent, std::string_view name) {
  if (IsViewIno(parent)) return Status::ReadOnly("views are read-only");
  return store_->catalog().FreeingSpace([&]() -> Status {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> ino, GetDirent(txn, parent, name));
    if (!ino) return Status::NotFound(std::string(name));
    CKPTFS_ASSIGN_OR_RETURN(Inode child, MustGet(txn, *ino));
    if (!child.is_dir()) return Errno(ENOTDIR, std::string(name));
    bool empty = true;
    CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kDirents, DirentPrefix(child.ino), "",
                                       [&](auto, auto) { return empty = false; }));
    if (!empty) return Errno(ENOTEMPTY, std::string(name));
    MutexLock open_lock(open_mu_);  // until the commit (see Unlink)
    CKPTFS_RETURN_IF_ERROR(RemoveEntry(txn, parent, name, child));
    return txn.Commit();
  });
}

Status FileSystem::Rename(Ino parent, std::string_view name, Ino new_parent,
                          std::string_view new_name, unsigned flags) {
  if (flags & ~static_cast<unsigned>(RENAME_NOREPLACE)) {
    return Status::InvalidArgument("only RENAME_NOREPLACE is supported");
  }
  CKPTFS_RETURN_IF_ERROR(CheckName(new_name));
  if (IsViewIno(parent) || IsViewIno(new_parent)) return Status::ReadOnly("views are read-only");
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
  CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> src_ino, GetDirent(txn, parent, name));
  if (!src_ino) return Status::NotFound(std::string(name));
  CKPTFS_ASSIGN_OR_RETURN(Inode src, MustGet(txn, *src_ino));
  CKPTFS_ASSIGN_OR_RETURN(Inode from_dir, MustGet(txn, parent));
  CKPTFS_ASSIGN_OR_RETURN(Inode to_dir, MustGet(txn, new_parent));
  if (!to_dir.is_dir()) return Errno(ENOTDIR, std::string(new_name));
  CKPTFS_RETURN_IF_ERROR(CheckWritable(txn, from_dir));
  CKPTFS_RETURN_IF_ERROR(CheckWritable(txn, to_dir));
  Ino new_version = new_parent == kRootIno ? (src.is_dir() ? src.ino : 0) : to_dir.version;
  if (src.is_dir() && new_version != src.version) {
    return Errno(EXDEV, "moving a directory into another version");
  }
  // A directory may not move below itself.
  for (Ino up = new_parent; src.is_dir() && up != kRootIno && up != 0;) {
    if (up == src.ino) return Status::InvalidArgument("cannot move a directory into itself");
    CKPTFS_ASSIGN_OR_RETURN(Inode dir, MustGet(txn, up));
    up = dir.parent;
  }
  CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> dst_ino, GetDirent(txn, new_parent, new_name));
  // Held until the commit (see Unlink), and after it for the open file's version.
  MutexLock open_lock(open_mu_);
  // A seal under way of either version has marked that version's open files, and its own
  // write transaction waits for this one: moving a file out of it would take a file marked
  // read-only along, moving one in would leave a writable open file in a sealed version.
  if (sealing_.count(src.version) != 0 || sealing_.count(new_version) != 0 ||
      sealing_.count(src.ino) != 0) {
    return Status::ReadOnly("version is being sealed");
  }
  if (dst_ino) {
    if (*dst_ino == src.ino) return Status::OK();
    if (flags & RENAME_NOREPLACE) return Status::AlreadyExists(std::string(new_name));
    CKPTFS_ASSIGN_OR_RETURN(Inode dst, MustGet(txn, *dst_ino));
    if (dst.is_dir() && !src.is_dir()) return Errno(EISDIR, std::string(new_name));
    if (!dst.is_dir() && src.is_dir()) return Errno(ENOTDIR, std::string(new_name));
    if (dst.is_dir()) {
      bool empty = true;
      CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kDirents, DirentPrefix(dst.ino), "",
                                         [&](auto, auto) { return empty = false; }));
      if (!empty) return Errno(ENOTEMPTY, std::string(new_name));
    }
    CKPTFS_RETURN_IF_ERROR(RemoveEntry(txn, new_parent, new_name, dst));
  }
  CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kDirents, DirentKey(parent, name)));
  CKPTFS_RETURN_IF_ERROR(
      txn.Put(Table::kDirents, DirentKey(new_parent, new_name), EncodeDirent(src.ino, src.mode)));
  const int64_t now = NowUnixNs();
  src.parent = new_parent;
  src.version = new_version;
  src.ctime_ns = now;
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, src));
  if (src.is_dir()) {
    CKPTFS_RETURN_IF_ERROR(RefreshFileVersions(txn, src.ino));
  } else {
    CKPTFS_RETURN_IF_ERROR(UpdateFileVersionFlag(txn, src, new_name, new_parent).status());
  }
  // Directory link counts and times (re-read: RemoveEntry may have changed them).
  CKPTFS_ASSIGN_OR_RETURN(from_dir, MustGet(txn, parent));
  from_dir.mtime_ns = from_dir.ctime_ns = now;
  if (src.is_dir() && parent != new_parent) --from_dir.nlink;
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, from_dir));
  if (parent != new_parent) {
    CKPTFS_ASSIGN_OR_RETURN(to_dir, MustGet(txn, new_parent));
    to_dir.mtime_ns = to_dir.ctime_ns = now;
    if (src.is_dir()) ++to_dir.nlink;
    CKPTFS_RETURN_IF_ERROR(PutInode(txn, to_dir));
  }
  CKPTFS_RETURN_IF_ERROR(txn.Commit());
  auto it = open_files_.find(src.ino);
  if (it != open_files_.end()) it->second.version = new_version;
  return Status::OK();
}

// ---- Open files -----------------------------------------------------------------------------

Result<std::shared_ptr<OpenInode>> FileSystem::OpenInodeFor(Ino ino) {
  MutexLock lock(open_mu_);
  auto it = open_files_.find(ino);
  if (it == open_files_.end()) {
    // Read the inode under open_mu_: a commit that finished before the committer forgot the
    // previous open state of this file is visible, so the new state starts from its bytes.
    Inode inode;
    bool sealed = false;
    {
      CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
      CKPTFS_ASSIGN_OR_RETURN(inode, MustGet(txn, ino));
      // A seal that finished after the caller's own check (Open) is in the catalog by now.
      sealed = CheckWritable(txn, inode).code() == Status::Code::kReadOnly;
    }
    std::optional<OpenInode::Spool> spool;
    if (ingester_) spool = OpenInode::Spool{ingester_.get(), spool_backlog_.get()};
    auto file = std::make_shared<OpenInode>(
        inode, store_, staging_dir_, [this](OpenInode& f) { return NewFileWriter(f); }, spool);
    file->on_kernel_bytes = [this](uint64_t n) {
      metrics_.bytes_written.fetch_add(n, std::memory_order_relaxed);
    };
    file->sealed = sealed;
    file->on_content_changed = [this](Ino changed) { ViewsChanged(changed); };
    it = open_files_.emplace(ino, OpenFile{std::move(file), inode.version, 0}).first;
  }
  // Counted here, under the same lock: the committer forgets an open file without handles.
  OpenFile& open = it->second;
  ++open.handles;
  if (sealing_.count(open.version) != 0 || sealing_.count(ino) != 0) open.file->sealed = true;
  version_activity_[open.version] = std::chrono::steady_clock::now();
  return open.file;
}

// REQUIRES: OpenInodeFor() counted the handle.
Result<uint64_t> FileSystem::AddHandle(std::shared_ptr<OpenInode> file, int flags) {
  MutexLock lock(open_mu_);
  uint64_t fh = next_handle_++;
  Handle& h = handles_[fh];
  h.file = std::move(file);
  h.flags = flags;
  h.unflushed = (flags & O_TRUNC) != 0;
  return fh;
}

Result<FileSystem::Handle> FileSystem::GetHandle(uint64_t fh) {
  MutexLock lock(open_mu_);
  auto it = handles_.find(fh);
  if (it == handles_.end()) return Errno(EBADF, "file handle");
  return it->second;
}

Result<uint64_t> FileSystem::Open(Ino ino, int flags) {
  if (IsViewIno(ino)) return ViewOpen(ino, flags);  // views.cc
  Inode inode;
  {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
    CKPTFS_ASSIGN_OR_RETURN(inode, MustGet(txn, ino));
    if (inode.is_dir()) return Errno(EISDIR, "open");
    if (!inode.is_reg()) return Errno(EINVAL, "open of a special file");
    bool writing = (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
    if (writing) CKPTFS_RETURN_IF_ERROR(CheckWritable(txn, inode));
  }
  CKPTFS_ASSIGN_OR_RETURN(auto file, OpenInodeFor(ino));
  CKPTFS_ASSIGN_OR_RETURN(uint64_t fh, AddHandle(file, flags));
  bool writing = (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
  if (writing && file->sealed) {  // its version is being sealed right now
    (void)Release(fh);
    return Status::ReadOnly("version is being sealed");
  }
  if (flags & O_TRUNC) {
    if (Status s = file->TruncateForOpen(); !s.ok()) {  // sealed meanwhile
      (void)Release(fh);
      return s;
    }
  }
  return fh;
}

Result<std::pair<Inode, uint64_t>> FileSystem::Create(Ino parent, std::string_view name,
                                                      uint32_t mode, int flags,
                                                      const Caller& caller) {
  auto made = MakeNode(parent, name, S_IFREG | (mode & 07777), caller, "");
  if (!made.ok()) {
    if (made.status().code() != Status::Code::kAlreadyExists || (flags & O_EXCL)) {
      return made.status();
    }
    CKPTFS_ASSIGN_OR_RETURN(Inode existing, Lookup(parent, name));
    CKPTFS_ASSIGN_OR_RETURN(uint64_t fh, Open(existing.ino, flags));
    return std::make_pair(existing, fh);
  }
  CKPTFS_ASSIGN_OR_RETURN(uint64_t fh, Open(made->ino, flags & ~O_TRUNC));
  return std::make_pair(*made, fh);
}

Result<size_t> FileSystem::Read(uint64_t fh, uint64_t offset, MutableBytes out) {
  if (IsViewHandle(fh)) {
    ScopedLatency timed(metrics_.read);
    auto n = ViewRead(fh, offset, out);  // views.cc
    if (n.ok()) metrics_.bytes_read.fetch_add(*n, std::memory_order_relaxed);
    return n;
  }
  std::vector<ChunkSlice> slices;
  CKPTFS_ASSIGN_OR_RETURN(size_t n, ReadSlices(fh, offset, out.size(), &slices));
  size_t done = 0;
  for (const ChunkSlice& slice : slices) {
    std::memcpy(out.data() + done, slice.bytes().data(), slice.length);
    done += slice.length;
  }
  return n;
}

Result<size_t> FileSystem::ReadSlices(uint64_t fh, uint64_t offset, size_t length,
                                      std::vector<ChunkSlice>* out) {
  ScopedLatency timed(metrics_.read);
  Result<size_t> n = size_t{0};
  if (IsViewHandle(fh)) {
    Buffer buf(length);
    n = ViewRead(fh, offset, buf.mutable_bytes());  // views.cc
    if (n.ok() && *n > 0) {
      out->push_back(ChunkSlice{std::make_shared<const Buffer>(std::move(buf)), 0, *n});
    }
  } else {
    auto h = GetHandle(fh);
    n = h.ok() ? ReadOnce(*h, offset, length, out, 0) : Result<size_t>(h.status());
  }
  if (n.ok()) metrics_.bytes_read.fetch_add(*n, std::memory_order_relaxed);
  return n;
}

Result<size_t> FileSystem::ReadOnce(const Handle& h, uint64_t offset, size_t length,
                                    std::vector<ChunkSlice>* out, int attempt) {
  ContentId content = 0;
  // First without a buffer: a clean file with a content (the common case) needs none.
  MutableBytes probe;
  CKPTFS_ASSIGN_OR_RETURN(std::optional<size_t> pending,
                          h.file->ReadPending(offset, probe, &content));
  if (pending || content == 0) {
    // Past the end, bytes not (only) in the store, or zeros: into a buffer of their own.
    Buffer buf(length);
    MutableBytes into = buf.mutable_bytes();  // clamped to the file's size
    CKPTFS_ASSIGN_OR_RETURN(pending, h.file->ReadPending(offset, into, &content));
    if (!pending && content == 0) {
      std::memset(into.data(), 0, into.size());
      pending = into.size();
    }
    if (pending) {
      if (*pending > 0) {
        out->push_back(ChunkSlice{std::make_shared<const Buffer>(std::move(buf)), 0, *pending});
      }
      return *pending;
    }
    // Committed meanwhile: clean now, read from the store below.
  }
  // A clean file reads straight from the store, without holding the file's lock.
  std::shared_ptr<ContentReader> reader;
  {
    MutexLock lock(h.read_ahead->mu);
    if (!h.read_ahead->reader || h.read_ahead->reader->id() != content) {
      h.read_ahead->reader = std::make_shared<ContentReader>(
          store_, content, options_.readahead_bytes, PrefetchPriorityOf(h.file->ino));
    }
    reader = h.read_ahead->reader;
  }
  const size_t first = out->size();
  Result<size_t> n = reader->ReadSlices(offset, length, out);
  if (!n.ok() && n.status().IsNotFound() && attempt == 0) {
    // A commit replaced (and released) the content after we looked: read the new one.
    out->resize(first);
    return ReadOnce(h, offset, length, out, attempt + 1);
  }
  return n;
}

std::unique_ptr<ContentWriter> FileSystem::NewFileWriter(OpenInode& f) {
  auto writer = store_->NewWriter();
  if (std::optional<ContentId> previous = CommittedContent(ReferenceFile(f))) {
    Status s = writer->SetReference(*previous);
    if (!s.ok()) spdlog::warn("inode {}: no deltas for this file: {}", f.ino, s.ToString());
  } else {
    // No file of that name in the previous version (a new name per checkpoint, a copy): the
    // most recent stored file with the same tensors is the reference, found by its layout.
    const Ino ino = f.ino;
    writer->SetReferenceFinder([store = store_, ino](uint64_t signature) {
      auto found = store->FindContentByLayout(signature);
      if (!found.ok()) {
        spdlog::warn("inode {}: looking for a delta reference: {}", ino, found.status().ToString());
        return std::optional<ContentId>();
      }
      if (*found) spdlog::debug("inode {}: deltas against content {} (same tensors)", ino, **found);
      return *found;
    });
  }
  return writer;
}

std::optional<Ino> FileSystem::ReferenceFile(OpenInode& f) {
  std::call_once(f.reference_once, [&] { f.reference_file = PreviousVersionFile(f.ino); });
  return f.reference_file;
}

std::optional<ContentId> FileSystem::CommittedContent(std::optional<Ino> file) {
  if (!file) return std::nullopt;
  auto txn = store_->catalog().BeginRead();
  if (!txn.ok()) return std::nullopt;
  auto match = GetInode(*txn, *file);
  if (!match.ok() || !*match || !(*match)->is_reg() || (*match)->content == 0) return std::nullopt;
  return (*match)->content;
}

std::optional<Ino> FileSystem::PreviousVersionFile(Ino ino) {
  constexpr int kMaxDepth = 256;
  auto txn = store_->catalog().BeginRead();
  if (!txn.ok()) return std::nullopt;
  auto get = [&](Ino i) -> std::optional<Inode> {
    auto inode = GetInode(*txn, i);
    return inode.ok() ? *inode : std::nullopt;
  };
  std::optional<Inode> file = get(ino);
  if (!file || file->version == 0 || file->version == ino) return std::nullopt;
  std::optional<Inode> version = get(file->version);
  if (!version) return std::nullopt;
  // The file's path below its version, leaf first.
  std::vector<std::string> path;
  for (Inode cur = *file; cur.ino != version->ino;) {
    if (path.size() >= kMaxDepth) return std::nullopt;
    auto name = NameIn(*txn, cur.parent, cur.ino);
    std::optional<Inode> parent = get(cur.parent);
    if (!name.ok() || !*name || !parent) return std::nullopt;
    path.push_back(std::move(**name));
    cur = *parent;
  }
  // The newest version older than this one.
  std::optional<Inode> previous;
  auto roots = ListDirents(*txn, kRootIno);
  if (!roots.ok()) return std::nullopt;
  for (const DirEntry& e : *roots) {
    if (!S_ISDIR(e.mode)) continue;
    std::optional<Inode> v = get(e.ino);
    if (v && v->version_seq < version->version_seq &&
        (!previous || v->version_seq > previous->version_seq)) {
      previous = v;
    }
  }
  if (!previous) return std::nullopt;
  Ino at = previous->ino;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    auto child = GetDirent(*txn, at, *it);
    if (!child.ok() || !*child) return std::nullopt;
    at = **child;
  }
  return at;
}

Status FileSystem::Write(uint64_t fh, uint64_t offset, Bytes data) {
  if (IsViewHandle(fh)) return Status::ReadOnly("views are read-only");
  ScopedLatency timed(metrics_.write);
  CKPTFS_ASSIGN_OR_RETURN(Handle h, GetHandle(fh));
  OpenInode& f = *h.file;
  SettleReference(f);  // before the file's lock: the committer needs it
  // Marked before the bytes land: CommitIfClosed must not take this file for closed meanwhile.
  if (!h.unflushed) MarkUnflushed(fh, true);
  Status s = f.Write(offset, data, (h.flags & O_APPEND) != 0);
  if (s.ok()) metrics_.bytes_written.fetch_add(data.size(), std::memory_order_relaxed);
  return s;
}

Status FileSystem::Flush(uint64_t fh) {
  if (IsViewHandle(fh)) return Status::OK();
  CKPTFS_ASSIGN_OR_RETURN(Handle h, GetHandle(fh));
  if (h.passthrough) h.file->RefreshViewFromBacking();
  MarkUnflushed(fh, false);
  return h.file->error();
}

void FileSystem::MarkUnflushed(uint64_t fh, bool unflushed) {
  MutexLock lock(open_mu_);
  auto it = handles_.find(fh);
  if (it != handles_.end()) it->second.unflushed = unflushed;
}

Status FileSystem::Fsync(uint64_t fh) {
  if (IsViewHandle(fh)) return Status::OK();
  ScopedLatency timed(metrics_.fsync);
  CKPTFS_ASSIGN_OR_RETURN(Handle h, GetHandle(fh));
  ++h.file->fsyncs_in_progress;
  Status s = h.passthrough && options_.fsync_journal && !options_.after_durable
                 ? committer_->Journal(h.file)
                 : committer_->Commit(h.file, /*release=*/false, /*wait=*/true);
  --h.file->fsyncs_in_progress;
  CKPTFS_RETURN_IF_ERROR(s);
  return options_.after_durable ? options_.after_durable() : Status::OK();
}

bool FileSystem::PassthroughEligible(uint64_t fh) {
  if (!fine_change_times_ || IsViewHandle(fh)) return false;
  MutexLock lock(open_mu_);
  auto h = handles_.find(fh);
  if (h == handles_.end() || (h->second.flags & O_ACCMODE) == O_RDONLY) return false;
  const std::shared_ptr<OpenInode>& file = h->second.file;
  auto open = open_files_.find(file->ino);
  return open != open_files_.end() && open->second.file == file && open->second.handles == 1 &&
         !file->sealed && file->passthrough_handles() == 0 && file->size_view() == 0;
}

Result<FileDescriptor> FileSystem::StartPassthrough(uint64_t fh) {
  CKPTFS_ASSIGN_OR_RETURN(Handle h, GetHandle(fh));
  SettleReference(*h.file);  // the kernel's writes do not come to Write()
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, h.file->StartPassthrough());
  MarkPassthrough(fh, true);
  return fd;
}

void FileSystem::SettleReference(OpenInode& f) {
  if (f.reference_settled.exchange(true)) return;
  // The same file of the previous version is this one's delta reference: if it was closed
  // but its commit is still queued (`cp -r` of one version right after another), commit it
  // now, so that deltas do not depend on timing.
  if (std::optional<Ino> previous = ReferenceFile(f)) {
    Status s = CommitIfClosed(*previous);
    if (!s.ok()) spdlog::warn("inode {}: committing its reference: {}", f.ino, s.ToString());
  }
}

void FileSystem::MarkPassthrough(uint64_t fh, bool on) {
  MutexLock lock(open_mu_);
  auto it = handles_.find(fh);
  if (it == handles_.end() || it->second.passthrough == on) return;
  it->second.passthrough = on;
  // The kernel writes through it unseen until the next FLUSH (a reader that joined does not).
  if (on && (it->second.flags & O_ACCMODE) != O_RDONLY) it->second.unflushed = true;
  if (!on) it->second.file->EndPassthroughHandle();
}

void FileSystem::AbandonPassthrough(uint64_t fh) { MarkPassthrough(fh, false); }

bool FileSystem::JoinPassthrough(uint64_t fh) {
  auto h = GetHandle(fh);
  if (!h.ok() || !h->file->AddPassthroughHandle()) return false;
  MarkPassthrough(fh, true);
  return true;
}

FileSystem::Backlog FileSystem::WriteBacklog() {
  Backlog b;
  b.queued_commits = committer_->depth();
  MutexLock lock(open_mu_);
  for (const auto& [ino, open] : open_files_) {
    b.pending_bytes += open.file->pending_bytes();
    if (open.file->holds_journal()) {
      ++b.journaled_files;
      b.journaled_bytes += open.file->journaled_bytes();
    }
  }
  return b;
}

// For views (views.cc) and delta references. A file released with its commit still queued
// qualifies, and so does one whose writer has closed it while the kernel's RELEASE has not
// reached us yet (close() returns after FLUSH): a view looked up right after torch.save must
// not show the older content. A handle still writing keeps the file as it is (the view shows
// the last committed content); readers do not hold it back.
Status FileSystem::CommitIfClosed(Ino ino) {
  std::shared_ptr<OpenInode> pending;
  {
    MutexLock lock(open_mu_);
    auto it = open_files_.find(ino);
    if (it == open_files_.end()) return Status::OK();
    if (it->second.handles > 0) {
      for (const auto& [fh, h] : handles_) {
        if (h.file == it->second.file && h.unflushed) return Status::OK();
      }
    }
    pending = it->second.file;
  }
  // Waits for a commit of it under way (the file's lock); one queued or not yet made runs now.
  CKPTFS_ASSIGN_OR_RETURN(bool uncommitted, pending->HasUncommittedChanges());
  if (!uncommitted) return Status::OK();
  return committer_->Commit(std::move(pending), /*release=*/false, /*wait=*/true);
}

Status FileSystem::Release(uint64_t fh) {
  if (IsViewHandle(fh)) return ViewRelease(fh);  // views.cc
  std::shared_ptr<OpenInode> file;
  {
    MutexLock lock(open_mu_);
    auto it = handles_.find(fh);
    if (it == handles_.end()) return Errno(EBADF, "release");
    file = std::move(it->second.file);
    if (it->second.passthrough) file->EndPassthroughHandle();
    handles_.erase(it);
    // A file with handles is the one open_files_ holds for its inode (only ForgetReleased
    // removes it, once it has none).
    auto open = open_files_.find(file->ino);
    if (open != open_files_.end() && open->second.file == file) {
      version_activity_[open->second.version] = std::chrono::steady_clock::now();
      if (--open->second.handles > 0) return Status::OK();
    } else {  // not reached; its bytes are committed all the same
      spdlog::error("release of inode {}: its open file is not in the table of open files",
                    file->ino);
    }
  }
  return committer_->Commit(std::move(file), /*release=*/true, /*wait=*/false);
}

void FileSystem::ForgetReleased(const std::shared_ptr<OpenInode>& file) {
  // Forget the open file unless it was opened again; drop it if it was unlinked. A file that
  // was opened, changed and released again since this commit began has the commit of that
  // release still queued: forgetting it now would let the next open read the catalog's older
  // content, and that queued commit would later release the content the new open state
  // continues (wrong bytes, then a failed append). That commit's own call forgets it.
  auto txn = store_->catalog().BeginWrite();
  bool forget = false;
  if (txn.ok()) {
    MutexLock lock(open_mu_);
    auto it = open_files_.find(file->ino);
    forget = it != open_files_.end() && it->second.file == file && it->second.handles == 0 &&
             !file->changed_since_commit() && !file->holds_journal();
    if (forget) open_files_.erase(it);
  }
  if (forget) {
    auto inode = GetInode(*txn, file->ino);
    Status d = inode.ok() ? Status::OK() : inode.status();
    if (d.ok() && *inode && (*inode)->nlink == 0) d = DropInode(*txn, **inode);
    if (d.ok()) d = txn->Commit();
    if (!d.ok()) spdlog::error("dropping unlinked inode {} failed: {}", file->ino, d.ToString());
  }
}

// ---- Directories, xattrs, statfs --------------------------------------------------------------

Result<uint64_t> FileSystem::OpenDir(Ino ino) {
  std::vector<DirEntry> entries;
  if (IsViewIno(ino)) {
    CKPTFS_ASSIGN_OR_RETURN(entries, ViewListDir(ino));  // views.cc
  } else {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
    CKPTFS_ASSIGN_OR_RETURN(Inode dir, MustGet(txn, ino));
    if (!dir.is_dir()) return Errno(ENOTDIR, "opendir");
    CKPTFS_ASSIGN_OR_RETURN(entries, ListDirents(txn, ino));
  }
  MutexLock lock(open_mu_);
  uint64_t dh = next_handle_++;
  dir_handles_[dh] = std::move(entries);
  return dh;
}

Status FileSystem::ReadDir(uint64_t dh, uint64_t offset,
                           const std::function<bool(const DirEntry&, uint64_t)>& fn) {
  // fn only fills the reply buffer: it may run under the lock.
  MutexLock lock(open_mu_);
  auto it = dir_handles_.find(dh);
  if (it == dir_handles_.end()) return Errno(EBADF, "readdir");
  const std::vector<DirEntry>& entries = it->second;
  for (uint64_t i = offset; i < entries.size(); ++i) {
    if (!fn(entries[i], i + 1)) break;
  }
  return Status::OK();
}

void FileSystem::ReleaseDir(uint64_t dh) {
  MutexLock lock(open_mu_);
  dir_handles_.erase(dh);
}

Result<Inode> FileSystem::SetAttr(Ino ino, const SetAttrRequest& req) {
  if (IsViewIno(ino)) return Status::ReadOnly("views are read-only");
  if (req.size) {
    CKPTFS_ASSIGN_OR_RETURN(uint64_t fh, Open(ino, O_WRONLY));
    Status s;
    {
      auto h = GetHandle(fh);
      s = h.ok() ? h->file->Truncate(*req.size) : h.status();
    }
    Status r = Release(fh);
    CKPTFS_RETURN_IF_ERROR(s);
    CKPTFS_RETURN_IF_ERROR(r);
  }
  if (req.mode || req.uid || req.gid || req.atime_ns || req.mtime_ns) {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
    CKPTFS_ASSIGN_OR_RETURN(Inode inode, MustGet(txn, ino));
    CKPTFS_RETURN_IF_ERROR(CheckWritable(txn, inode));
    if (req.mode) inode.mode = (inode.mode & S_IFMT) | (*req.mode & 07777);
    if (req.uid) inode.uid = *req.uid;
    if (req.gid) inode.gid = *req.gid;
    if (req.atime_ns) inode.atime_ns = *req.atime_ns;
    if (req.mtime_ns) inode.mtime_ns = *req.mtime_ns;
    inode.ctime_ns = NowUnixNs();
    CKPTFS_RETURN_IF_ERROR(PutInode(txn, inode));
    // An open file's view takes a new mtime before the transaction commits (a commit of the
    // file binds this mtime), and the transaction commits under open_mu_: an open in between
    // would start from the catalog's older mtime (OpenInodeFor reads it under this lock).
    MutexLock lock(open_mu_);
    if (req.mtime_ns) {
      auto it = open_files_.find(ino);
      if (it != open_files_.end()) it->second.file->set_mtime_view(*req.mtime_ns);
    }
    CKPTFS_RETURN_IF_ERROR(txn.Commit());
  }
  return GetAttr(ino);
}

Status FileSystem::SetXattr(Ino ino, std::string_view name, std::string_view value, int flags) {
  if (name == "user.ckptfs.seal") return Seal(ino);
  if (name == "user.ckptfs.sync") {
    // `ckptfs sync`: durable, and settled: the background re-encoding into reverse deltas of
    // what it made durable has finished too (what `ckptfs stats` then reports stays).
    CKPTFS_RETURN_IF_ERROR(Sync());
    store_->WaitReencoded();
    return Status::OK();
  }
  if (name == "user.ckptfs.gc") {
    // Pending commits finish first. One that failed (typically for lack of space, which is
    // why gc runs now) is logged, and must not keep gc from freeing space.
    if (Status synced = Sync(); !synced.ok()) {
      spdlog::warn("gc: a commit before it failed: {}", synced.ToString());
    }
    return store_->Gc().status();
  }
  if (name.substr(0, 5) != "user.") return Status::NotSupported("only user.* attributes");
  if (IsViewIno(ino)) return Status::ReadOnly("views are read-only");
  if (value.size() > 64 * 1024) return Errno(E2BIG, "xattr value");
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
  CKPTFS_ASSIGN_OR_RETURN(Inode inode, MustGet(txn, ino));
  CKPTFS_RETURN_IF_ERROR(CheckWritable(txn, inode));
  if (name == kFileVersionsAttr) {  // file_versions.h: "1" marks the directory, "0" unmarks
    if (!inode.is_dir()) return Errno(ENOTDIR, "file versions are marked on a directory");
    if (value != "1" && value != "0") {
      return Status::InvalidArgument(std::string(name) + " takes \"1\" or \"0\"");
    }
    CKPTFS_RETURN_IF_ERROR(MarkFileVersions(txn, ino, value == "1"));
    return txn.Commit();
  }
  CKPTFS_ASSIGN_OR_RETURN(auto old, txn.Get(Table::kXattrs, XattrKey(ino, name)));
  if ((flags & XATTR_CREATE) && old) return Status::AlreadyExists(std::string(name));
  if ((flags & XATTR_REPLACE) && !old) return Errno(ENODATA, std::string(name));
  CKPTFS_RETURN_IF_ERROR(txn.Put(Table::kXattrs, XattrKey(ino, name), value));
  return txn.Commit();
}

Result<std::string> FileSystem::GetXattr(Ino ino, std::string_view name) {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
  if (name == "user.ckptfs.pid") return std::to_string(::getpid());
  if (name == "user.ckptfs.stats") {
    CKPTFS_ASSIGN_OR_RETURN(StoreStats st, store_->Stats());
    std::string out = "logical_bytes " + std::to_string(st.logical_bytes) + "\npack_bytes " +
                      std::to_string(st.pack_bytes) + "\nchunks " + std::to_string(st.chunks) +
                      "\n";
    // Read counters since mount (docs/views.md): what readers cost the packs.
    out += "pack_read_bytes " + std::to_string(store_->pack_read_bytes()) + "\n";
    out += "pack_reads " + std::to_string(store_->pack_reads()) + "\n";
    return out;
  }
  if (name == "user.ckptfs.sealed") {
    CKPTFS_ASSIGN_OR_RETURN(Inode inode, MustGet(txn, ino));
    if (inode.file_version() || (inode.is_reg() && inode.sealed())) {
      return std::string(inode.sealed() ? "1" : "0");
    }
    if (inode.version == 0) return Errno(ENODATA, "not in a version");
    CKPTFS_ASSIGN_OR_RETURN(Inode version, MustGet(txn, inode.version));
    return std::string(version.sealed() ? "1" : "0");
  }
  CKPTFS_ASSIGN_OR_RETURN(auto value, txn.Get(Table::kXattrs, XattrKey(ino, name)));
  if (!value) return Errno(ENODATA, std::string(name));
  return *value;
}

Result<std::vector<std::string>> FileSystem::ListXattr(Ino ino) {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
  std::vector<std::string> names;
  const std::string prefix = XattrPrefix(ino);
  CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kXattrs, prefix, "", [&](auto key, auto) {
    names.emplace_back(key.substr(prefix.size()));
    return true;
  }));
  return names;
}

Status FileSystem::RemoveXattr(Ino ino, std::string_view name) {
  if (IsViewIno(ino)) return Status::ReadOnly("views are read-only");
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
  CKPTFS_ASSIGN_OR_RETURN(Inode inode, MustGet(txn, ino));
  CKPTFS_RETURN_IF_ERROR(CheckWritable(txn, inode));
  CKPTFS_ASSIGN_OR_RETURN(auto old, txn.Get(Table::kXattrs, XattrKey(ino, name)));
  if (!old) return Errno(ENODATA, std::string(name));
  if (name == kFileVersionsAttr) {
    CKPTFS_RETURN_IF_ERROR(MarkFileVersions(txn, ino, false));
  } else {
    CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kXattrs, XattrKey(ino, name)));
  }
  return txn.Commit();
}

Result<struct statvfs> FileSystem::StatFs() {
  struct statvfs st;
  if (::statvfs(store_->dir().c_str(), &st) != 0) return Errno(errno, "statfs");
  st.f_namemax = 255;
  return st;
}

// ---- Durability and versions ----------------------------------------------------------------

Status FileSystem::Sync() {
  std::vector<std::pair<std::shared_ptr<OpenInode>, bool>> open;  // and whether released
  {
    MutexLock lock(open_mu_);
    for (const auto& [ino, entry] : open_files_) open.emplace_back(entry.file, entry.handles == 0);
  }
  // A released file is still here when its commit is queued, or failed and holds a journal:
  // as a release, so that the table forgets it once committed.
  for (auto& [file, released] : open) {
    CKPTFS_RETURN_IF_ERROR(committer_->Commit(file, released, /*wait=*/false));
  }
  CKPTFS_RETURN_IF_ERROR(committer_->Barrier());
  return options_.after_durable ? options_.after_durable() : Status::OK();
}

}  // namespace ckptfs
