#include "student/sampler.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace specstream::student {

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Below(uint64_t bound) {
  // Rejection sampling: discard the top partial block of 2^64.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = Next();
  } while (x >= limit);
  return x % bound;
}

absl::StatusOr<std::unique_ptr<DistributedSampler>> DistributedSampler::Create(
    int64_t num_samples, SamplerOptions options) {
  if (options.dp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("dp_size ", options.dp_size, " must be >= 1"));
  }
  if (options.dp_rank < 0 || options.dp_rank >= options.dp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_rank ", options.dp_rank, " must be in [0, ", options.dp_size, ")"));
  }
  if (num_samples < 0) return absl::InvalidArgumentError("num_samples must be >= 0");
  int64_t per_rank = options.drop_last ? num_samples / options.dp_size
                                       : (num_samples + options.dp_size - 1) / options.dp_size;
  if (per_rank == 0) {
    return absl::InvalidArgumentError(absl::StrCat(num_samples, " samples leave rank ",
                                                   options.dp_rank, " of ", options.dp_size,
                                                   " with nothing to train on"));
  }
  return std::unique_ptr<DistributedSampler>(
      new DistributedSampler(num_samples, options, per_rank));
}

std::vector<int64_t> DistributedSampler::Indices(int64_t epoch) const {
  std::vector<int64_t> order(num_samples_);
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {
    // Seed from (seed, epoch) through one SplitMix64 step each so nearby
    // epochs give unrelated permutations.
    SplitMix64 mixer(options_.seed);
    SplitMix64 rng(mixer.Next() ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL));
    for (int64_t i = num_samples_ - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
      std::swap(order[i], order[j]);
    }
  }
  const int64_t total = per_rank_ * options_.dp_size;
  std::vector<int64_t> mine;
  mine.reserve(per_rank_);
  for (int64_t pos = options_.dp_rank; pos < total; pos += options_.dp_size) {
    mine.push_back(order[pos % num_samples_]);
  }
  return mine;
}

}  // namespace specstream::student
