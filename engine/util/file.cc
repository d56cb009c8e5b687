#include "engine/util/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace ckptfs {

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

Result<FileDescriptor> OpenFile(const std::filesystem::path& path, int flags, int mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
  return FileDescriptor(fd);
}

Status PReadFull(int fd, uint64_t offset, MutableBytes out, const std::filesystem::path& path) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + path.string());
    }
    if (n == 0) {
      return Status::Corruption(path.string() + " is truncated: wanted " +
                                std::to_string(out.size()) + " bytes at offset " +
                                std::to_string(offset) + ", file ends after " +
                                std::to_string(offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

namespace {
// Whether [from, to) reads as zeros (false where it could not be read whole).
bool ReadsAsZeros(int fd, uint64_t from, uint64_t to) {
  std::byte buf[kPunchBlock];
  if (to <= from) return true;
  if (to - from > sizeof(buf) ||
      ::pread(fd, buf, to - from, static_cast<off_t>(from)) != static_cast<ssize_t>(to - from)) {
    return false;
  }
  return std::all_of(buf, buf + (to - from), [](std::byte b) { return b == std::byte{0}; });
}
}  // namespace

Status PunchRange(int fd, uint64_t from, uint64_t to, uint64_t stable_end,
                  const std::filesystem::path& path) {
  if (to <= from) return Status::OK();
  const uint64_t block_start = from / kPunchBlock * kPunchBlock;
  if (ReadsAsZeros(fd, block_start, from)) from = block_start;
  const uint64_t block_end = (to + kPunchBlock - 1) / kPunchBlock * kPunchBlock;
  if (block_end <= stable_end && ReadsAsZeros(fd, to, block_end)) to = block_end;
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                  static_cast<off_t>(to - from)) != 0) {
    if (errno == EOPNOTSUPP) return Status::NotSupported("no holes in " + path.string());
    return Status::FromErrno(errno, "punch a hole in " + path.string());
  }
  return Status::OK();
}

namespace {
// cachestat(2): not in Debian 12's kernel headers (6.1) nor glibc 2.36.
#ifndef SYS_cachestat
#define SYS_cachestat 451  // the same number on every architecture (the unified syscall table)
#endif
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};
}  // namespace

Result<uint64_t> PageCacheBytes(int fd, uint64_t offset, uint64_t length) {
  if (length == 0) return uint64_t{0};
  CachestatRange range{offset, length};
  Cachestat stat{};
  if (::syscall(SYS_cachestat, fd, &range, &stat, 0) != 0) {
    if (errno == ENOSYS) return Status::NotSupported("cachestat: not in this kernel");
    return Status::FromErrno(errno, "cachestat");
  }
  return stat.nr_cache * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

Status PWriteFull(int fd, uint64_t offset, Bytes data, const std::filesystem::path& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write " + path.string());
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status DataSync(int fd, const std::filesystem::path& path) {
  if (::fdatasync(fd) != 0) return Status::FromErrno(errno, "fdatasync " + path.string());
  return Status::OK();
}

Status SyncDir(const std::filesystem::path& dir) {
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync " + dir.string());
  return Status::OK();
}

Result<uint64_t> FileSize(int fd, const std::filesystem::path& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat " + path.string());
  return static_cast<uint64_t>(st.st_size);
}

Status WriteFileAtomic(const std::filesystem::path& path, std::string_view contents) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC));
    CKPTFS_RETURN_IF_ERROR(PWriteFull(fd.get(), 0, AsBytes(contents), tmp));
    CKPTFS_RETURN_IF_ERROR(DataSync(fd.get(), tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::FromErrno(errno, "rename " + tmp.string());
  }
  return SyncDir(path.parent_path());
}

Result<std::string> ReadSmallFile(const std::filesystem::path& path) {
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(path, O_RDONLY));
  CKPTFS_ASSIGN_OR_RETURN(uint64_t size, FileSize(fd.get(), path));
  if (size > (1 << 20)) return Status::Corruption(path.string() + " is implausibly large");
  std::string out(size, '\0');
  CKPTFS_RETURN_IF_ERROR(
      PReadFull(fd.get(), 0, {reinterpret_cast<std::byte*>(out.data()), out.size()}, path));
  return out;
}

}  // namespace ckptfs
