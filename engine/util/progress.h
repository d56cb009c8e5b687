// engine/util/progress.h
//
// How far a long operation is (verify, gc, a copy out of the store), as the thread doing it
// reports it: `done` of `total` units (bytes, unless the operation says otherwise). Reporters
// may call per chunk; whoever shows or sends the figures throttles them with ProgressThrottle.
//
//   ProgressThrottle throttle(std::chrono::milliseconds(100));
//   ProgressFn progress = [&](uint64_t done, uint64_t total) {
//     if (throttle.Due(done, total)) Show(done, total);
//   };
//   store->Verify(progress);
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

namespace ckptfs {

// An empty ProgressFn means nobody asked; reporters check before calling.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// Says which reports to pass on: the first, the last (done >= total > 0) and otherwise at most
// one per interval. Thread-compatible.
class ProgressThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ProgressThrottle(std::chrono::milliseconds interval) : interval_(interval) {}

  bool Due(uint64_t done, uint64_t total, Clock::time_point now = Clock::now()) {
    const bool last = total > 0 && done >= total;
    if (last && finished_) return false;  // the last one once
    if (!last && last_ && now - *last_ < interval_) return false;
    last_ = now;
    finished_ = last;
    return true;
  }

 private:
  const std::chrono::milliseconds interval_;
  std::optional<Clock::time_point> last_;
  bool finished_ = false;
};

}  // namespace ckptfs
