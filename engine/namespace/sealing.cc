// Sealing (docs/fs.md, "Sealing"): Seal() and the sealer thread that seals idle versions.
// Part of FileSystem (filesystem.h); the open files of a version are committed through the
// Committer before the version is marked sealed.
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "engine/namespace/file_versions.h"
#include "engine/namespace/filesystem.h"
#include "engine/util/thread_role.h"

namespace ckptfs {
namespace {

// The name of version `ino`, for the log (which names versions as users do), else "inode N".
std::string VersionName(Catalog& catalog, Ino ino) {
  std::string name = "inode " + std::to_string(ino);
  auto txn = catalog.BeginRead();
  if (!txn.ok()) return name;
  auto found = NameIn(*txn, kRootIno, ino);
  if (found.ok() && *found) name = **found;
  return name;
}

}  // namespace

Status FileSystem::Seal(Ino ino) {
  {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
    CKPTFS_ASSIGN_OR_RETURN(Inode inode, MustGet(txn, ino));
    if (!inode.file_version() && (!inode.is_dir() || inode.parent != kRootIno)) {
      return Status::InvalidArgument(
          "only a version (a directory at the top of the mount, or a checkpoint file in a "
          "directory marked for file versions) can be sealed");
    }
    if (inode.sealed()) return Status::OK();
  }
  // close() returns before the kernel's RELEASE reaches the daemon: a passthrough file closed
  // right before this seal (`torch.save` then `ckptfs seal`) may count its handle a moment
  // longer. Give that up to a second before calling the file busy.
  for (int waited_ms = 0; waited_ms < 1000; waited_ms += 5) {
    {
      MutexLock lock(open_mu_);
      if (!HasPassthroughWriterLocked(ino)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<std::shared_ptr<OpenInode>> in_version, marked;
  {
    MutexLock lock(open_mu_);
    if (HasPassthroughWriterLocked(ino)) {
      return Status::Busy(
          "a file of this version is open for writing through FUSE passthrough, whose "
          "writes cannot be refused: close it, then seal");
    }
    sealing_.insert(ino);  // files opened from now on are sealed too (OpenInodeFor)
    for (const auto& [i, open] : open_files_) {
      if (open.version == ino || i == ino) {
        // Further writes fail with EROFS. (A file sealed already, a file version of its own,
        // stays so whatever this seal does.)
        if (!open.file->sealed.exchange(true)) marked.push_back(open.file);
        in_version.push_back(open.file);
      }
    }
    // A passthrough start that raced the check above sees `sealed` now, or is seen here.
    for (const auto& file : in_version) {
      if (file->passthrough_handles() > 0) {
        for (const auto& f : marked) f->sealed = false;
        sealing_.erase(ino);
        return Status::Busy("a file of this version was just opened through FUSE passthrough");
      }
    }
  }
  Status s = CommitAndMarkSealed(ino, in_version);
  {
    MutexLock lock(open_mu_);
    sealing_.erase(ino);
    if (!s.ok()) {
      for (const auto& f : marked) f->sealed = false;  // the version stays writable
    }
  }
  if (s.ok()) {
    spdlog::info("sealed version {}", VersionName(store_->catalog(), ino));
    MutexLock lock(on_sealed_mu_);
    if (on_sealed_) on_sealed_();
  }
  return s;
}

bool FileSystem::HasPassthroughWriterLocked(Ino ino) {
  for (const auto& [i, open] : open_files_) {
    if ((open.version == ino || i == ino) && open.file->passthrough_handles() > 0) return true;
  }
  return false;
}

void FileSystem::SealIdleFileVersions(std::chrono::system_clock::time_point now) {
  std::vector<FileVersionEntry> files;
  {
    auto txn = store_->catalog().BeginRead();
    if (!txn.ok()) return;
    auto listed = ListFileVersions(*txn);
    if (!listed.ok()) {
      spdlog::warn("listing file versions to seal: {}", listed.status().ToString());
      return;
    }
    files = std::move(*listed);
  }
  // The newest file version of each directory stays open for changes, as the newest version.
  std::map<Ino, uint64_t> newest;
  for (const auto& f : files) {
    newest[f.inode.parent] = std::max(newest[f.inode.parent], f.inode.version_seq);
  }
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  for (const auto& f : files) {
    if (f.inode.sealed() || f.inode.version_seq == newest[f.inode.parent]) continue;
    // Idle: not open, and neither written nor changed (cp -p sets times after close) lately.
    const int64_t last = std::max(f.inode.mtime_ns, f.inode.ctime_ns);
    if (now_ns - last < std::chrono::nanoseconds(options_.seal_after).count()) continue;
    {
      MutexLock lock(open_mu_);
      if (open_files_.count(f.inode.ino) != 0) continue;
    }
    // Not open now, so its last commit is in the catalog: read its times again (the list may
    // predate a write that was open then and has been committed and forgotten since).
    {
      auto txn = store_->catalog().BeginRead();
      if (!txn.ok()) continue;
      auto fresh = GetInode(*txn, f.inode.ino);
      if (!fresh.ok() || !*fresh || (*fresh)->sealed()) continue;
      const int64_t changed = std::max((*fresh)->mtime_ns, (*fresh)->ctime_ns);
      if (now_ns - changed < std::chrono::nanoseconds(options_.seal_after).count()) continue;
    }
    Status s = Seal(f.inode.ino);
    if (!s.ok()) spdlog::warn("automatic seal of file version {} failed: {}", f.path, s.ToString());
  }
}

Status FileSystem::CommitAndMarkSealed(Ino ino,
                                       const std::vector<std::shared_ptr<OpenInode>>& files) {
  for (const auto& file : files) {
    CKPTFS_RETURN_IF_ERROR(committer_->Commit(file, /*release=*/false, /*wait=*/false));
  }
  // The barrier reports any of those commits that failed: then the version stays unsealed.
  CKPTFS_RETURN_IF_ERROR(committer_->Barrier());
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
  CKPTFS_ASSIGN_OR_RETURN(Inode inode, MustGet(txn, ino));
  inode.flags |= Inode::kSealed;
  inode.ctime_ns = NowUnixNs();
  CKPTFS_RETURN_IF_ERROR(PutInode(txn, inode));
  return txn.Commit();
}

void FileSystem::RunSealer() {
  SetThreadRole("sealer");
  const auto tick = std::max(std::chrono::milliseconds(50), options_.seal_after / 4);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    {
      MutexLock lock(sealer_mu_);
      const auto until = std::chrono::steady_clock::now() + tick;
      while (!sealer_stopping_ &&
             sealer_cv_.WaitFor(lock, until - std::chrono::steady_clock::now())) {
      }
      if (sealer_stopping_) return;
    }
    std::vector<Inode> versions;
    {
      auto txn = store_->catalog().BeginRead();
      if (!txn.ok()) continue;
      auto entries = ListDirents(*txn, kRootIno);
      if (!entries.ok()) continue;
      for (const DirEntry& e : *entries) {
        if (!S_ISDIR(e.mode)) continue;
        auto inode = GetInode(*txn, e.ino);
        if (inode.ok() && *inode) versions.push_back(**inode);
      }
    }
    uint64_t newest = 0;
    for (const auto& v : versions) newest = std::max(newest, v.version_seq);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& v : versions) {
      if (v.sealed() || v.version_seq == newest) continue;
      {  // a directory that holds file versions is their container, not a version
        auto txn = store_->catalog().BeginRead();
        auto holds = txn.ok() ? HoldsFileVersions(*txn, v.ino) : Result<bool>(txn.status());
        if (!holds.ok() || *holds) continue;
      }
      bool idle;
      {
        MutexLock lock(open_mu_);
        idle = true;
        for (const auto& [i, open] : open_files_) idle = idle && open.version != v.ino;
        auto it = version_activity_.find(v.ino);
        auto last = it == version_activity_.end() ? start : it->second;
        idle = idle && now - last >= options_.seal_after;
      }
      if (idle) {
        Status s = Seal(v.ino);
        if (!s.ok())
          spdlog::warn("automatic seal of version {} failed: {}",
                       VersionName(store_->catalog(), v.ino), s.ToString());
      }
    }
    SealIdleFileVersions(std::chrono::system_clock::now());
  }
}

}  // namespace ckptfs
