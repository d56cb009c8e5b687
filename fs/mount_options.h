// fs/mount_options.h
//
// The `-o` options of a ckptfs mount, as `ckptfs mount -o`, `mount -t fuse.ckptfs -o`, an
// /etc/fstab line and the systemd unit give them (comma-separated, packaging/README.md):
//
//   MountArgs args;
//   Status s = ApplyMountOptions("cache_size=256M,codec=zstd:3,allow_other,nofail", &args);
//   // args.cache_bytes == 256 MiB, args.codec is zstd level 3, args.fuse_options ==
//   {"allow_other"}
//
// Three kinds of option:
//   - the daemon's own, the same settings as the flags of `ckptfs mount`: cache_size=SIZE,
//     inflight=SIZE, codec=SPEC, delta_chain=N, seal_after=SECONDS, snapshot_timeout=SECONDS,
//     keep_last=N, keep_every=K, prometheus=PORT, control_group=NAME, create (make the store if
//     STORE has none);
//   - options for mount(8) and systemd, not for the filesystem: defaults, auto, noauto, user,
//     nouser, users, owner, group, nofail, _netdev, comment=..., x-...; dropped;
//   - everything else goes to FUSE as given (allow_other, ro, noatime, ...): FUSE refuses what it
//     does not know, so a misspelt option fails the mount instead of being ignored.
#pragma once

#include <string>
#include <string_view>

#include "engine/util/status.h"
#include "fs/mount.h"

namespace ckptfs {

// "128M", "2G", "1T", "4096" -> bytes (K, M, G and T are powers of 1024).
Result<size_t> ParseSize(std::string_view text);

// Applies every option of `list` to `args`, left to right (a later one wins). Returns
// InvalidArgument naming the option on a bad value; `args` may then be partly updated.
Status ApplyMountOptions(std::string_view list, MountArgs* args);

}  // namespace ckptfs
