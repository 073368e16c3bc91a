#include "student/step_rng.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace specstream::student {
namespace {

// SplitMix64's finaliser.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::mt19937_64 StepRng(uint64_t seed, int64_t step, int64_t sample_key) {
  return std::mt19937_64(
      Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(sample_key)));
}

uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % n;
}

std::vector<int64_t> UniformSubset(std::vector<int64_t> candidates, int64_t n,
                                   std::mt19937_64& rng) {
  n = std::clamp<int64_t>(n, 0, static_cast<int64_t>(candidates.size()));
  // Partial Fisher-Yates: the first n entries are a uniform subset.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j =
        i + static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(candidates.size() - i)));
    std::swap(candidates[i], candidates[j]);
  }
  candidates.resize(n);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

}  // namespace specstream::student
