// engine/store/space_reserve.h
//
// Disk space set aside so that a full disk can still be emptied. Deleting a version on a full
// disk needs a little space itself (the catalog's copy-on-write pages); the reserve is a file
// of allocated blocks that is given back when such a change fails for lack of space, and taken
// again once there is room.
//
//   SpaceReserve reserve(store_dir / "catalog" / "reserve", 32 << 20);
//   (void)reserve.Refill();                     // at open; fails quietly on a full disk
//   Status st = change();
//   if (st.IsNoSpace() && reserve.Release()) st = change();   // once more, with the room
//
// The file's blocks are allocated (fallocate), not sparse, so ordinary writes see the disk as
// full while the reserve still holds its bytes. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>

#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs {

class SpaceReserve {
 public:
  // bytes == 0: no reserve (Refill and Release do nothing).
  SpaceReserve(std::filesystem::path path, uint64_t bytes);
  SpaceReserve(const SpaceReserve&) = delete;
  SpaceReserve& operator=(const SpaceReserve&) = delete;

  // Makes sure the reserve holds its bytes. NoSpace (leaving no partial file) when the disk
  // has not that much room; OK with nothing to do when it is held already.
  Status Refill();
  // Gives the reserve's space back to the filesystem. Returns true if it held space.
  bool Release();
  bool held() const;
  uint64_t bytes() const { return bytes_; }

 private:
  const std::filesystem::path path_;
  const uint64_t bytes_;
  mutable Mutex mu_;
  bool held_ GUARDED_BY(mu_) = false;
};

}  // namespace ckptfs
