#include "engine/util/progress.h"

#include <gtest/gtest.h>

// gcc 12 at -O1 with -fsanitize=address (scripts/sanitize.sh) warns that Due() may read the
// disengaged optional last_ once it is inlined here; `last_ &&` guards that read (a false
// positive, and the build treats warnings as errors).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace ckptfs {
namespace {

using std::chrono::milliseconds;

TEST(ProgressThrottle, FirstThenOnePerIntervalThenTheLastOnce) {
  ProgressThrottle throttle(milliseconds(100));
  const auto t0 = ProgressThrottle::Clock::time_point() + std::chrono::hours(1);
  EXPECT_TRUE(throttle.Due(0, 10, t0));
  EXPECT_FALSE(throttle.Due(1, 10, t0 + milliseconds(10)));
  EXPECT_FALSE(throttle.Due(2, 10, t0 + milliseconds(99)));
  EXPECT_TRUE(throttle.Due(3, 10, t0 + milliseconds(100)));
  EXPECT_FALSE(throttle.Due(4, 10, t0 + milliseconds(150)));
  EXPECT_TRUE(throttle.Due(10, 10, t0 + milliseconds(160)));   // the last, however soon
  EXPECT_FALSE(throttle.Due(10, 10, t0 + milliseconds(500)));  // once
}

TEST(ProgressThrottle, NothingToDoIsNotFinished) {
  ProgressThrottle throttle(milliseconds(100));
  const auto t0 = ProgressThrottle::Clock::time_point() + std::chrono::hours(1);
  EXPECT_TRUE(throttle.Due(0, 0, t0));
  EXPECT_FALSE(throttle.Due(0, 0, t0 + milliseconds(1)));
}

}  // namespace
}  // namespace ckptfs
