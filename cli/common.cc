// Output helpers shared by the commands (cli/cli.h).
#include <cstdio>
#include <ctime>

#include "cli/cli.h"

namespace ckptfs::cli {

int Fail(const Status& s) {
  std::fprintf(stderr, "ckptfs: %s\n", s.ToString().c_str());
  return kExitFailure;
}

int Fail(const Status& s, const std::string& hint) {
  std::fprintf(stderr, "ckptfs: %s\n  %s\n", s.ToString().c_str(), hint.c_str());
  return kExitFailure;
}

void PrintJson(const nlohmann::json& doc) { std::printf("%s\n", doc.dump(2).c_str()); }

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), v < 10 ? "%.2f %s" : "%.1f %s", v, kUnits[unit]);
  }
  return buf;
}

std::string HumanTime(uint64_t unix_ns) {
  if (unix_ns == 0) return "-";
  time_t t = static_cast<time_t>(unix_ns / 1000000000ull);
  struct tm tm;
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace ckptfs::cli
