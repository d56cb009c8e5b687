#include "fs/heap_trimmer.h"

#include <malloc.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace ckptfs {

bool HeapTrimPolicy::ShouldTrim(const Sample& s) {
  window_.push_back(s);
  // The oldest sample kept is the newest one at least kIdleWindow old.
  while (window_.size() > 2 && s.now - window_[1].now >= kIdleWindow) window_.pop_front();
  const Sample& oldest = window_.front();
  const double span = std::chrono::duration<double>(s.now - oldest.now).count();
  const double cpu = std::chrono::duration<double>(s.process_cpu - oldest.process_cpu).count();
  const bool idle =
      span >= std::chrono::duration<double>(kIdleWindow).count() && cpu < kIdleCpuShare * span;
  if (!idle) trimmed_while_idle_ = false;
  if (s.free_heap_bytes <= kMinFreeBytes) return false;
  if (s.anon_resident_bytes > resident_limit_) return true;
  // Once per quiet period: trimmed pages still count as free heap (fordblks).
  if (!idle || trimmed_while_idle_) return false;
  trimmed_while_idle_ = true;
  return true;
}

namespace {

std::chrono::nanoseconds ProcessCpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
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

}  // namespace

void RunHeapTrimmer(std::stop_token stop, size_t resident_limit) {
  HeapTrimPolicy policy(resident_limit);
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  while (!cv.wait_for(lock, stop, HeapTrimPolicy::kTick, [] { return false; })) {
    if (stop.stop_requested()) break;
    HeapTrimPolicy::Sample s{std::chrono::steady_clock::now(), ProcessCpu(), mallinfo2().fordblks,
                             AnonResidentBytes()};
    if (policy.ShouldTrim(s)) malloc_trim(0);
  }
}

}  // namespace ckptfs
