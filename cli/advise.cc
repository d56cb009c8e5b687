// Checkpoint interval arithmetic (cli/advise.h).
#include "cli/advise.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace ckptfs::cli {

Result<double> ParseDuration(std::string_view text) {
  std::string why = "'";
  why.append(text).append(
      "' is not a duration: a number with a unit s, m, h, d or w, e.g. 6h, 90m, 2d, 1h30m");
  const Status bad = Status::InvalidArgument(why);
  double total = 0;
  size_t i = 0;
  if (text.empty()) return bad;
  while (i < text.size()) {
    size_t end = i;
    while (end < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) {
      ++end;
    }
    if (end == i) return bad;
    const std::string number(text.substr(i, end - i));
    char* parsed_end = nullptr;
    const double value = std::strtod(number.c_str(), &parsed_end);
    if (parsed_end != number.c_str() + number.size()) return bad;
    double unit = 1;
    if (end < text.size()) {
      constexpr std::string_view kUnits = "smhdw";
      constexpr double kSeconds[] = {1, 60, 3600, 86400, 7 * 86400};
      const size_t which = kUnits.find(text[end]);
      if (which == std::string_view::npos) return bad;
      unit = kSeconds[which];
      ++end;
    } else if (i != 0) {
      return bad;  // "1h30": the 30 of what?
    }
    total += value * unit;
    i = end;
  }
  if (!(total > 0) || !std::isfinite(total)) return bad;
  return total;
}

std::string HumanDuration(double seconds) {
  if (seconds < 60) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), seconds < 10 ? "%.2f s" : "%.1f s", seconds);
    return buf;
  }
  static constexpr std::pair<const char*, uint64_t> kUnits[] = {
      {"d", 86400}, {"h", 3600}, {"m", 60}, {"s", 1}};
  const auto total = static_cast<uint64_t>(std::llround(seconds));
  size_t u = 0;
  while (total < kUnits[u].second) ++u;  // stops at "m": total >= 60
  const uint64_t big = kUnits[u].second, small = kUnits[u + 1].second;
  uint64_t whole = total / big;
  uint64_t rest = (total % big + small / 2) / small;  // rounded to the smaller unit
  if (rest * small >= big) {
    ++whole;
    rest = 0;
  }
  std::string out = std::to_string(whole) + kUnits[u].first;
  if (rest != 0) out.append(" ").append(std::to_string(rest)).append(kUnits[u + 1].first);
  return out;
}

double YoungInterval(double save_seconds, double mtbf_seconds) {
  return std::sqrt(2 * save_seconds * mtbf_seconds);
}

double DalyInterval(double save_seconds, double mtbf_seconds) {
  if (save_seconds >= 2 * mtbf_seconds) return mtbf_seconds;
  const double x = save_seconds / (2 * mtbf_seconds);
  return YoungInterval(save_seconds, mtbf_seconds) * (1 + std::sqrt(x) / 3 + x / 9) - save_seconds;
}

double ExpectedWaste(double interval_seconds, double save_seconds, double mtbf_seconds) {
  return save_seconds / interval_seconds + (interval_seconds + save_seconds) / (2 * mtbf_seconds);
}

}  // namespace ckptfs::cli
