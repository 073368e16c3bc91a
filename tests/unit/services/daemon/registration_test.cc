// A daemon's registration and its job-token set, on a clock the test moves
// (tests/testing/fake_env.h): their backoff and waits take no real time.
#include "services/daemon/registration.h"

#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/backoff.h"
#include "common/grpc/auth.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_env.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

using testing::FakeEnv;

TEST(RegistrationTest, RetriesAnAbsentCoordinatorOnTheControlPlaneBackoff) {
  FakeEnv clock;
  RegistrationOptions options;
  options.coordinator = testing::DeadLoopbackAddress();
  options.info.set_kind(v1::DAEMON_KIND_STUDENT);
  options.info.set_name("d0");
  options.clock = &clock;
  auto registration = Registration::Start(options);
  ASSERT_TRUE(registration.ok()) << registration.status();
  // Each refused try waits the next delay of the schedule, on the clock.
  Backoff expected = ControlPlaneBackoff();
  for (int attempt = 0; attempt < 8; ++attempt) {
    const absl::Time until = clock.Now() + expected.delay();
    ASSERT_TRUE(clock.AwaitDeadline(until))
        << "try " << attempt << ": no wait of " << expected.delay() << "; next deadline in "
        << clock.NextDeadline() - clock.Now();
    clock.Advance(expected.delay());
    expected.Grow();
  }
  EXPECT_EQ(expected.delay(), ControlPlaneBackoff().max()) << "the schedule reached its cap";
  EXPECT_TRUE((*registration)->daemon_id().empty());
  // Drain times out on the clock too (nothing acknowledges it). It pokes the
  // loop, whose next try fails and waits the capped 5 s as Drain does.
  std::optional<bool> drained;
  std::thread drain([&] { drained = (*registration)->Drain(absl::Seconds(5)); });
  ASSERT_TRUE(clock.AwaitDeadline(clock.Now() + absl::Seconds(5), 2));
  clock.Advance(absl::Seconds(5));
  drain.join();
  EXPECT_EQ(drained, false);
}

TEST(JobTokenSetTest, AnUnknownTokenWaitsOnTheClockForAReplyThatNamesIt) {
  FakeEnv clock;
  JobTokenSet tokens(&clock);
  absl::Mutex mu;
  std::optional<absl::Status> late, known, expired;
  tokens.Admit("late", absl::Minutes(1), [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    late = s;
  });
  tokens.Admit("never", absl::Minutes(1), [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    expired = s;
  });
  // Both wait on the timer's deadline; 59 s later, a reply names "late".
  ASSERT_TRUE(clock.AwaitDeadline(clock.Now() + absl::Minutes(1)));
  clock.Advance(absl::Seconds(59));
  v1::HeartbeatResponse reply;
  reply.add_job_token_hashes(TokenHash("late"));
  reply.add_job_token_hashes(TokenHash("known"));
  tokens.Replace(reply);
  tokens.Admit("known", absl::Minutes(1), [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    known = s;
  });
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(late.has_value() && known.has_value());
    EXPECT_TRUE(late->ok()) << *late;
    EXPECT_TRUE(known->ok()) << *known;
    EXPECT_FALSE(expired.has_value()) << "a second of its wait is left";
  }
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return expired.has_value();
      },
      absl::Seconds(30)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(expired->code(), absl::StatusCode::kUnauthenticated) << *expired;
}

}  // namespace
}  // namespace specstream::services
