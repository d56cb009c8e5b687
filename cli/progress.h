// cli/progress.h
//
// The one-line progress of a long command on a terminal (docs/cli.md "Progress"): on stderr,
// only when stderr is a terminal and the command was not asked for --json, redrawn in place
// at most ten times a second, and erased when the work is done so that what the command
// prints next starts on a clean line.
//
//   ProgressLine line("verify", as_json);
//   auto r = RunAdminOn(target, request, line.Fn());   // the daemon's figures, or our own
//   line.Done();
//
//   verify  1.20 GiB / 3.41 GiB  35%  210.4 MiB/s  ETA 11 s
//
// Thread-compatible (reports come from the thread that runs the work).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "engine/util/progress.h"

namespace ckptfs::cli {

class ProgressLine {
 public:
  enum class Unit { kBytes, kVersions };
  // Shown only when `as_json` is false and stderr is a terminal (isatty).
  ProgressLine(std::string what, bool as_json, Unit unit = Unit::kBytes);
  ~ProgressLine() { Done(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool shown() const { return enabled_; }
  // done of total; redraws when due (ProgressThrottle).
  void Update(uint64_t done, uint64_t total);
  // For work whose total is known up front and that reports amounts as it goes.
  void SetTotal(uint64_t total) { total_ = total; }
  void Add(uint64_t n) { Update(done_ + n, total_); }
  // Update() as a ProgressFn (empty when not shown: nobody need report).
  ProgressFn Fn();
  // Erases the line (once something was drawn).
  void Done();

 private:
  std::string Format(uint64_t done, uint64_t total) const;

  const std::string what_;
  const bool enabled_;
  const Unit unit_;
  const std::chrono::steady_clock::time_point start_;
  ProgressThrottle throttle_;
  uint64_t done_ = 0, total_ = 0;
  bool drawn_ = false;
};

}  // namespace ckptfs::cli
