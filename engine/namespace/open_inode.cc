#include "engine/namespace/open_inode.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

namespace ckptfs {
namespace {

constexpr size_t kCopyBytes = 4 << 20;
// Spool pages are punched out in multiples of this once ingested.
constexpr uint64_t kPunchAlign = 1 << 20;
// The fsync journal needs this much free space on the disk beyond twice the file's size.
constexpr uint64_t kJournalHeadroomBytes = 256ull << 20;

bool SameTime(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}
int64_t Ns(const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

}  // namespace

OpenInode::OpenInode(const Inode& inode, Store* store, std::filesystem::path staging_dir,
                     WriterFactory new_writer, std::optional<Spool> spool)
    : ino(inode.ino),
      store_(store),
      staging_dir_(std::move(staging_dir)),
      new_writer_(std::move(new_writer)),
      base_(inode.content),
      committed_(inode.content),
      committed_size_(inode.size),
      size_(inode.size),
      size_view_(inode.size),
      mtime_view_(inode.mtime_ns),
      spool_config_(spool) {}

OpenInode::~OpenInode() {
  // Bytes spooled and never ingested (a failed commit, a file dropped with errors) still
  // hold the backlog budget.
  MutexLock lock(mu_);
  DropStreamLocked();
}

void OpenInode::TouchLocked() {
  size_view_ = size_;
  mtime_view_ = NowUnixNs();
  dirty_ = true;
  ++changes_;
}

void OpenInode::DropStreamLocked() {
  MutexLock ingest(ingest_mu_);  // waits for an Append in progress
  if (spool_.valid() && spool_config_) {
    const uint64_t end = spooled_end_.load();
    if (end > ingested_) spool_config_->backlog->Release(static_cast<size_t>(end - ingested_));
  }
  writer_.reset();  // abandons the streamed chunks
  spool_ = FileDescriptor();
  spool_start_ = 0;
  spooled_end_ = 0;
  ingested_ = 0;
  punched_ = 0;
  ingest_error_ = Status::OK();
  ingest_failed_ = false;
}

Status OpenInode::Write(uint64_t offset, Bytes data, bool append) {
  MutexLock lock(mu_);  // Seal() commits under this lock: check after taking it
  if (sealed) return Status::ReadOnly("version is sealed");
  CKPTFS_RETURN_IF_ERROR(error_);
  CKPTFS_RETURN_IF_ERROR(RefreshFromBackingLocked());
  if (ingest_failed_) {
    MutexLock ingest(ingest_mu_);  // the ingest stopped: this does not wait
    error_ = ingest_error_;
    return error_;
  }
  if (append) offset = size_;
  Status s;
  if (!staging_.valid() && offset == size_) {
    if (!writer_) {
      std::unique_ptr<ContentWriter> writer;
      if (base_ != 0) {
        CKPTFS_ASSIGN_OR_RETURN(writer, store_->NewAppender(base_));
      } else {
        writer = new_writer_(*this);
      }
      FileDescriptor spool;
      if (spool_config_) {
        auto fd = ckptfs::OpenFile(staging_dir_, O_TMPFILE | O_RDWR, 0600);
        if (fd.ok()) {
          spool = std::move(*fd);
        } else {
          spdlog::warn("inode {}: no spool ({}); writing through", ino, fd.status().ToString());
        }
      }
      MutexLock ingest(ingest_mu_);
      writer_ = std::move(writer);
      spool_ = std::move(spool);
      spool_start_ = size_;
      spooled_end_ = size_;
      ingested_ = size_;
    }
    if (spool_.valid()) {
      spool_config_->backlog->Acquire(data.size());  // the ingest releases it
      s = PWriteFull(spool_.get(), offset - spool_start_, data, staging_dir_);
      if (s.ok()) {
        spooled_end_ = offset + data.size();
        spool_config_->ingester->Schedule(shared_from_this());
      } else {
        spool_config_->backlog->Release(data.size());
      }
    } else {
      s = writer_->Append(data);
    }
  } else {
    if (!staging_.valid()) s = ToStagingLocked();
    if (s.ok()) s = PWriteFull(staging_.get(), offset, data, staging_dir_);
  }
  if (!s.ok()) {
    if (writer_ || !staging_.valid()) error_ = s;  // streamed bytes cannot be trusted now
    return s;
  }
  size_ = std::max(size_, offset + data.size());
  pending_bytes_.fetch_add(data.size(), std::memory_order_relaxed);
  TouchLocked();
  return Status::OK();
}

bool OpenInode::IngestSome(MutableBytes scratch) {
  MutexLock lock(ingest_mu_);
  const uint64_t end = spooled_end_.load();
  if (!writer_ || !spool_.valid() || !ingest_error_.ok() || ingested_ >= end) return false;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(scratch.size(), end - ingested_));
  Status s = PReadFull(spool_.get(), ingested_ - spool_start_, scratch.first(n), staging_dir_);
  if (s.ok()) s = writer_->Append(scratch.first(n));
  if (!s.ok()) {
    spdlog::error("inode {}: ingesting spooled bytes failed: {}", ino, s.ToString());
    ingest_error_ = s;
    ingest_failed_ = true;
    ingested_cv_.NotifyAll();
    return false;
  }
  ingested_ += n;
  spool_config_->backlog->Release(n);
  // The writer holds these bytes now: free their pages, so that the spool's dirty pages stay
  // within the backlog and are never written back (nor counted against dirty limits).
  const uint64_t punch_end = (ingested_ - spool_start_) & ~uint64_t{kPunchAlign - 1};
  if (punch_end > punched_ && punch_holes_) {
    if (::fallocate(spool_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(punched_), static_cast<off_t>(punch_end - punched_)) == 0) {
      punched_ = punch_end;
    } else {
      spdlog::info("inode {}: spool pages are kept until commit (fallocate: {})", ino,
                   std::strerror(errno));
      punch_holes_ = false;
    }
  }
  ingested_cv_.NotifyAll();
  return ingested_ < spooled_end_.load();
}

Status OpenInode::WaitIngestedLocked() {
  MutexLock ingest(ingest_mu_);
  if (!spool_.valid()) return Status::OK();
  while (ingested_ < spooled_end_.load() && !ingest_failed_) ingested_cv_.Wait(ingest);
  return ingest_error_;
}

Result<size_t> OpenInode::ReadStreamedLocked(uint64_t offset, MutableBytes out) {
  if (!spool_.valid()) return writer_->ReadBack(offset, out);
  // Ingested bytes are the writer's (their spool pages may be punched out already), the rest
  // is in the spool. Waits for an Append in progress.
  MutexLock ingest(ingest_mu_);
  CKPTFS_RETURN_IF_ERROR(ingest_error_);
  size_t done = 0;
  if (offset < ingested_) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), ingested_ - offset));
    CKPTFS_ASSIGN_OR_RETURN(size_t got, writer_->ReadBack(offset, out.first(n)));
    if (got != n) return Status::Corruption("written bytes are shorter than recorded");
    done = n;
  }
  if (done < out.size()) {
    CKPTFS_RETURN_IF_ERROR(
        PReadFull(spool_.get(), offset + done - spool_start_, out.subspan(done), staging_dir_));
    done = out.size();
  }
  return done;
}

