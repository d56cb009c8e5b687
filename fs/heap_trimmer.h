// fs/heap_trimmer.h
//
// When the daemon hands freed heap memory back to the kernel. The daemon runs glibc malloc with
// one arena and no mmap below 32 MiB (fs/mount.cc), so a freed chunk buffer stays in the heap
// for the next one; only malloc_trim returns the holes. Trimming costs twice: the madvise (TLB
// shootdowns on every core) and, worse, the page faults (and zeroing) when the next buffer
// touches those pages again. So the heap is trimmed when the daemon went quiet, not while it
// works:
//
//   - more than kMinFreeBytes must lie free (below that, trimming gains little);
//   - and either the daemon used less than kIdleCpuShare of one core over the last kIdleWindow
//     (a save or a read is over: give the memory back until the next one; once per quiet
//     period, since trimmed pages still count as free),
//   - or its anonymous resident memory exceeds the limit (cache + in-flight budget plus a
//     margin): a busy daemon whose free holes would take it past the bound still trims.
//
// While busy, the heap holds at most what was live at the busy period's peak, which the cache
// and in-flight budget bound (plus fragmentation, which the limit catches).
//
//   HeapTrimPolicy policy(cache + inflight + (32 << 20));
//   every kTick: if (policy.ShouldTrim(Sample{...})) malloc_trim(0);
//
// RunHeapTrimmer is that loop on the calling thread, with mallinfo2, /proc/self/statm and the
// process CPU clock, until `stop` is requested.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <stop_token>

namespace ckptfs {

class HeapTrimPolicy {
 public:
  static constexpr size_t kMinFreeBytes = 32 << 20;
  static constexpr std::chrono::milliseconds kTick{250};
  static constexpr std::chrono::milliseconds kIdleWindow{10000};
  static constexpr double kIdleCpuShare = 0.05;

  struct Sample {
    std::chrono::steady_clock::time_point now;
    std::chrono::nanoseconds process_cpu;  // the process's CPU time so far (all threads)
    size_t free_heap_bytes;                // free bytes inside the heap (mallinfo2 fordblks)
    size_t anon_resident_bytes;            // anonymous resident memory (statm resident - shared)
  };

  // `resident_limit`: above it, a busy daemon trims too.
  explicit HeapTrimPolicy(size_t resident_limit) : resident_limit_(resident_limit) {}

  // Takes the sample taken at this tick; true when the heap should be trimmed now.
  bool ShouldTrim(const Sample& s);

 private:
  size_t resident_limit_;
  std::deque<Sample> window_;  // samples of the last kIdleWindow (and the one before it)
  bool trimmed_while_idle_ = false;
};

// Samples every HeapTrimPolicy::kTick and calls malloc_trim(0) when the policy says so, until
// `stop` is requested.
void RunHeapTrimmer(std::stop_token stop, size_t resident_limit);

}  // namespace ckptfs
