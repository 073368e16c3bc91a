// The waits of common/env.h on a clock the test drives (FakeEnv), and the
// POSIX Env's waits in real time.
#include "common/env.h"

#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_env.h"

namespace specstream {
namespace {

using testing::FakeEnv;

TEST(FakeEnvTest, SleepEndsWhenTheClockPassesItsDeadline) {
  FakeEnv env;
  const absl::Time start = env.Now();
  absl::Notification woke;
  std::thread sleeper([&] {
    env.SleepFor(absl::Hours(1));
    woke.Notify();
  });
  ASSERT_TRUE(env.AwaitDeadline(start + absl::Hours(1)));
  env.Advance(absl::Minutes(59));
  EXPECT_FALSE(woke.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  env.Advance(absl::Minutes(1));
  EXPECT_TRUE(woke.WaitForNotificationWithTimeout(absl::Seconds(10)));
  sleeper.join();
  EXPECT_EQ(env.NextDeadline(), absl::InfiniteFuture());
}

TEST(FakeEnvTest, AwaitEndsOnTheConditionOrTheDeadline) {
  FakeEnv env;
  absl::Mutex mu;
  bool flag = false;
  auto set = [&flag]() { return flag; };
  bool result = true;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = env.AwaitWithTimeout(mu, absl::Condition(&set), absl::Minutes(5));
  });
  ASSERT_TRUE(env.AwaitDeadline(env.Now() + absl::Minutes(5)));
  env.Advance(absl::Minutes(5));
  waiter.join();
  EXPECT_FALSE(result) << "the deadline passed with the condition false";

  std::thread waiter2([&] {
    absl::MutexLock lock(&mu);
    result = env.AwaitWithTimeout(mu, absl::Condition(&set), absl::Minutes(5));
  });
  ASSERT_TRUE(env.AwaitWaiters(1));
  {
    absl::MutexLock lock(&mu);
    flag = true;
  }
  waiter2.join();  // the condition ends it; the clock never moved
  EXPECT_TRUE(result);
}

TEST(FakeEnvTest, ConditionVariableWaitsReportTimeoutOrSignal) {
  FakeEnv env;
  absl::Mutex mu;
  absl::CondVar cv;
  bool flag = false;
  // As callers wait: until the predicate holds or the deadline passed.
  auto wait = [&](absl::Time deadline) {
    absl::MutexLock lock(&mu);
    while (!flag) {
      if (env.WaitWithDeadline(cv, mu, deadline)) return true;
    }
    return false;
  };
  bool timed_out = true;
  std::thread waiter([&] { timed_out = wait(env.Now() + absl::Seconds(30)); });
  ASSERT_TRUE(env.AwaitWaiters(1));
  {
    absl::MutexLock lock(&mu);
    flag = true;
    cv.Signal();
  }
  waiter.join();
  EXPECT_FALSE(timed_out);

  flag = false;
  std::thread waiter2([&] { timed_out = wait(env.Now() + absl::Seconds(30)); });
  ASSERT_TRUE(env.AwaitWaiters(1));
  env.Advance(absl::Seconds(29));
  EXPECT_TRUE(env.AwaitDeadline(env.Now() + absl::Seconds(1))) << "still waiting";
  env.Advance(absl::Seconds(1));
  waiter2.join();
  EXPECT_TRUE(timed_out);
}

TEST(PosixEnvTest, WaitsInRealTime) {
  Env& env = Env::Default();
  absl::Mutex mu;
  absl::CondVar cv;
  const absl::Time start = env.Now();
  env.SleepFor(absl::Milliseconds(20));
  EXPECT_GE(env.Now() - start, absl::Milliseconds(20));
  bool never = false;
  absl::MutexLock lock(&mu);
  EXPECT_FALSE(env.AwaitWithTimeout(mu, absl::Condition(&never), absl::Milliseconds(10)));
  EXPECT_TRUE(env.AwaitWithTimeout(mu, absl::Condition::kTrue, absl::Hours(1)));
  EXPECT_TRUE(env.WaitWithDeadline(cv, mu, env.Now() + absl::Milliseconds(10)));
}

}  // namespace
}  // namespace specstream
