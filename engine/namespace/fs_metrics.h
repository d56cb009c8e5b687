// engine/namespace/fs_metrics.h
//
// What a FileSystem counts while it serves: bytes written and read through it and the
// latency of its read, write and fsync calls (from the call to its return, on the calling
// thread: what a FUSE request spends in the engine). Counting is atomic increments only: no
// lock and no allocation on the read and write paths. Reported by `ckptfs stats` and the
// mount's .ckptfs/stats file (engine/namespace/admin.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "engine/util/latency_histogram.h"

namespace ckptfs {

struct FsMetrics {
  std::atomic<uint64_t> bytes_written{0};  // accepted by Write()
  std::atomic<uint64_t> bytes_read{0};     // returned by Read()/ReadSlices(), views included
  LatencyHistogram read, write, fsync;
};

}  // namespace ckptfs