Result<std::optional<size_t>> OpenInode::ReadPending(uint64_t offset, MutableBytes& out,
                                                     ContentId* committed) {
  MutexLock lock(mu_);
  CKPTFS_RETURN_IF_ERROR(error_);
  CKPTFS_RETURN_IF_ERROR(RefreshFromBackingLocked());
  if (offset >= size_) return std::optional<size_t>(0);
  out = out.first(static_cast<size_t>(std::min<uint64_t>(out.size(), size_ - offset)));
  if (staging_.valid()) {
    ssize_t n = ::pread(staging_.get(), out.data(), out.size(), static_cast<off_t>(offset));
    if (n < 0) return Status::FromErrno(errno, "read staging file");
    return std::optional<size_t>(static_cast<size_t>(n));
  }
  if (writer_) {
    CKPTFS_ASSIGN_OR_RETURN(size_t n, ReadStreamedLocked(offset, out));
    return std::optional<size_t>(n);
  }
  *committed = base_;
  return std::optional<size_t>();
}

Status OpenInode::Truncate(uint64_t size) {
  MutexLock lock(mu_);  // Seal() commits under this lock: check after taking it
  if (sealed) return Status::ReadOnly("version is sealed");
  CKPTFS_RETURN_IF_ERROR(error_);
  CKPTFS_RETURN_IF_ERROR(RefreshFromBackingLocked());
  if (size == size_) return Status::OK();  // the file keeps its bytes (and stays clean if it was)
  if (size == 0 && !backing_) {
    DropStreamLocked();
    staging_ = FileDescriptor();
    base_ = 0;
  } else {
    if (!staging_.valid()) CKPTFS_RETURN_IF_ERROR(ToStagingLocked());
    if (::ftruncate(staging_.get(), static_cast<off_t>(size)) != 0) {
      return Status::FromErrno(errno, "truncate staging file");
    }
  }
  size_ = size;
  TouchLocked();
  return Status::OK();
}

