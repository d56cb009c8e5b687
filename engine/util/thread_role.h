// engine/util/thread_role.h
//
// Which part of the daemon a thread works for, and the CPU time each part has used: the
// per-phase CPU of `ckptfs stats` (docs/cli.md). A thread names its role once when it starts
// (the kernel's thread name, "ckptfs-" + role, shown by top -H and ps -L too); CpuByRole()
// reads every live thread's CPU time from /proc/self/task and sums it by role.
//
//   std::thread([] { SetThreadRole("commit"); ... });
//   for (auto& [role, seconds] : CpuByRole()) ...
//
// Threads that named no role (libfuse's request threads, the main thread) count as
// kUnnamedRole; the kernel's io_uring workers of this process (iou-wrk-TID: the pack files'
// writes and reads) as kIoUringRole. CPU of threads that have exited (io_uring workers end
// when idle, control connections when done) is the process's total (getrusage) minus the
// live threads', as kExitedRole.
// Thread-safe.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace ckptfs {

inline constexpr std::string_view kUnnamedRole = "fuse";
inline constexpr std::string_view kExitedRole = "exited";
inline constexpr std::string_view kIoUringRole = "io_uring";

// REQUIRES: role.size() <= 8 (the kernel keeps 15 characters of a thread name).
void SetThreadRole(std::string_view role);

// CPU seconds (user + system) by role, every role with a live thread present, plus
// kExitedRole. Empty if /proc/self/task cannot be read.
std::map<std::string, double> CpuByRole();

}  // namespace ckptfs
