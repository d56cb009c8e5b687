// Progress on a terminal (cli/progress.h).
#include "cli/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "cli/advise.h"
#include "cli/cli.h"

namespace ckptfs::cli {

ProgressLine::ProgressLine(std::string what, bool as_json, Unit unit)
    : what_(std::move(what)),
      enabled_(!as_json && ::isatty(STDERR_FILENO) == 1),
      unit_(unit),
      start_(std::chrono::steady_clock::now()),
      throttle_(std::chrono::milliseconds(100)) {}

ProgressFn ProgressLine::Fn() {
  if (!enabled_) return {};
  return [this](uint64_t done, uint64_t total) { Update(done, total); };
}

void ProgressLine::Update(uint64_t done, uint64_t total) {
  done_ = done;
  total_ = total;
  if (!enabled_ || total == 0 || !throttle_.Due(done, total)) return;
  // \r and "erase to the end of the line" (ECMA-48 EL): the line is redrawn in place.
  std::fprintf(stderr, "\r%s\033[K", Format(done, total).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::Done() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

std::string ProgressLine::Format(uint64_t done, uint64_t total) const {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  std::string line = what_ + "  ";
  char buf[64];
  if (unit_ == Unit::kBytes) {
    line += HumanBytes(done) + " / " + HumanBytes(total);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu / %llu versions", static_cast<unsigned long long>(done),
                  static_cast<unsigned long long>(total));
    line += buf;
  }
  std::snprintf(buf, sizeof(buf), "  %3.0f%%",
                100.0 * static_cast<double>(done) / static_cast<double>(total));
  line += buf;
  if (rate > 0 && seconds >= 0.5) {  // a rate over the first instants says little
    if (unit_ == Unit::kBytes) {
      line += "  " + HumanBytes(static_cast<uint64_t>(rate)) + "/s";
    } else {
      std::snprintf(buf, sizeof(buf), "  %.1f/s", rate);
      line += buf;
    }
    if (done < total) {
      line += "  ETA " + HumanDuration(static_cast<double>(total - done) / rate);
    }
  }
  return line;
}

}  // namespace ckptfs::cli
