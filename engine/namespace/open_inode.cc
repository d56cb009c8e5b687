#include "engine/namespace/open_inode.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace ckptfs {
namespace {

constexpr size_t kCopyBytes = 4 << 20;
// Spool pages are punched out in multiples of this once ingested.
constexpr uint64_t kPunchAlign = 1 << 20;

}  // namespace

OpenInode::OpenInode(const Inode& inode, Store* store, std::filesystem::path staging_dir,
                     WriterFactory new_writer, std::optional<Spool> spool)
    : ino(inode.ino),
      store_(store),
      staging_dir_(std::move(staging_dir)),
      new_writer_(std::move(new_writer)),
      base_(inode.content),
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
  MutexLock lock(mu_);
  CKPTFS_RETURN_IF_ERROR(error_);
  if (size == size_) return Status::OK();  // the file keeps its bytes (and stays clean if it was)
  if (size == 0) {
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

void OpenInode::TruncateForOpen() {
  MutexLock lock(mu_);
  DropStreamLocked();
  staging_ = FileDescriptor();
  error_ = Status::OK();
  base_ = 0;
  size_ = 0;
  TouchLocked();
}

Status OpenInode::error() {
  MutexLock lock(mu_);
  if (error_.ok() && ingest_failed_) {
    MutexLock ingest(ingest_mu_);
    return ingest_error_;
  }
  return error_;
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
  MutexLock lock(mu_);
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
    Buffer buf(kCopyBytes);
    for (uint64_t off = 0; off < size && id.ok();) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyBytes, size - off));
      Status s = PReadFull(staging_.get(), off, buf.mutable_bytes().first(n), staging_dir_);
      if (s.ok()) s = writer->Append(buf.bytes().first(n));
      if (!s.ok()) id = s;
      off += n;
    }
    if (id.ok()) id = writer->Finish(bind);
    if (id.ok()) staging_ = FileDescriptor();
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
    if (!staging_.valid()) error_ = id.status();
    keep_pending = staging_.valid();
    return id.status();
  }
  base_ = *id;
  dirty_ = false;
  return Status::OK();
}

}  // namespace ckptfs