Status OpenInode::TruncateForOpen() {
  MutexLock lock(mu_);  // Seal() commits under this lock: check after taking it
  if (sealed) return Status::ReadOnly("version is sealed");
  error_ = Status::OK();
  if (backing_ && passthrough_handles_.load() > 0) {
    // The kernel writes this staging file through the other handles: empty it, keep it.
    if (::ftruncate(staging_.get(), 0) != 0) {
      error_ = Status::FromErrno(errno, "truncate staging file");
      return Status::OK();  // sticky: the writes and the close report it
    }
    size_ = 0;
    TouchLocked();
    return Status::OK();
  }
  DropStreamLocked();
  staging_ = FileDescriptor();
  backing_ = false;
  base_ = 0;
  size_ = 0;
  TouchLocked();
  return Status::OK();
}

Status OpenInode::error() {
  MutexLock lock(mu_);
  if (error_.ok() && ingest_failed_) {
    MutexLock ingest(ingest_mu_);
    return ingest_error_;
  }
  return error_;
}

Result<bool> OpenInode::HasUncommittedChanges() {
  MutexLock commit(commit_mu_);
  MutexLock lock(mu_);
  CKPTFS_RETURN_IF_ERROR(RefreshFromBackingLocked());
  return dirty_;
}

Status OpenInode::ToStagingLocked() {
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd,
                          ckptfs::OpenFile(staging_dir_, O_TMPFILE | O_RDWR, 0600));
  Buffer buf(kCopyBytes);
  for (uint64_t off = 0; off < size_;) {
    MutableBytes piece =
        buf.mutable_bytes().first(static_cast<size_t>(std::min<uint64_t>(kCopyBytes, size_ - off)));
    size_t n;
    if (writer_) {
      CKPTFS_ASSIGN_OR_RETURN(n, ReadStreamedLocked(off, piece));
    } else if (base_ != 0) {
      CKPTFS_ASSIGN_OR_RETURN(n, store_->Read(base_, off, piece));
    } else {
      std::memset(piece.data(), 0, piece.size());
      n = piece.size();
    }
    if (n == 0) return Status::Corruption("file is shorter than its size");
    CKPTFS_RETURN_IF_ERROR(PWriteFull(fd.get(), off, piece.first(n), staging_dir_));
    off += n;
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(size_)) != 0) {
    return Status::FromErrno(errno, "size staging file");
  }
  DropStreamLocked();  // the staging file holds the bytes now
  staging_ = std::move(fd);
  return Status::OK();
}

