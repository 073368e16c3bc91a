// Deterministic distributed sampler: the student's data order.
//
// For (seed, epoch) every rank computes the same permutation of [0, N)
// (Fisher-Yates driven by SplitMix64, so the order is identical on every
// platform and standard library), pads it by wrapping around to a multiple of
// dp_size (or drops the tail with drop_last), and rank r takes positions
// r, r + dp_size, r + 2·dp_size, ...  — the layout of torch's
// DistributedSampler, so each sample is seen once per epoch across ranks.
//
// Thread-safety: immutable after Create; Indices() may be called concurrently.
#ifndef SPECSTREAM_STUDENT_SAMPLER_H_
#define SPECSTREAM_STUDENT_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace specstream::student {

struct SamplerOptions {
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  int dp_rank = 0;
  int dp_size = 1;
};

class DistributedSampler final {
 public:
  // InvalidArgument for dp_size < 1, dp_rank outside [0, dp_size), or a
  // dataset that leaves a rank with no samples.
  static absl::StatusOr<std::unique_ptr<DistributedSampler>> Create(int64_t num_samples,
                                                                    SamplerOptions options);

  // This rank's sample indices for `epoch`, in training order.
  std::vector<int64_t> Indices(int64_t epoch) const;
  int64_t samples_per_rank() const { return per_rank_; }
  int64_t num_samples() const { return num_samples_; }

 private:
  DistributedSampler(int64_t num_samples, SamplerOptions options, int64_t per_rank)
      : num_samples_(num_samples), options_(options), per_rank_(per_rank) {}

  int64_t num_samples_;
  SamplerOptions options_;
  int64_t per_rank_;
};

// SplitMix64: the project's portable PRNG for data order.
class SplitMix64 final {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, bound) without modulo bias; bound > 0.
  uint64_t Below(uint64_t bound);

 private:
  uint64_t state_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_SAMPLER_H_
