// engine/util/file.h
//
// Thin, errno-checked wrappers over the POSIX calls the store uses. Every failure comes back
// as a Status naming the path and the operation; ENOSPC becomes Status::NoSpace.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

// Owns a file descriptor; closes it on destruction. Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.Release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Offsets, lengths and buffers of the O_DIRECT reads and writes of pack files are multiples of
// this: the page size, which covers the logical block size of every common disk (512 or 4096).
inline constexpr uint64_t kDirectIoAlignment = 4096;
inline constexpr uint64_t AlignDownForDirectIo(uint64_t n) {
  return n / kDirectIoAlignment * kDirectIoAlignment;
}
inline constexpr uint64_t AlignUpForDirectIo(uint64_t n) {
  return AlignDownForDirectIo(n + kDirectIoAlignment - 1);
}

Result<FileDescriptor> OpenFile(const std::filesystem::path& path, int flags, int mode = 0600);
// Reads exactly out.size() bytes at offset; a short file is Corruption ("truncated").
Status PReadFull(int fd, uint64_t offset, MutableBytes out, const std::filesystem::path& path);
Status PWriteFull(int fd, uint64_t offset, Bytes data, const std::filesystem::path& path);
Status DataSync(int fd, const std::filesystem::path& path);
// fsyncs a directory so that entries created or removed in it are durable.
Status SyncDir(const std::filesystem::path& dir);
Result<uint64_t> FileSize(int fd, const std::filesystem::path& path);
// How many bytes of [offset, offset + length) of the file are in the page cache, counted in
// whole pages (cachestat(2), Linux >= 6.5): NotSupported where the kernel lacks the call.
Result<uint64_t> PageCacheBytes(int fd, uint64_t offset, uint64_t length);
// The block PunchRange extends a range's edges to (the filesystem's: ext4 and xfs allocate 4
// KiB). Whoever records what a punch may have zeroed widens the range to it (PunchedSince).
inline constexpr uint64_t kPunchBlock = 4096;
// Deallocates the bytes [from, to) of a file (they read as zeros after; FALLOC_FL_PUNCH_HOLE,
// size kept), and with them the rest of either edge's kPunchBlock where those bytes read as
// zeros already and, past `to`, lie below `stable_end` (bytes past it may still be written).
// A range punched on its own leaves the blocks it shares with its neighbours allocated,
// zeroed: a neighbouring range punched later frees them. Bytes that read as zeros read back
// the same from a hole, whoever they belong to. NotSupported where the filesystem has no
// holes.
Status PunchRange(int fd, uint64_t from, uint64_t to, uint64_t stable_end,
                  const std::filesystem::path& path);
// Writes `contents` to path durably and atomically (temp file, fsync, rename, fsync dir).
Status WriteFileAtomic(const std::filesystem::path& path, std::string_view contents);
Result<std::string> ReadSmallFile(const std::filesystem::path& path);

}  // namespace ckptfs
