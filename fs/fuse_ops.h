// fs/fuse_ops.h
//
// The FUSE adapter: each low-level FUSE operation decodes its request, calls one FileSystem
// method and replies; a Status becomes its errno. No policy lives here.
//
//   fuse_session* se = fuse_session_new(&args, &FuseOps(), sizeof(fuse_lowlevel_ops), fs);
#pragma once

// 3.12: fuse_session_loop_mt takes the fuse_loop_config of fuse_loop_cfg_create (fs/mount.cc).
// Below 3.12 it expects the older struct, reads that config's fields at the wrong offsets and
// starts a thread per request (docs/fs.md, "Tuning choices").
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <string>

namespace ckptfs {

// The operation table; the session's userdata must be the FileSystem*.
const fuse_lowlevel_ops& FuseOps();

// The snapshot engine's control socket, answered on the root as user.ckptfs.control
// (docs/snapshot.md). Set once, before the session starts.
void SetControlSocketPath(std::string path);

}  // namespace ckptfs
