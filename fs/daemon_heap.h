// fs/daemon_heap.h
//
// How the daemon's heap is set up. The daemon moves checkpoints through MiB-sized chunk
// buffers; what it costs per GB depends on how often those buffers touch fresh pages:
//
//   - ConfigureDaemonHeap (in the daemon, before its threads start): glibc malloc with one
//     arena, no mmap below 32 MiB and a 64 MiB trim threshold, so a freed buffer stays in the
//     heap for the next one (fs/heap_trimmer.h returns the holes once the daemon is quiet).
//   - Transparent huge pages for that heap: glibc backs its heap with them (madvise
//     MADV_HUGEPAGE on what it takes from the kernel) when the process starts with
//     GLIBC_TUNABLES=glibc.malloc.hugetlb=1, and only then: no mallopt sets it. The heap the
//     daemon first touches (its cache filling, a save's buffers) then faults in 2 MiB at a time
//     instead of 4 KiB: on this project's VM a cold read of 1.08 GiB went from ~28 000 faults
//     and 1.05-1.22 daemon CPU-s/GB to ~200 and 0.62-0.82 (docs/fs.md, "Huge pages for the heap").
//     Where THP is off ("never") the madvise does nothing; where it is "always" it changes
//     nothing.
//
//   int main(int argc, char** argv) {
//     if (IsMountCommand(argc, argv)) ReexecWithHugePageHeap(argv);  // returns if not needed
//     ...
//   }
//
// The re-execution happens once, in `ckptfs mount` before it forks the daemon: the new image
// starts with the tunable set and does not re-execute again. A GLIBC_TUNABLES that already
// names glibc.malloc.hugetlb is the user's choice (hugetlb=0 turns this off) and is kept.
#pragma once

#include <optional>
#include <string>

namespace ckptfs {

// The GLIBC_TUNABLES value that adds glibc.malloc.hugetlb=1 to `current` (nullptr or empty:
// unset); nullopt when `current` already sets glibc.malloc.hugetlb (nothing to change).
std::optional<std::string> TunablesWithHugePageHeap(const char* current);

// True when `tunables` (GLIBC_TUNABLES, nullptr: unset) asks glibc for a heap in transparent
// huge pages (glibc.malloc.hugetlb=1): what the heap trimmer needs to know to let it rest.
bool HugePageHeapRequested(const char* tunables);

// True when argv runs the `mount` command (the first argument that is not an option).
bool IsMountCommand(int argc, char** argv);

// Re-executes this program (the file /proc/self/exe names, same argv) with GLIBC_TUNABLES from
// TunablesWithHugePageHeap. Returns when no re-execution is needed, and when it fails (a
// warning is logged; the daemon then runs with 4 KiB pages).
void ReexecWithHugePageHeap(char** argv);

// glibc malloc's settings for the daemon (one arena, no mmap below 32 MiB, trim threshold):
// call before other threads start.
void ConfigureDaemonHeap();

}  // namespace ckptfs
