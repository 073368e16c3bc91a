#include "common/peer_limiter.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specstream {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

PeerLimiterOptions Options(int max_pending, int max_failures) {
  PeerLimiterOptions options;
  options.max_pending = max_pending;
  options.max_failures = max_failures;
  options.window = absl::Seconds(10);
  return options;
}

TEST(PeerLimiterTest, PeerHostDropsOnlyThePort) {
  EXPECT_EQ(PeerLimiter::PeerHost("ipv4:10.0.0.1:5000"), "ipv4:10.0.0.1");
  EXPECT_EQ(PeerLimiter::PeerHost("ipv6:[::1]:5000"), "ipv6:[::1]");
  EXPECT_EQ(PeerLimiter::PeerHost("ipv6:[fe80::1]"), "ipv6:[fe80::1]");
  EXPECT_EQ(PeerLimiter::PeerHost("ipv4:10.0.0.1"), "ipv4:10.0.0.1");
  EXPECT_EQ(PeerLimiter::PeerHost("unix:/tmp/sock"), "unix:/tmp/sock");
  EXPECT_EQ(PeerLimiter::PeerHost(""), "");
}

// max_failures refusals within the window put a peer past its limit until
// the oldest of them leaves the window; other peers are not affected.
TEST(PeerLimiterTest, RefusalsWithinTheWindowLimitThatPeerUntilTheOldestExpires) {
  PeerLimiter limiter(Options(16, 3));
  const std::string a = "ipv4:10.0.0.1";
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.Admit(a, kStart + absl::Seconds(i)).ok()) << i;
    ASSERT_TRUE(limiter.Refused(a, kStart + absl::Seconds(i)).ok()) << i;
  }
  absl::Status past = limiter.Admit(a, kStart + absl::Seconds(3));
  EXPECT_EQ(past.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(past.message()), HasSubstr(a));
  EXPECT_THAT(std::string(past.message()), HasSubstr("3 refused attempts"));
  EXPECT_THAT(std::string(past.message()), HasSubstr("retry in 7s"));
  // A refusal past the limit is answered with the limit, and not counted:
  // the first refusal still expires at 10 s.
  EXPECT_EQ(limiter.Refused(a, kStart + absl::Seconds(4)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(limiter.Admit("ipv4:10.0.0.2", kStart + absl::Seconds(4)).ok());
  EXPECT_FALSE(limiter.Admit(a, kStart + absl::Seconds(9)).ok());
  EXPECT_TRUE(limiter.Admit(a, kStart + absl::Seconds(10)).ok());
}

TEST(PeerLimiterTest, PendingAttemptsAreBoundedPerPeer) {
  PeerLimiter limiter(Options(2, 32));
  const std::string a = "ipv4:10.0.0.1";
  ASSERT_TRUE(limiter.AddPending(a).ok());
  ASSERT_TRUE(limiter.AddPending(a).ok());
  absl::Status third = limiter.AddPending(a);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()), HasSubstr("2 attempts are still being authenticated"));
  EXPECT_TRUE(limiter.AddPending("ipv4:10.0.0.2").ok());
  limiter.RemovePending(a);
  EXPECT_TRUE(limiter.AddPending(a).ok());
  // Removing more than was added does not go below zero.
  for (int i = 0; i < 5; ++i) limiter.RemovePending(a);
  ASSERT_TRUE(limiter.AddPending(a).ok());
  ASSERT_TRUE(limiter.AddPending(a).ok());
  EXPECT_FALSE(limiter.AddPending(a).ok());
}

// Memory stays bounded: a peer with nothing pending and no refusal left in
// the window is forgotten.
TEST(PeerLimiterTest, ForgetsPeersThatHoldNothing) {
  PeerLimiter limiter(Options(4, 4));
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(
        limiter
            .Refused("ipv4:10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256), kStart)
            .ok());
  }
  EXPECT_EQ(limiter.peers(), 2000u);  // every refusal is still in its window
  // Past the window, the next refusal sweeps the idle peers away.
  ASSERT_TRUE(limiter.Refused("ipv4:10.9.9.9", kStart + absl::Seconds(11)).ok());
  EXPECT_EQ(limiter.peers(), 1u);
  ASSERT_TRUE(limiter.AddPending("ipv4:10.8.8.8").ok());
  limiter.RemovePending("ipv4:10.8.8.8");
  EXPECT_TRUE(limiter.Admit("ipv4:10.8.8.8", kStart + absl::Seconds(11)).ok());
  EXPECT_EQ(limiter.peers(), 1u);
}

}  // namespace
}  // namespace specstream
