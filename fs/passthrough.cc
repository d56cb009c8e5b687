#include "fs/passthrough.h"

#include <linux/fuse.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ckptfs {
namespace {

// Protocol 7.40 (Linux 6.9), newer than the 7.38 of Debian 12's headers.
constexpr uint64_t kInitPassthrough = uint64_t{1} << 37;  // FUSE_PASSTHROUGH
constexpr uint32_t kOpenPassthrough = 1u << 7;            // FOPEN_PASSTHROUGH
constexpr uint32_t kInitExt = 1u << 30;                   // FUSE_INIT_EXT
constexpr uint32_t kWritebackCache = 1u << 16;            // FUSE_WRITEBACK_CACHE
struct BackingMap {                                       // struct fuse_backing_map
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
constexpr unsigned long kBackingOpen = _IOW(229, 1, BackingMap);  // FUSE_DEV_IOC_BACKING_OPEN
constexpr unsigned long kBackingClose = _IOW(229, 2, uint32_t);   // FUSE_DEV_IOC_BACKING_CLOSE
// fuse_init_out 7.40: flags2 at 32, max_stack_depth at 36 (unused[0] in 7.38).
constexpr size_t kInitOutFlags = 12;
constexpr size_t kInitOutFlags2 = 32;
constexpr size_t kInitOutStackDepth = 36;
// fuse_open_out 7.40: fh, open_flags, backing_id (padding in 7.38).
struct OpenOut {
  uint64_t fh;
  uint32_t open_flags;
  int32_t backing_id;
};
static_assert(sizeof(OpenOut) == sizeof(fuse_open_out));

FusePassthrough* g_instance = nullptr;

uint32_t Load32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
void Store32(std::byte* p, uint32_t v) { std::memcpy(p, &v, sizeof(v)); }

}  // namespace

Status FusePassthrough::Install(fuse_session* se, bool allowed) {
  if (g_instance != nullptr) return Status::InvalidArgument("passthrough installed twice");
  const int fd = fuse_session_fd(se);
  g_instance = new FusePassthrough(fd, allowed);  // lives as long as the process
  static const fuse_custom_io io = {&FusePassthrough::WritevHook, &FusePassthrough::ReadHook,
                                    nullptr, nullptr};
  if (int rc = fuse_session_custom_io(se, &io, fd); rc != 0) {
    return Status::FromErrno(-rc, "install the FUSE session's I/O");
  }
  return Status::OK();
}

FusePassthrough* FusePassthrough::Get() { return g_instance; }

Status FusePassthrough::Release(FileSystem& fs, uint64_t fh) {
  return g_instance != nullptr ? g_instance->ReleaseHandle(fs, fh) : fs.Release(fh);
}

ssize_t FusePassthrough::ReadHook(int fd, void* buf, size_t len, void*) {
  const ssize_t n = ::read(fd, buf, len);
  if (n >= static_cast<ssize_t>(sizeof(fuse_in_header))) {
    const int saved = errno;
    g_instance->SawRequest(buf, static_cast<size_t>(n));
    errno = saved;
  }
  return n;
}

ssize_t FusePassthrough::WritevHook(int fd, struct iovec* iov, int count, void*) {
  g_instance->PatchReply(iov, count);
  return ::writev(fd, iov, count);
}

void FusePassthrough::SawRequest(const void* buf, size_t len) {
  fuse_in_header in;
  std::memcpy(&in, buf, sizeof(in));
  const auto* body = static_cast<const std::byte*>(buf) + sizeof(in);
  if (in.opcode == FUSE_INIT && len >= sizeof(in) + 20) {
    const uint32_t flags = Load32(body + 12);
    const uint32_t flags2 = (flags & kInitExt) ? Load32(body + 16) : 0;
    kernel_offers_ = (flags2 & (kInitPassthrough >> 32)) != 0;
    init_unique_ = in.unique;
    return;
  }
  if ((in.opcode == FUSE_OPEN || in.opcode == FUSE_CREATE) && enabled_.load()) {
    std::lock_guard lock(mu_);
    open_uniques_[in.unique] = in.opcode;
    ++open_requests_;
  }
}

void FusePassthrough::PatchReply(struct iovec* iov, int count) {
  if (count < 2 || iov[0].iov_len != sizeof(fuse_out_header)) return;
  fuse_out_header out;
  std::memcpy(&out, iov[0].iov_base, sizeof(out));
  auto* body = static_cast<std::byte*>(iov[1].iov_base);
  const uint64_t init = init_unique_.load();
  if (init != 0 && out.unique == init) {
    init_unique_ = 0;
    if (out.error != 0 || iov[1].iov_len < kInitOutStackDepth + 4) return;
    const uint32_t flags = Load32(body + kInitOutFlags);
    if (!allowed_) {
      spdlog::info(
          "FUSE passthrough: off (CKPTFS_PASSTHROUGH=0, the writeback cache, or a "
          "staging filesystem without fine-grained change times)");
    } else if (!kernel_offers_.load() || !(flags & kInitExt)) {
      spdlog::info(
          "FUSE passthrough: the kernel does not offer it (Linux >= 6.9 with "
          "CONFIG_FUSE_PASSTHROUGH); every request goes through the daemon");
    } else if (flags & kWritebackCache) {
      spdlog::info("FUSE passthrough: off (the writeback cache excludes it)");
    } else {
      Store32(body + kInitOutFlags2,
              Load32(body + kInitOutFlags2) | static_cast<uint32_t>(kInitPassthrough >> 32));
      Store32(body + kInitOutStackDepth, 1);
      enabled_ = true;
      new_files_ = true;
      spdlog::info("FUSE passthrough: on (files written from empty pass through)");
    }
    return;
  }
  if (open_requests_.load() == 0) return;
  std::lock_guard lock(mu_);
  auto req = open_uniques_.find(out.unique);
  if (req == open_uniques_.end()) return;
  const uint32_t opcode = req->second;
  open_uniques_.erase(req);
  --open_requests_;
  if (out.error != 0) return;
  const size_t at = opcode == FUSE_CREATE ? sizeof(fuse_entry_out) : 0;
  if (iov[1].iov_len != at + sizeof(OpenOut)) return;
  OpenOut o;
  std::memcpy(&o, body + at, sizeof(o));
  auto id = reply_ids_.find(o.fh);
  if (id == reply_ids_.end()) return;
  o.open_flags = kOpenPassthrough;  // the kernel refuses other flags with it (keep_cache)
  o.backing_id = id->second;
  reply_ids_.erase(id);
  std::memcpy(body + at, &o, sizeof(o));
}

void FusePassthrough::Disable(const char* why, int err) {
  if (new_files_.exchange(false)) {
    spdlog::warn(
        "FUSE passthrough: off for new files from now on ({}: {}); they go through the daemon", why,
        std::strerror(err));
  }
}

void FusePassthrough::Opened(FileSystem& fs, uint64_t ino, uint64_t fh) {
  if (!enabled_.load()) return;
  std::unique_lock lock(mu_);
  auto it = by_ino_.find(ino);
  if (it != by_ino_.end()) {
    // The kernel passes this file through already: this handle must too, same backing.
    Backing& b = it->second;
    ++b.handles;
    cv_.wait(lock, [&] { return b.ready || b.failed; });
    bool joined = false;
    if (b.ready) {
      lock.unlock();
      joined = fs.JoinPassthrough(fh);
      lock.lock();
    }
    if (!joined) {
      DropBackingLocked(ino);
      return;
    }
    handle_ino_[fh] = ino;
    reply_ids_[fh] = b.id;
    ++opened_;
    return;
  }
  if (!new_files_.load() || !fs.PassthroughEligible(fh)) return;
  by_ino_[ino].handles = 1;  // pending: later opens of the file wait for it
  lock.unlock();
  auto fd = fs.StartPassthrough(fh);
  int id = -1;
  int err = 0;
  if (fd.ok()) {
    BackingMap map{fd->get(), 0, 0};
    id = ::ioctl(dev_fd_, kBackingOpen, &map);
    err = errno;
    if (id <= 0) fs.AbandonPassthrough(fh);
  } else {
    spdlog::warn("inode {}: no passthrough ({})", ino, fd.status().ToString());
  }
  lock.lock();
  Backing& b = by_ino_[ino];
  if (id <= 0) {
    if (fd.ok()) Disable("registering a backing file", err);
    b.failed = true;
    cv_.notify_all();
    --b.handles;
    if (b.handles == 0) by_ino_.erase(ino);
    return;
  }
  b.id = id;
  b.ready = true;
  cv_.notify_all();
  handle_ino_[fh] = ino;
  reply_ids_[fh] = id;
  ++opened_;
}

void FusePassthrough::DropBackingLocked(uint64_t ino) {
  auto it = by_ino_.find(ino);
  if (it == by_ino_.end() || --it->second.handles > 0) return;
  if (it->second.ready) {
    uint32_t id = static_cast<uint32_t>(it->second.id);
    if (::ioctl(dev_fd_, kBackingClose, &id) != 0) {
      spdlog::warn("FUSE passthrough: closing backing id {}: {}", id, std::strerror(errno));
    }
  }
  by_ino_.erase(it);
}

Status FusePassthrough::ReleaseHandle(FileSystem& fs, uint64_t fh) {
  std::unique_lock lock(mu_);
  auto h = handle_ino_.find(fh);
  if (h == handle_ino_.end()) {
    lock.unlock();
    return fs.Release(fh);
  }
  const uint64_t ino = h->second;
  handle_ino_.erase(h);
  reply_ids_.erase(fh);
  // Under mu_, so that no open joins the backing between this release and its closing.
  Status s = fs.Release(fh);
  DropBackingLocked(ino);
  return s;
}

}  // namespace ckptfs