Status OpenInode::Commit() {
  MutexLock commit(commit_mu_);
  bool changed = false;
  Status s = CommitOnce(&changed);
  if (changed && on_content_changed) on_content_changed(ino);
  return s;
}

Status OpenInode::CommitOnce(bool* changed) {
  MutexLock lock(mu_);
  // With no passthrough handle, or under an fsync (the kernel holds the inode's lock), no
  // kernel write runs while this commit reads the staging file; else one may, unseen: the next
  // commit then reads the file again whatever its times say.
  const bool writers_excluded = passthrough_handles_.load() == 0 || fsyncs_in_progress.load() > 0;
  if (Status s = RefreshFromBackingLocked(); !s.ok()) {
    spdlog::error("inode {}: cannot look at its passthrough file: {}", ino, s.ToString());
    return s;
  }
  if (backing_ && !writers_excluded) unsure_ = true;
  if (!error_.ok() && backing_ && passthrough_handles_.load() == 0 && journal_name_.empty()) {
    // The commit failed before and the kernel's last writer is gone: drop the bytes, as a
    // streamed file's are after a failed write (the inode keeps its previous content).
    staging_ = FileDescriptor();
    backing_ = false;
  }
  committed_changes_ = changes_.load();
  // Writes wait for mu_: whatever this commit does, the bytes written so far are durable or
  // lost when it returns, except after a failed commit from staging (tried again later).
  bool keep_pending = false;
  struct ClearPending {
    std::atomic<uint64_t>& bytes;
    const bool& keep;
    ~ClearPending() {
      if (!keep) bytes.store(0, std::memory_order_relaxed);
    }
  } clear_pending{pending_bytes_, keep_pending};
  if (!dirty_) return error_;
  CKPTFS_RETURN_IF_ERROR(error_);
  const uint64_t size = size_;
  auto bind = [&](Catalog::WriteTxn& txn, ContentId id) -> Status {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, ino));
    if (!inode) return id != 0 ? store_->ReleaseInTxn(txn, id) : Status::OK();
    ContentId old = inode->content;
    inode->content = id;
    inode->size = size;
    // Read inside the transaction: a utime() since the commit began (SetAttr updates the
    // view before its own transaction commits) must not be undone.
    inode->mtime_ns = mtime_view_.load();
    inode->ctime_ns = NowUnixNs();
    CKPTFS_RETURN_IF_ERROR(PutInode(txn, *inode));
    if (old != 0 && old != id) CKPTFS_RETURN_IF_ERROR(store_->ReleaseInTxn(txn, old));
    return Status::OK();
  };
  Result<ContentId> id = ContentId{0};
  if (writer_) {
    Status ingested = WaitIngestedLocked();
    if (ingested.ok()) {
      MutexLock ingest(ingest_mu_);
      id = writer_->Finish(bind);
    } else {
      id = ingested;
    }
    DropStreamLocked();  // the spool goes; unless written back, it cost no disk write
  } else if (staging_.valid()) {
    auto writer = new_writer_(*this);
    // The kernel wrote a passthrough file; its commit runs after the close or the fsync
    // journal, not while a writer waits: no raw records for the re-encoder to compress.
    if (backing_ || !journal_name_.empty()) writer->EncodeAtWrite();
    Buffer buf(kCopyBytes);
    for (uint64_t off = 0; off < size && id.ok();) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyBytes, size - off));
      Status s = PReadFull(staging_.get(), off, buf.mutable_bytes().first(n), staging_dir_);
      if (s.ok()) s = writer->Append(buf.bytes().first(n));
      if (!s.ok()) id = s;
      off += n;
    }
    if (id.ok()) id = writer->Finish(bind);
    // A passthrough file stays while the kernel may still write it.
    if (id.ok() && passthrough_handles_.load() == 0) {
      staging_ = FileDescriptor();
      backing_ = false;
    }
  } else if (size == 0) {
    // Truncated to nothing: no content.
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
    Status s = bind(txn, 0);
    if (s.ok()) s = txn.Commit();
    if (!s.ok()) id = s;
  } else {
    // Dirty without new bytes (only times changed): the content stays.
    CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginWrite());
    Status s = bind(txn, base_);
    if (s.ok()) s = txn.Commit();
    if (!s.ok()) id = s;
    if (s.ok()) id = base_;
  }
  if (!id.ok()) {
    spdlog::error("committing inode {} failed: {}; it keeps its previous contents", ino,
                  id.status().ToString());
    if (!journal_name_.empty()) {
      // An fsync acknowledged these bytes: they stay, in the journal and for the next commit.
      keep_pending = true;
      if (passthrough_handles_.load() == 0) backing_ = false;  // no kernel writer is left
      return id.status();
    }
    // A failed commit of a staging file the daemon wrote is tried again later; one that the
    // kernel wrote (passthrough) fails as streamed bytes do: sticky, reported to close() and
    // fsync(), the bytes dropped once the last writer is gone (the writer cannot be told to
    // write them again, and the daemon cannot tell whether the kernel's writes all succeeded).
    if (!staging_.valid() || backing_) error_ = id.status();
    keep_pending = staging_.valid() && !backing_;
    if (backing_ && passthrough_handles_.load() == 0) {
      staging_ = FileDescriptor();
      backing_ = false;
    }
    return id.status();
  }
  *changed = committed_ != *id || size != committed_size_;
  committed_size_ = size;
  base_ = *id;
  committed_ = *id;
  dirty_ = false;
  RemoveJournalLocked();
  return Status::OK();
}

