#include "fs/daemon_heap.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

namespace ckptfs {

namespace {

constexpr std::string_view kTunable = "glibc.malloc.hugetlb";

// The value `tunables` (GLIBC_TUNABLES: name=value:name=value...) gives `name`, if any.
std::optional<std::string_view> TunableValue(std::string_view tunables, std::string_view name) {
  while (!tunables.empty()) {
    std::string_view item = tunables.substr(0, tunables.find(':'));
    tunables.remove_prefix(std::min(tunables.size(), item.size() + 1));
    const size_t eq = item.find('=');
    if (item.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> TunablesWithHugePageHeap(const char* current) {
  std::string value = current ? current : "";
  if (TunableValue(value, kTunable)) return std::nullopt;
  if (!value.empty()) value += ':';
  value += std::string(kTunable) + "=1";
  return value;
}

bool HugePageHeapRequested(const char* tunables) {
  return tunables != nullptr && TunableValue(tunables, kTunable) == "1";
}

bool IsMountCommand(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    return std::string_view(argv[i]) == "mount";
  }
  return false;
}

void ReexecWithHugePageHeap(char** argv) {
  const char* current = std::getenv("GLIBC_TUNABLES");
  auto tunables = TunablesWithHugePageHeap(current);
  if (!tunables) return;
  std::optional<std::string> before;
  if (current) before = current;
  // The program's own path, not /proc/self/exe: the kernel names the process (comm, what ps
  // and pgrep show) after the file that is executed.
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    spdlog::warn(
        "cannot find this program to run it again with huge pages for the heap ({}); "
        "the daemon uses 4 KiB pages, which costs more CPU per GB",
        ec.message());
    return;
  }
  if (::setenv("GLIBC_TUNABLES", tunables->c_str(), 1) != 0) return;
  ::execv(self.c_str(), argv);
  int err = errno;
  // Leave the environment as this image started with it, for what it runs.
  if (before) {
    ::setenv("GLIBC_TUNABLES", before->c_str(), 1);
  } else {
    ::unsetenv("GLIBC_TUNABLES");
  }
  spdlog::warn(
      "cannot run {} again with huge pages for the heap ({}); the daemon uses 4 KiB pages, "
      "which costs more CPU per GB",
      self.string(), std::strerror(err));
}

void ConfigureDaemonHeap() {
  // Chunk buffers are 1 MiB: by default glibc maps and unmaps each one, and every write then
  // page-faults fresh memory. Keeping them in the heap halved the daemon's CPU per GB saved
  // (scripts/bench/fs.sh: durable save 1.94x -> 1.16x native). Freed memory is reused, and the
  // budget (cache + in-flight) still bounds how much is live; what lies free is returned once
  // the daemon goes quiet (fs/heap_trimmer.h).
  // One arena: each of glibc's per-thread arenas (up to 8 per core) would otherwise keep its
  // own idle memory; with ~10 FUSE and worker threads a fresh daemon sat 200-300 MiB above its
  // cache while a reader streamed 2 GiB (tests/views/test_low_memory.py), 30 MiB with one.
  // The daemon allocates about once per MiB moved, so the shared arena's lock is not contended.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace ckptfs
