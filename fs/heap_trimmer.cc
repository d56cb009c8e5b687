#include "fs/heap_trimmer.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <utility>
#include <vector>

namespace ckptfs {

HeapTrimPolicy::Action HeapTrimPolicy::Decide(const Sample& s,
                                              const std::function<size_t()>& free_heap) {
  window_.push_back(s);
  // The oldest sample kept is the newest one at least kIdleWindow old.
  while (window_.size() > 2 && s.now - window_[1].now >= kIdleWindow) window_.pop_front();
  if (resting_ && window_.size() >= 2) {
    const Sample& last = window_[window_.size() - 2];
    const double tick = std::chrono::duration<double>(s.now - last.now).count();
    const double used = std::chrono::duration<double>(s.work_cpu - last.work_cpu).count();
    if (used > kIdleCpuShare * tick) {
      // A new quiet period starts from here: it trims and rests again.
      resting_ = false;
      window_.erase(window_.begin(), window_.end() - 1);
      return Action::kWake;
    }
  }
  const Sample& oldest = window_.front();
  const double span = std::chrono::duration<double>(s.now - oldest.now).count();
  const double cpu = std::chrono::duration<double>(s.work_cpu - oldest.work_cpu).count();
  const bool idle =
      span >= std::chrono::duration<double>(kIdleWindow).count() && cpu < kIdleCpuShare * span;
  if (!idle) quiet_period_handled_ = false;
  const bool over_limit = s.anon_resident_bytes > resident_limit_;
  // Once per quiet period (trim and rest): trimmed pages still count as free heap (fordblks).
  const bool quiet = idle && !quiet_period_handled_;
  if (!over_limit && !quiet) return Action::kNone;
  const bool worth_a_trim = free_heap() > kMinFreeBytes;
  if (!quiet) return worth_a_trim ? Action::kTrim : Action::kNone;
  quiet_period_handled_ = true;
  if (!huge_pages_) return worth_a_trim ? Action::kTrim : Action::kNone;
  // The heap rests whether or not this trim is worth it: the holes of earlier trims (over the
  // limit) are what khugepaged would fill.
  resting_ = true;
  return worth_a_trim ? Action::kTrimAndRest : Action::kRest;
}

namespace {

std::chrono::nanoseconds CpuClock(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// The CPU time of the process's threads but this one: the trimmer's own ticks are no work.
std::chrono::nanoseconds OtherThreadsCpu() {
  return CpuClock(CLOCK_PROCESS_CPUTIME_ID) - CpuClock(CLOCK_THREAD_CPUTIME_ID);
}

// Resident minus file-backed resident pages (the LMDB map, the binary): what malloc holds.
size_t AnonResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0, shared = 0;
  int n = std::fscanf(f, "%lu %lu %lu", &size, &resident, &shared);
  std::fclose(f);
  if (n != 3 || shared > resident) return 0;
  return (resident - shared) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux >= 6.1 (glibc 2.36's headers predate it)
#endif

// The [heap] mappings (with one arena, where malloc keeps everything below the mmap threshold).
std::vector<std::pair<uintptr_t, uintptr_t>> HeapMappings() {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strstr(line, "[heap]") == nullptr) continue;
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo < hi) out.emplace_back(lo, hi);
  }
  std::fclose(f);
  return out;
}

// The kernel's huge page size for anonymous memory (2 MiB on x86-64, 512 MiB on arm64 with
// 64 KiB pages); 2 MiB where it does not say.
uintptr_t HugePageBytes() {
  unsigned long bytes = 0;
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r")) {
    if (std::fscanf(f, "%lu", &bytes) != 1) bytes = 0;
    std::fclose(f);
  }
  const bool power_of_two = bytes != 0 && (bytes & (bytes - 1)) == 0;
  return power_of_two ? bytes : uintptr_t{2} << 20;
}

// Advises the heap against huge pages (resting) or for them (waking). Waking also collapses
// the heap into huge pages at once: the quiet trim split every huge page beside a live buffer,
// and those ranges would otherwise fault 4 KiB at a time (42-51 k faults in the save after a
// quiet period) until khugepaged merged them. Collapsing fills the trimmed holes, so it is done
// only where the whole heap fits under `resident_limit` (the trimmer would trim it again).
// Heap that glibc takes later it advises itself.
void AdviseHeapHugePages(bool huge, size_t resident_limit) {
  auto heap = HeapMappings();
  if (heap.empty()) return;
  const uintptr_t start = heap.front().first, end = heap.back().second;
  if (::madvise(reinterpret_cast<void*>(start), end - start,
                huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0) {
    spdlog::debug("madvise of the heap ({} huge pages): {}", huge ? "with" : "without",
                  std::strerror(errno));
  }
  size_t mapped = 0;
  for (auto [lo, hi] : heap) mapped += hi - lo;
  if (!huge || mapped > resident_limit) return;
  static const uintptr_t kHuge = HugePageBytes();
  size_t collapsed = 0, refused = 0;
  for (auto [lo, hi] : heap) {
    // Range by range: one that crosses a mapping's edge, or holds a page the kernel cannot
    // move, is refused alone.
    for (uintptr_t a = (lo + kHuge - 1) & ~(kHuge - 1); a + kHuge <= hi; a += kHuge) {
      if (::madvise(reinterpret_cast<void*>(a), kHuge, MADV_COLLAPSE) == 0) {
        collapsed += kHuge;
      } else {
        refused += kHuge;
      }
    }
  }
  spdlog::debug("heap woken: {} MiB collapsed into huge pages, {} MiB not", collapsed >> 20,
                refused >> 20);
}

}  // namespace

void RunHeapTrimmer(std::stop_token stop, size_t resident_limit, bool huge_pages) {
  HeapTrimPolicy policy(resident_limit, huge_pages);
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  auto tick = [&policy] {
    return policy.resting() ? HeapTrimPolicy::kRestingTick : HeapTrimPolicy::kTick;
  };
  while (!cv.wait_for(lock, stop, tick(), [] { return false; })) {
    if (stop.stop_requested()) break;
    HeapTrimPolicy::Sample s{std::chrono::steady_clock::now(), OtherThreadsCpu(),
                             AnonResidentBytes()};
    switch (policy.Decide(s, [] { return mallinfo2().fordblks; })) {
      case HeapTrimPolicy::Action::kNone:
        break;
      case HeapTrimPolicy::Action::kTrim:
        malloc_trim(0);
        break;
      case HeapTrimPolicy::Action::kTrimAndRest:
        AdviseHeapHugePages(false, resident_limit);
        malloc_trim(0);
        break;
      case HeapTrimPolicy::Action::kRest:
        AdviseHeapHugePages(false, resident_limit);
        break;
      case HeapTrimPolicy::Action::kWake:
        AdviseHeapHugePages(true, resident_limit);
        break;
    }
  }
}

}  // namespace ckptfs