// ---- Fsync journal ----------------------------------------------------------------------------

std::string OpenInode::JournalName(Ino ino, ContentId committed) {
  return "journal-" + std::to_string(ino) + "-" + std::to_string(committed);
}

std::optional<std::pair<Ino, ContentId>> OpenInode::ParseJournalName(std::string_view name) {
  constexpr std::string_view kPrefix = "journal-";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  // Two decimal numbers joined by '-', nothing else (from_chars refuses signs and overflow).
  const char* const end = name.data() + name.size();
  Ino ino = 0;
  ContentId content = 0;
  auto [dash, ino_err] = std::from_chars(name.data(), end, ino);
  if (ino_err != std::errc() || dash == end || *dash != '-') return std::nullopt;
  auto [last, content_err] = std::from_chars(dash + 1, end, content);
  if (content_err != std::errc() || last != end) return std::nullopt;
  return std::make_pair(ino, content);
}

Result<bool> OpenInode::Journal() {
  MutexLock lock(mu_);
  if (!backing_ || !staging_.valid()) return false;
  CKPTFS_RETURN_IF_ERROR(error_);
  CKPTFS_RETURN_IF_ERROR(RefreshFromBackingLocked());
  if (!dirty_) return false;
  // Only while the disk has room for the commit that must follow (the store's records of the
  // file, then their compressed form): nearer to full, the fsync commits, so that a full disk
  // fails the fsync that filled it and not a commit after it.
  struct statvfs fs {};
  if (::statvfs(staging_dir_.c_str(), &fs) != 0 ||
      uint64_t{fs.f_bavail} * fs.f_frsize < 2 * size_ + kJournalHeadroomBytes) {
    return false;
  }
  if (Status s = DataSync(staging_.get(), staging_dir_); !s.ok()) {
    error_ = s;  // some of the kernel's bytes may never reach the disk
    return s;
  }
  struct stat st {};
  if (::fstat(staging_.get(), &st) != 0) return Status::FromErrno(errno, "stat staging file");
  if (journal_name_.empty() || journal_file_ != st.st_ino) {
    // Linked under a temporary name, then renamed over the name: a journal of an earlier
    // staging file of this inode (emptied by an O_TRUNC open since) is replaced at once.
    const std::string name = JournalName(ino, committed_);
    const std::filesystem::path path = staging_dir_ / name, tmp = staging_dir_ / (name + ".new");
    const std::string self = "/proc/self/fd/" + std::to_string(staging_.get());
    ::unlink(tmp.c_str());
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0 ||
        ::rename(tmp.c_str(), path.c_str()) != 0) {
      spdlog::warn("inode {}: cannot name its staging file as a journal ({}); committing instead",
                   ino, std::strerror(errno));
      ::unlink(tmp.c_str());
      return false;
    }
    journal_name_ = name;
    journal_file_ = st.st_ino;
    holds_journal_ = true;
    if (Status s = SyncDir(staging_dir_); !s.ok()) {
      spdlog::warn("inode {}: journal not durable ({}); committing instead", ino, s.ToString());
      return false;
    }
  }
  pending_bytes_.store(0, std::memory_order_relaxed);
  journaled_bytes_ = size_;
  return true;
}

