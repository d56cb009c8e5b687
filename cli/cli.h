// cli/cli.h
//
// What the units of the `ckptfs` command share. Each command is a function that returns the
// process exit status: 0 success, 1 failure (a message on stderr), 2 a usage error (docs/cli.md).
// With --json a command prints exactly one JSON object on stdout, in the schema docs/cli.md
// gives for it; words go to stdout otherwise.
//
// Units: main.cc (arguments, help, did-you-mean for commands and options, dispatch), mounts.cc
// (which mount serves a path or a store), store_commands.cc (put/get/ls/rm/init/upgrade),
// mount_commands.cc (mount/umount/sync/seal), admin_commands.cc + admin_client.cc (log/forget/
// status/stats/verify/gc/advise: through the daemon when the store is mounted, else on the
// store directly; advise's arithmetic in advise.h), export_commands.cc (diff/export/restore),
// progress.cc (the progress line of long commands on a terminal).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/util/status.h"

namespace ckptfs::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Prints "ckptfs: <status>" on stderr; returns kExitFailure.
int Fail(const Status& s);
// The same with a hint of what to do, on a second line.
int Fail(const Status& s, const std::string& hint);
// Prints one JSON document on stdout (2-space indent, newline).
void PrintJson(const nlohmann::json& doc);
// "1.5 GiB", "312 KiB", "17 B".
std::string HumanBytes(uint64_t bytes);
// "2026-12-03 19:40:12" (local time) from nanoseconds since the epoch; "-" for 0.
std::string HumanTime(uint64_t unix_ns);

// ---- mounts.cc ------------------------------------------------------------------------------
struct MountEntry {
  std::string mountpoint;  // absolute, as the kernel reports it
  std::string fstype;      // "fuse.ckptfs" for ours
  std::string source;      // "ckptfs:/abs/store" for ours
  std::string store;       // the store directory (source without "ckptfs:"), ckptfs mounts only
  bool read_only = false;
};
// Every mount of this machine's namespace, in /proc/self/mountinfo order.
std::vector<MountEntry> AllMounts();
// The ckptfs mounts.
std::vector<MountEntry> CkptfsMounts();
// The mount whose filesystem holds `path` (the nearest mount point at or above its real path),
// when that is a ckptfs mount; nullopt otherwise (or when path does not exist).
std::optional<MountEntry> CkptfsMountHolding(const std::string& path);
// A mount (of any type) whose mount point is exactly `path`'s real path.
std::optional<MountEntry> MountAt(const std::string& path);
// The ckptfs mount serving the store directory `store`, if it is mounted.
std::optional<MountEntry> MountOfStore(const std::string& store);
// A path the daemon of `mountpoint` reported, made absolute against the daemon's working
// directory when it is relative.
std::string DaemonPath(const std::string& mountpoint, const std::string& path);
// realpath(3), or the path made absolute when it does not exist.
std::string RealPath(const std::string& path);

// Where a STORE|MNT argument points: the store directory and, when it is mounted, its mount.
struct Target {
  std::string store;
  std::optional<MountEntry> mount;
};
// Resolves a STORE|MNT argument: a path inside a ckptfs mount means that mount's store; a
// store directory that is mounted somewhere means that mount. NotFound (with what to do) when
// it is neither a store nor inside a mount.
Result<Target> ResolveTarget(const std::string& path);

}  // namespace ckptfs::cli
