// fs/heap_trimmer.h
//
// When the daemon hands freed heap memory back to the kernel. The daemon runs glibc malloc with
// one arena and no mmap below 32 MiB (fs/daemon_heap.h), so a freed chunk buffer stays in the heap
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
// Where the heap is in transparent huge pages (fs/daemon_heap.h: `huge_pages` below), once the
// daemon went quiet (with a trim where more than kMinFreeBytes lie free), the heap *rests*: it is
// marked MADV_NOHUGEPAGE, because khugepaged would otherwise collapse every 2 MiB range that still
// holds one live page, filling the trimmed holes again (measured: an idle daemon's RSS crept from
// 263 to 399 MiB in four minutes, towards the whole heap). The first tick on which the process used
// more than kIdleCpuShare of a core again (its other threads) wakes it (MADV_HUGEPAGE); while
// resting the ticks are kRestingTick apart, so that a save or a read that starts touches 4 KiB
// pages for at most that long. Waking also collapses the heap into huge pages (MADV_COLLAPSE, where
// the whole heap fits under the resident limit): the trim split every huge page beside a live
// buffer, and the next save faulted those ranges in 4 KiB at a time (42-51 k faults, ~1 CPU-s
// per 1.16 GB save on this project's VM).
//
//   HeapTrimPolicy policy(cache + inflight + (32 << 20), /*huge_pages=*/true);
//   every tick: switch (policy.Decide(Sample{...}, free_heap)) {
//     case kTrim: malloc_trim(0); break;
//     case kTrimAndRest: heap NOHUGEPAGE; malloc_trim(0); break;
//     case kRest: heap NOHUGEPAGE; break;
//     case kWake: heap HUGEPAGE; collapse it; break;
//   }
//
// RunHeapTrimmer is that loop on the calling thread, with mallinfo2, /proc/self/statm, the
// CPU clocks and madvise over the [heap] mappings, until `stop` is requested.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <stop_token>

namespace ckptfs {

class HeapTrimPolicy {
 public:
  static constexpr size_t kMinFreeBytes = 32 << 20;
  static constexpr std::chrono::milliseconds kTick{250};
  static constexpr std::chrono::milliseconds kIdleWindow{10000};
  static constexpr double kIdleCpuShare = 0.05;
  static constexpr std::chrono::milliseconds kRestingTick{50};

  struct Sample {
    std::chrono::steady_clock::time_point now;
    std::chrono::nanoseconds work_cpu;  // CPU time so far of the process's other threads
    size_t anon_resident_bytes;         // anonymous resident memory (statm resident - shared)
  };

  // `resident_limit`: above it, a busy daemon trims too. `huge_pages`: the heap is in
  // transparent huge pages and rests after a quiet trim (without, a quiet trim is kTrim).
  HeapTrimPolicy(size_t resident_limit, bool huge_pages)
      : resident_limit_(resident_limit), huge_pages_(huge_pages) {}

  enum class Action {
    kNone,
    kTrim,         // trim the heap (over the resident limit, or quiet without huge pages)
    kTrimAndRest,  // trim the heap, the daemon went quiet: the heap rests (no huge pages)
    kRest,         // the daemon went quiet with too little free to trim: the heap rests only
    kWake,         // the daemon works again: the resting heap takes huge pages again
  };

  // Takes the sample taken at this tick; what to do now. `free_heap` (the free bytes inside the
  // heap) is asked only on a tick where a trim is possible: mallinfo2 walks every free chunk
  // under the arena's lock (1.7 ms on the fragmented heap of an idle daemon after a save).
  Action Decide(const Sample& s, const std::function<size_t()>& free_heap);
  bool resting() const { return resting_; }

 private:
  size_t resident_limit_;
  bool huge_pages_;
  std::deque<Sample> window_;  // samples of the last kIdleWindow (and the one before it)
  bool quiet_period_handled_ = false;  // this quiet period's trim or rest is done
  bool resting_ = false;
};

// Samples every HeapTrimPolicy::kTick (kRestingTick while the heap rests) and does what the
// policy says, until `stop` is requested.
void RunHeapTrimmer(std::stop_token stop, size_t resident_limit, bool huge_pages);

}  // namespace ckptfs
