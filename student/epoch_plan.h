// The data order of training: which samples each optimizer step of a DP
// group reads. LibTorch-free.
//
// batch_size mode: each epoch's DistributedSampler order (sampler.h), cut
// into batches of batch_size samples (the last one may be short).
// batch_tokens mode: the samples are packed once, globally, by length (a
// batch pads little: its size × its longest sample stays within the
// budget, a longer sample alone), and each epoch deals the packed batches to
// the DP ranks in the sampler's shuffled order.
//
// Either way every DP rank has the same number of steps in every epoch,
// which keeps the collectives in step and makes resume exact.
//
// Thread-safety: not thread-safe (Batch caches the epochs it computes).
#ifndef SPECSTREAM_STUDENT_EPOCH_PLAN_H_
#define SPECSTREAM_STUDENT_EPOCH_PLAN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "student/sampler.h"

namespace specstream::student {

struct EpochPlanOptions {
  uint64_t seed = 0;
  int dp_rank = 0;
  int dp_size = 1;
  // Exactly one of the two is positive.
  int64_t batch_size = 0;    // samples per batch
  int64_t batch_tokens = 0;  // padded tokens per batch
  // Samples count as truncated to this many tokens (0: off).
  int64_t max_length = 0;
};

class EpochPlan final {
 public:
  // `lengths[i]` is sample i's token count. InvalidArgument for options the
  // plan cannot use (names the field); FailedPrecondition when an epoch
  // would have no batches.
  static absl::StatusOr<EpochPlan> Create(const EpochPlanOptions& options,
                                          const std::vector<int64_t>& lengths);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The most samples any batch of any epoch holds.
  int64_t largest_batch() const { return largest_batch_; }
  // The sample indices global step `step` (0-based, over all epochs) reads.
  std::vector<int64_t> Batch(int64_t step);

 private:
  using Plan = std::vector<std::vector<int64_t>>;
  EpochPlan() = default;
  Plan Compute(int64_t epoch) const;

  EpochPlanOptions options_;
  std::shared_ptr<const DistributedSampler> sampler_;
  Plan packed_;  // batch_tokens mode: the packed batches
  int64_t steps_per_epoch_ = 0;
  int64_t largest_batch_ = 0;
  std::map<int64_t, Plan> cache_;  // the two latest epochs asked for
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_EPOCH_PLAN_H_