Status OpenInode::AdoptJournal(FileDescriptor fd, std::string name) {
  MutexLock lock(mu_);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat journal " + name);
  DropStreamLocked();
  staging_ = std::move(fd);
  backing_ = false;
  journal_name_ = std::move(name);
  journal_file_ = st.st_ino;
  holds_journal_ = true;
  size_ = static_cast<uint64_t>(st.st_size);
  journaled_bytes_ = size_;
  size_view_ = size_;
  mtime_view_ = Ns(st.st_mtim);
  dirty_ = true;
  ++changes_;
  return Status::OK();
}

void OpenInode::RemoveJournalLocked() {
  if (journal_name_.empty()) return;
  const std::filesystem::path path = staging_dir_ / journal_name_;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("inode {}: cannot remove the journal {} ({}); the next mount drops it", ino,
                 path.string(), std::strerror(errno));
  }
  journal_name_.clear();
  journal_file_ = 0;
  holds_journal_ = false;
  journaled_bytes_ = 0;
}

// ---- Passthrough ------------------------------------------------------------------------------

Status OpenInode::RefreshFromBackingLocked() {
  if (!backing_ || !staging_.valid()) return Status::OK();
  struct stat st {};
  if (::fstat(staging_.get(), &st) != 0) return Status::FromErrno(errno, "stat staging file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const bool changed = unsure_ || size != backing_size_ || !SameTime(st.st_mtim, backing_mtime_) ||
                       !SameTime(st.st_ctim, backing_ctime_);
  backing_size_ = size;
  backing_mtime_ = st.st_mtim;
  backing_ctime_ = st.st_ctim;
  unsure_ = false;
  const uint64_t seen = backing_seen_size_.exchange(size);
  if (size > seen && on_kernel_bytes) on_kernel_bytes(size - seen);
  if (!changed) return Status::OK();
  if (size > size_) pending_bytes_.fetch_add(size - size_, std::memory_order_relaxed);
  size_ = size;
  size_view_ = size_;
  dirty_ = true;
  ++changes_;
  MutexLock view(view_mu_);
  PublishMtimeLocked(st.st_mtim);
  return Status::OK();
}

Result<FileDescriptor> OpenInode::StartPassthrough() {
  MutexLock lock(mu_);
  if (sealed) return Status::ReadOnly("version is sealed");
  CKPTFS_RETURN_IF_ERROR(error_);
  if (size_ != 0 || passthrough_handles_.load() != 0) {
    return Status::InvalidArgument("passthrough needs an empty file without other such handles");
  }
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd,
                          ckptfs::OpenFile(staging_dir_, O_TMPFILE | O_RDWR, 0600));
  const int kernel_fd = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  const int view_fd = kernel_fd < 0 ? -1 : ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  if (view_fd < 0) {
    const int err = errno;
    if (kernel_fd >= 0) ::close(kernel_fd);
    return Status::FromErrno(err, "duplicate staging file descriptor");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    ::close(kernel_fd);
    ::close(view_fd);
    return Status::FromErrno(err, "stat staging file");
  }
  // Counted before `sealed` is read again, as Seal() sets `sealed` before it reads the count:
  // one of the two sees the other.
  passthrough_handles_ = 1;
  if (sealed) {
    passthrough_handles_ = 0;
    ::close(kernel_fd);
    ::close(view_fd);
    return Status::ReadOnly("version is sealed");
  }
  DropStreamLocked();
  staging_ = std::move(fd);
  backing_ = true;
  backing_size_ = 0;
  backing_seen_size_ = 0;
  backing_mtime_ = st.st_mtim;
  backing_ctime_ = st.st_ctim;
  unsure_ = false;
  TouchLocked();  // an empty new content, whether or not the kernel writes
  {
    MutexLock view(view_mu_);
    backing_view_ = FileDescriptor(view_fd);
    published_mtime_ = st.st_mtim;
    passthrough_start_ns_ = NowUnixNs();
  }
  return FileDescriptor(kernel_fd);
}

