#include "engine/store/space_reserve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/util/file.h"

namespace ckptfs {

SpaceReserve::SpaceReserve(std::filesystem::path path, uint64_t bytes)
    : path_(std::move(path)), bytes_(bytes) {}

Status SpaceReserve::Refill() {
  MutexLock lock(mu_);
  if (bytes_ == 0 || held_) return Status::OK();
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(path_, O_RDWR | O_CREAT | O_CLOEXEC));
  struct stat st {};
  if (::fstat(fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_blocks) * 512 >= bytes_) {
    held_ = true;  // left by an earlier run
    return Status::OK();
  }
  if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes_)) != 0) {
    const int err = errno;
    // A partly allocated reserve would only make the disk look fuller: none at all.
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    if (err == EOPNOTSUPP) return Status::NotSupported("fallocate " + path_.string());
    return Status::FromErrno(
        err, "reserve " + std::to_string(bytes_ >> 20) + " MiB at " + path_.string());
  }
  CKPTFS_RETURN_IF_ERROR(DataSync(fd.get(), path_));
  held_ = true;
  return Status::OK();
}

bool SpaceReserve::Release() {
  MutexLock lock(mu_);
  if (!held_) return false;
  held_ = false;
  std::error_code ec;
  // Truncating frees the blocks even if the name cannot go; the name is removed too so that a
  // restart sees no reserve until there is room for one.
  if (::truncate(path_.c_str(), 0) != 0) return false;
  std::filesystem::remove(path_, ec);
  return true;
}

bool SpaceReserve::held() const {
  MutexLock lock(mu_);
  return held_;
}

}  // namespace ckptfs
