#include "common/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace specstream {
namespace {

// A page that faults with SIGBUS on every touch: a shared mapping of a
// memory file that was emptied after it was mapped. Unmapped on destruction.
class GonePage final {
 public:
  GonePage() {
    const int fd = memfd_create("sigbus-guard-test", 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kBytes), 0);
    base_ = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(base_, MAP_FAILED);
    EXPECT_EQ(ftruncate(fd, 0), 0);
    close(fd);
  }
  ~GonePage() { munmap(base_, kBytes); }
  GonePage(const GonePage&) = delete;
  GonePage& operator=(const GonePage&) = delete;

  volatile char* bytes() const { return static_cast<volatile char*>(base_); }
  uintptr_t address(size_t offset) const { return reinterpret_cast<uintptr_t>(base_) + offset; }

 private:
  static constexpr size_t kBytes = 4096;
  void* base_ = nullptr;
};

TEST(SigbusGuardTest, AnAccessThatDoesNotFaultRunsToItsEnd) {
  int ran = 0;
  EXPECT_FALSE(RunCatchingSigbus([&ran] { ran = 1; }).has_value());
  EXPECT_EQ(ran, 1);
}

TEST(SigbusGuardTest, AFaultEndsTheAccessAndNamesTheAddress) {
  GonePage page;
  for (int i = 0; i < 3; ++i) {  // and again: the handler stays in place
    std::optional<SigbusFault> fault = RunCatchingSigbus([&page] { page.bytes()[100] = 1; });
    ASSERT_TRUE(fault.has_value());
    EXPECT_EQ(fault->address, page.address(100));
  }
}

TEST(SigbusGuardTest, NestedRegionsTheInnermostCatches) {
  GonePage page;
  bool after_inner = false;
  std::optional<SigbusFault> inner;
  std::optional<SigbusFault> outer = RunCatchingSigbus([&] {
    inner = RunCatchingSigbus([&page] { (void)page.bytes()[1]; });
    after_inner = true;
    (void)page.bytes()[2];  // caught by the outer region, now innermost again
  });
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->address, page.address(1));
  EXPECT_TRUE(after_inner);
  ASSERT_TRUE(outer.has_value());
  EXPECT_EQ(outer->address, page.address(2));
}

TEST(SigbusGuardTest, EachThreadCatchesItsOwnFaults) {
  GonePage page;
  constexpr int kThreads = 4, kRounds = 200;
  std::atomic<int> caught{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::optional<SigbusFault> fault = RunCatchingSigbus([&] { page.bytes()[t] = 1; });
        if (fault.has_value() && fault->address == page.address(t)) ++caught;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(caught.load(), kThreads * kRounds);
}

// Outside a guarded region a fault still kills the process with SIGBUS, as
// it would without the guard.
TEST(SigbusGuardDeathTest, AFaultOutsideAnyRegionStillKills) {
  EXPECT_EXIT(
      {
        GonePage page;
        RunCatchingSigbus([] {});  // the handler is installed
        page.bytes()[0] = 1;
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

// A SIGBUS sent by kill/raise is not a fault of the region: it goes to the
// previous (default) disposition even inside one.
TEST(SigbusGuardDeathTest, ASentSigbusIsNotCaught) {
  EXPECT_EXIT(RunCatchingSigbus([] { raise(SIGBUS); }), ::testing::KilledBySignal(SIGBUS), "");
}

extern "C" void ExitFromSigbus(int, siginfo_t*, void*) { _exit(42); }

// A handler installed before the guard still gets the faults the guard does
// not catch. The child is a fresh process ("threadsafe" death tests re-run
// the binary), so the guard's handler is installed there after this one.
TEST(SigbusGuardDeathTest, FaultsOutsideARegionGoToThePreviousHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction action {};
        action.sa_sigaction = ExitFromSigbus;
        action.sa_flags = SA_SIGINFO;
        sigemptyset(&action.sa_mask);
        sigaction(SIGBUS, &action, nullptr);
        GonePage page;
        // Caught inside a region: the previous handler is not called...
        if (!RunCatchingSigbus([&page] { page.bytes()[0] = 1; }).has_value()) _exit(1);
        page.bytes()[0] = 1;  // ...and gets this one.
      },
      ::testing::ExitedWithCode(42), "");
}

}  // namespace
}  // namespace specstream
