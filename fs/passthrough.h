// fs/passthrough.h
//
// FUSE passthrough on the raw protocol (docs/fs.md, "FUSE passthrough"). Linux >= 6.9 lets the
// daemon name a backing file for an open file; the kernel then reads and writes that file
// itself, with no request to the daemon. libfuse 3.14 has no API for it, so this unit sits
// under libfuse as the session's custom I/O (fuse_session_custom_io): it sees each request as
// it is read and each reply before it is written, and
//   - answers the kernel's INIT offer of FUSE_PASSTHROUGH (flags2) with the flag and a stack
//     depth of 1 (backing files live on a plain filesystem);
//   - registers a handle's backing file with the FUSE_DEV_IOC_BACKING_OPEN ioctl and puts
//     FOPEN_PASSTHROUGH and the backing id into that handle's OPEN or CREATE reply.
// Which handles pass through is FileSystem's call (PassthroughEligible: a file opened for
// writing that is empty and has no other handle, e.g. torch.save's create); every later open
// of a file with passthrough handles must pass through too, with the same backing (the kernel
// refuses a mix with EIO), so they join it. The backing id is closed with its file's last
// passthrough handle. Where the kernel does not offer passthrough, or the ioctl fails (no
// CAP_SYS_ADMIN), nothing changes: every handle goes through the daemon.
//
//   FusePassthrough::Install(se, /*allowed=*/true);      // after fuse_session_mount
//   if (auto* pt = FusePassthrough::Get()) pt->Opened(fs, ino, fh);   // before the reply
//   Status s = FusePassthrough::Release(fs, fh);         // instead of fs.Release(fh)
//
// One session per process. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "engine/namespace/filesystem.h"
#include "engine/util/status.h"
#include "fs/fuse_ops.h"

namespace ckptfs {

class FusePassthrough {
 public:
  // Installs the custom I/O on `se` (mounted). With allowed false the INIT offer is declined
  // and no handle passes through.
  static Status Install(fuse_session* se, bool allowed);
  // The installed instance, or null.
  static FusePassthrough* Get();
  // Releases handle `fh` of `fs` (through the instance's bookkeeping when there is one).
  static Status Release(FileSystem& fs, uint64_t fh);

  // Whether the kernel agreed to passthrough at INIT and no ioctl has failed since (new files
  // pass through).
  bool enabled() const { return new_files_.load(); }
  // Handles opened with passthrough so far.
  uint64_t opened() const { return opened_.load(); }
  // For OnOpen/OnCreate once `fs` made handle `fh` of `ino`, before the reply: makes it a
  // passthrough handle where FileSystem allows it, or where the file already has some.
  void Opened(FileSystem& fs, uint64_t ino, uint64_t fh);

 private:
  struct Backing {
    int32_t id = 0;
    int handles = 0;  // counted before the backing is ready (joiners wait for it)
    bool ready = false;
    bool failed = false;
  };
  explicit FusePassthrough(int dev_fd, bool allowed) : dev_fd_(dev_fd), allowed_(allowed) {}
  static ssize_t ReadHook(int fd, void* buf, size_t len, void* userdata);
  static ssize_t WritevHook(int fd, struct iovec* iov, int count, void* userdata);
  void SawRequest(const void* buf, size_t len);
  void PatchReply(struct iovec* iov, int count);
  Status ReleaseHandle(FileSystem& fs, uint64_t fh);
  // Drops one handle's count of `ino`'s backing; closes the id with the last. REQUIRES: mu_.
  void DropBackingLocked(uint64_t ino);
  void Disable(const char* why, int err);

  const int dev_fd_;
  const bool allowed_;
  std::atomic<bool> enabled_{false};    // the kernel agreed at INIT: opens are looked at
  std::atomic<bool> new_files_{false};  // files without passthrough handles may start some
  std::atomic<uint64_t> opened_{0};
  std::atomic<uint64_t> init_unique_{0};    // the INIT request's, until its reply
  std::atomic<bool> kernel_offers_{false};  // FUSE_PASSTHROUGH in the INIT request
  std::atomic<int> open_requests_{0};       // entries in open_uniques_ (no lock to check)

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, uint32_t> open_uniques_;  // OPEN/CREATE requests: unique, opcode
  std::map<uint64_t, Backing> by_ino_;                   // files with passthrough handles
  std::unordered_map<uint64_t, uint64_t> handle_ino_;    // passthrough handles: fh -> ino
  std::unordered_map<uint64_t, int32_t> reply_ids_;      // replies not sent yet: fh -> id
};

}  // namespace ckptfs
