// cli/mount_commands.h
//
// mount, umount, sync, seal, file-versions. The last four act through the mount's attributes
// (engine/namespace/filesystem.h) and first check that the path is in a ckptfs mount, so that
// on any other directory they fail (exit 1) without leaving an attribute behind.
#pragma once

#include <string>

#include "cli/cli.h"
#include "fs/mount.h"

namespace ckptfs::cli {

// Refuses a mountpoint that is a mount point already (a second mount would stack on it) and,
// unless args.create, a STORE without a store; the store path is made absolute (it names the
// mount's source, which status and the other commands read back).
int Mount(MountArgs args);
int Umount(const std::string& mountpoint);
int Sync(const std::string& mountpoint);
int Seal(const std::string& version);
// Marks (on) or unmarks the directory for file versions (engine/namespace/file_versions.h).
int FileVersions(const std::string& dir, bool on);

}  // namespace ckptfs::cli
