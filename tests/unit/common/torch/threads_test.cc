#include "common/torch/threads.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <ATen/Parallel.h>

#include "gtest/gtest.h"

namespace specstream {
namespace {

// Restores LibTorch's threads and the two variables after each test.
class ComputeThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = at::get_num_threads();
    Save("OMP_NUM_THREADS", omp_);
    Save("LOCAL_WORLD_SIZE", local_);
    unsetenv("OMP_NUM_THREADS");
    unsetenv("LOCAL_WORLD_SIZE");
  }
  void TearDown() override {
    Restore("OMP_NUM_THREADS", omp_);
    Restore("LOCAL_WORLD_SIZE", local_);
    at::set_num_threads(threads_);
  }

 private:
  struct Saved {
    bool set = false;
    std::string value;
  };
  static void Save(const char* name, Saved& saved) {
    const char* value = std::getenv(name);
    saved.set = value != nullptr;
    if (value != nullptr) saved.value = value;
  }
  static void Restore(const char* name, const Saved& saved) {
    if (saved.set) {
      setenv(name, saved.value.c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  int threads_ = 1;
  Saved omp_, local_;
};

TEST_F(ComputeThreadsTest, AvailableCpusIsTheAffinityMaskAtMost) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_GE(AvailableCpus(), 1);
  EXPECT_LE(AvailableCpus(), CPU_COUNT(&set));
}

TEST_F(ComputeThreadsTest, UsesEveryAvailableCpuUnlessToldOtherwise) {
  at::set_num_threads(1);
  EXPECT_EQ(ConfigureComputeThreads(), AvailableCpus());
  EXPECT_EQ(at::get_num_threads(), AvailableCpus());
}

TEST_F(ComputeThreadsTest, LocalRanksShareTheCpus) {
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_EQ(ConfigureComputeThreads(), std::max(AvailableCpus() / 2, 1));
  // More ranks than CPUs: one thread each.
  setenv("LOCAL_WORLD_SIZE", "4096", 1);
  EXPECT_EQ(ConfigureComputeThreads(), 1);
  // Not a positive count: as if unset.
  setenv("LOCAL_WORLD_SIZE", "two", 1);
  EXPECT_EQ(ConfigureComputeThreads(), AvailableCpus());
}

TEST_F(ComputeThreadsTest, OmpNumThreadsIsLeftToLibTorch) {
  at::set_num_threads(1);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  EXPECT_EQ(ConfigureComputeThreads(), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
}

}  // namespace
}  // namespace specstream
