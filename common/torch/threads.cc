#include "common/torch/threads.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include <ATen/Parallel.h>

namespace specstream {
namespace {

// A positive integer environment variable, else 0.
int PositiveEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return 0;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  return end != value && *end == '\0' && parsed > 0 && parsed < (1 << 16) ? static_cast<int>(parsed)
                                                                          : 0;
}

}  // namespace

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  // "max 100000" (no limit) or "<quota> <period>" in microseconds.
  std::ifstream quota_file("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (quota_file >> quota >> period && quota != "max" && period > 0) {
    const long long limit = std::atoll(quota.c_str());
    if (limit > 0) cpus = std::min<long long>(cpus, (limit + period - 1) / period);
  }
  return std::max(cpus, 1);
}

int ConfigureComputeThreads() {
  if (PositiveEnv("OMP_NUM_THREADS") > 0) return at::get_num_threads();
  const int ranks = std::max(PositiveEnv("LOCAL_WORLD_SIZE"), 1);
  at::set_num_threads(std::max(AvailableCpus() / ranks, 1));
  return at::get_num_threads();
}

}  // namespace specstream
