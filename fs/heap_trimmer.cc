#include "fs/heap_trimmer.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

namespace ckptfs {

HeapTrimPolicy::Action HeapTrimPolicy::Decide(const Sample& s,
                                              const std::function<size_t()>& free_heap) {
  window_.push_back(s);
  // The oldest sample kept is the newest one at least kIdleWindow old.
  while (window_.size() > 2 && s.now - window_[1].now >= kIdleWindow) window_.pop_front();
  if (resting_ && window_.size() >= 2) {
    const Sample& last = window_[window_.size() - 2];
    const double tick = std::chrono::duration<double>(s.now - last.now).count();
    const double used = std::chrono::duration<double>(s.process_cpu - last.process_cpu).count();
    if (used > kIdleCpuShare * tick) {
      // A new quiet period starts from here: it trims and rests again.
      resting_ = false;
      window_.erase(window_.begin(), window_.end() - 1);
      return Action::kWake;
    }
  }
  const Sample& oldest = window_.front();
  const double span = std::chrono::duration<double>(s.now - oldest.now).count();
  const double cpu = std::chrono::duration<double>(s.process_cpu - oldest.process_cpu).count();
  const bool idle =
      span >= std::chrono::duration<double>(kIdleWindow).count() && cpu < kIdleCpuShare * span;
  if (!idle) trimmed_while_idle_ = false;
  const bool over_limit = s.anon_resident_bytes > resident_limit_;
  // Once per quiet period: trimmed pages still count as free heap (fordblks).
  const bool quiet_trim = idle && !trimmed_while_idle_;
  if (!over_limit && !quiet_trim) return Action::kNone;
  if (free_heap() <= kMinFreeBytes) return Action::kNone;
  if (over_limit) return Action::kTrim;
  trimmed_while_idle_ = true;
  resting_ = true;
  return Action::kTrimAndRest;
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

// Marks the heap (the [heap] mappings: with one arena, where malloc keeps everything below the
// mmap threshold) for huge pages or not. Heap that glibc takes later it marks itself.
void AdviseHeapHugePages(bool huge) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return;
  uintptr_t start = UINTPTR_MAX, end = 0;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strstr(line, "[heap]") == nullptr) continue;
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    start = std::min<uintptr_t>(start, lo);
    end = std::max<uintptr_t>(end, hi);
  }
  std::fclose(f);
  if (start >= end) return;
  if (::madvise(reinterpret_cast<void*>(start), end - start,
                huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0) {
    spdlog::debug("madvise of the heap ({} huge pages): {}", huge ? "with" : "without",
                  std::strerror(errno));
  }
}

}  // namespace

void RunHeapTrimmer(std::stop_token stop, size_t resident_limit) {
  HeapTrimPolicy policy(resident_limit);
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
        AdviseHeapHugePages(false);
        malloc_trim(0);
        break;
      case HeapTrimPolicy::Action::kWake:
        AdviseHeapHugePages(true);
        break;
    }
  }
}

}  // namespace ckptfs
