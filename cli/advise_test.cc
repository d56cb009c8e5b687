#include "cli/advise.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ckptfs::cli {
namespace {

TEST(ParseDuration, UnitsAndSums) {
  EXPECT_EQ(*ParseDuration("6h"), 6 * 3600);
  EXPECT_EQ(*ParseDuration("90m"), 90 * 60);
  EXPECT_EQ(*ParseDuration("2d"), 2 * 86400);
  EXPECT_EQ(*ParseDuration("1w"), 7 * 86400);
  EXPECT_EQ(*ParseDuration("45s"), 45);
  EXPECT_EQ(*ParseDuration("45"), 45);
  EXPECT_EQ(*ParseDuration("1.5h"), 5400);
  EXPECT_EQ(*ParseDuration("1h30m"), 5400);
}

TEST(ParseDuration, RefusesWhatIsNotADuration) {
  for (const char* bad : {"", "h", "6x", "1h30", "-5m", "0", "0h", "1..5h", "6 h"}) {
    auto d = ParseDuration(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().ToString().find("e.g. 6h"), std::string::npos) << d.status().ToString();
  }
}

TEST(HumanDuration, TwoLargestUnits) {
  EXPECT_EQ(HumanDuration(12.34), "12.3 s");
  EXPECT_EQ(HumanDuration(0.034), "0.03 s");
  EXPECT_EQ(HumanDuration(2.5), "2.50 s");
  EXPECT_EQ(HumanDuration(250), "4m 10s");
  EXPECT_EQ(HumanDuration(3600), "1h");
  EXPECT_EQ(HumanDuration(5000), "1h 23m");
  EXPECT_EQ(HumanDuration(7199), "2h");
  EXPECT_EQ(HumanDuration(2 * 86400 + 3 * 3600 + 60), "2d 3h");
}

TEST(Interval, YoungIsSqrtTwoCM) {
  EXPECT_DOUBLE_EQ(YoungInterval(12, 21600), 720);
  EXPECT_DOUBLE_EQ(YoungInterval(60, 21600), std::sqrt(2.0 * 60 * 21600));
}

TEST(Interval, DalyCorrectsYoung) {
  // C = 12 s, M = 6 h: x = C/2M = 1/3600; T = 720 (1 + 1/180 + 1/32400) - 12.
  EXPECT_NEAR(DalyInterval(12, 21600), 720 * (1 + 1.0 / 180 + 1.0 / 32400) - 12, 1e-9);
  // Cheap saves: the two agree to first order.
  EXPECT_NEAR(DalyInterval(1, 1e6) / YoungInterval(1, 1e6), 1, 1e-3);
  // A save costing more than twice the MTBF: checkpoint once per MTBF.
  EXPECT_EQ(DalyInterval(500, 200), 200);
}

TEST(Interval, WasteIsLeastNearYoung) {
  const double c = 30, m = 86400, t = YoungInterval(c, m);
  EXPECT_LT(ExpectedWaste(t, c, m), ExpectedWaste(t / 2, c, m));
  EXPECT_LT(ExpectedWaste(t, c, m), ExpectedWaste(t * 2, c, m));
}

}  // namespace
}  // namespace ckptfs::cli
