#include "common/backoff.h"

#include "gtest/gtest.h"

namespace specstream {
namespace {

TEST(BackoffTest, DoublesUpToItsCapAndStartsOverAfterASuccess) {
  Backoff backoff(absl::Milliseconds(300), absl::Seconds(2));
  EXPECT_EQ(backoff.delay(), absl::Milliseconds(300));
  backoff.Grow();
  EXPECT_EQ(backoff.delay(), absl::Milliseconds(600));
  backoff.Grow();
  EXPECT_EQ(backoff.delay(), absl::Milliseconds(1200));
  backoff.Grow();
  EXPECT_EQ(backoff.delay(), absl::Seconds(2));  // capped, not 2.4 s
  backoff.Grow();
  EXPECT_EQ(backoff.delay(), absl::Seconds(2));
  backoff.Reset();
  EXPECT_EQ(backoff.delay(), absl::Milliseconds(300));
}

TEST(BackoffTest, TheControlPlaneWaitsFromAFifthOfASecondUpToFiveSeconds) {
  Backoff backoff = ControlPlaneBackoff();
  EXPECT_EQ(backoff.first(), absl::Milliseconds(200));
  EXPECT_EQ(backoff.max(), absl::Seconds(5));
  absl::Duration total;
  for (int i = 0; i < 6; ++i) {
    total += backoff.delay();
    backoff.Grow();
  }
  // 0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 5.
  EXPECT_EQ(total, absl::Milliseconds(11200));
}

}  // namespace
}  // namespace specstream