bool OpenInode::AddPassthroughHandle() {
  MutexLock lock(mu_);
  if (!backing_ || !staging_.valid() || passthrough_handles_.load() == 0) return false;
  ++passthrough_handles_;
  return true;
}

void OpenInode::EndPassthroughHandle() {
  // No mu_: a commit may hold it for seconds. The views take the file's last size now, before
  // the release's commit, so that a stat() right after close() sees it.
  RefreshViewFromBacking();
  // What the kernel wrote through this handle is not counted in changes_ until a commit looks
  // at the file: count a change now, so that a commit that began before this release (and may
  // have read less) does not let FileSystem forget the file while this release's commit is
  // still queued (the next open would read the older content).
  ++changes_;
  if (--passthrough_handles_ == 0) {
    MutexLock view(view_mu_);
    backing_view_ = FileDescriptor();
  }
}

void OpenInode::RefreshViewFromBacking() {
  MutexLock view(view_mu_);
  if (!backing_view_.valid()) return;
  struct stat st {};
  if (::fstat(backing_view_.get(), &st) != 0) return;
  size_view_ = static_cast<uint64_t>(st.st_size);
  PublishMtimeLocked(st.st_mtim);
}

void OpenInode::set_mtime_view(int64_t ns) {
  MutexLock view(view_mu_);
  if (backing_view_.valid()) {
    // The view's mtime follows the backing file's on each new write: give it this one.
    const timespec times[2] = {{0, UTIME_OMIT}, {ns / 1000000000, ns % 1000000000}};
    struct stat st {};
    if (::futimens(backing_view_.get(), times) == 0 && ::fstat(backing_view_.get(), &st) == 0) {
      published_mtime_ = st.st_mtim;
    }
  }
  mtime_view_ = ns;
}

void OpenInode::PublishMtimeLocked(const timespec& mtime) {
  // Only a new write moves the view's mtime: a utime() since the last one (cp -p right after
  // close) stays.
  if (SameTime(mtime, published_mtime_)) return;
  published_mtime_ = mtime;
  // The kernel stamps with its coarse clock (up to a tick behind): never before the file was
  // opened for these writes, as the daemon's own clock said then.
  mtime_view_ = std::max(Ns(mtime), passthrough_start_ns_);
}

uint64_t OpenInode::pending_bytes() {
  uint64_t pending = pending_bytes_.load(std::memory_order_relaxed);
  if (passthrough_handles_.load() > 0) {
    RefreshViewFromBacking();
    const uint64_t now = size_view_.load(), seen = backing_seen_size_.load();
    if (now > seen) pending += now - seen;
  }
  return pending;
}

uint64_t OpenInode::size_view() {
  if (passthrough_handles_.load() > 0) RefreshViewFromBacking();
  return size_view_.load();
}

int64_t OpenInode::mtime_view() {
  if (passthrough_handles_.load() > 0) RefreshViewFromBacking();
  return mtime_view_.load();
}

}  // namespace ckptfs
