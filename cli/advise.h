// cli/advise.h
//
// The arithmetic of `ckptfs advise` (docs/cli.md "advise"): how often to checkpoint, given the
// cost of one save C and the mean time between failures M.
//
//   auto m = ParseDuration("6h");                     // 21600 s
//   double t = YoungInterval(12.0, *m);               // sqrt(2 * 12 * 21600) = 720 s
//
// Young (1974): T = sqrt(2 C M), the first-order optimum. Daly (2006, "A higher order estimate
// of the optimum checkpoint interval for restart dumps"): T = sqrt(2 C M) [1 + (1/3)
// sqrt(C / 2M) + (1/9) (C / 2M)] - C for C < 2M, else T = M. Both assume failures arrive as a
// Poisson process and that a restart costs about what a save does.
#pragma once

#include <string>
#include <string_view>

#include "engine/util/status.h"

namespace ckptfs::cli {

// "6h", "90m", "2d", "45s", "1.5h", "1h30m" (units s, m, h, d, w; a plain number is seconds)
// -> seconds. InvalidArgument (naming the units) for anything else or a duration of 0.
Result<double> ParseDuration(std::string_view text);
// "2d 3h", "1h 23m", "4m 10s", "12.3 s", "0.25 s": the two largest units, or under a minute
// seconds with one decimal (two under ten seconds).
std::string HumanDuration(double seconds);

// REQUIRES: save_seconds > 0, mtbf_seconds > 0.
double YoungInterval(double save_seconds, double mtbf_seconds);
double DalyInterval(double save_seconds, double mtbf_seconds);
// The expected fraction of time lost at checkpoint interval T, first order: saves (C / T)
// plus work redone after a failure (about half an interval and a save, (T + C) / 2M).
double ExpectedWaste(double interval_seconds, double save_seconds, double mtbf_seconds);

}  // namespace ckptfs::cli
