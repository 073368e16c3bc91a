#include "student/epoch_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specstream::student {

absl::StatusOr<EpochPlan> EpochPlan::Create(const EpochPlanOptions& options,
                                            const std::vector<int64_t>& lengths) {
  if ((options.batch_size > 0) == (options.batch_tokens > 0)) {
    return absl::InvalidArgumentError(
        "set exactly one of training.batch_size and training.batch_tokens");
  }
  EpochPlan plan;
  plan.options_ = options;
  SamplerOptions sampler;
  sampler.seed = options.seed;
  sampler.dp_rank = options.dp_rank;
  sampler.dp_size = options.dp_size;
  const int64_t num_samples = static_cast<int64_t>(lengths.size());
  int64_t dealt = num_samples;  // what the sampler orders: samples or packed batches
  if (options.batch_tokens > 0) {
    std::vector<int64_t> by_length(lengths.size());
    std::iota(by_length.begin(), by_length.end(), 0);
    auto length = [&](int64_t index) {
      const int64_t len = lengths[index];
      return options.max_length > 0 ? std::min(len, options.max_length) : len;
    };
    std::stable_sort(by_length.begin(), by_length.end(),
                     [&](int64_t a, int64_t b) { return length(a) < length(b); });
    std::vector<int64_t> current;
    int64_t longest = 0;
    for (int64_t index : by_length) {
      const int64_t len = length(index);
      const int64_t padded = (static_cast<int64_t>(current.size()) + 1) * std::max(longest, len);
      if (!current.empty() && padded > options.batch_tokens) {
        plan.largest_batch_ = std::max<int64_t>(plan.largest_batch_, current.size());
        plan.packed_.push_back(std::move(current));
        current.clear();
        longest = 0;
      }
      current.push_back(index);
      longest = std::max(longest, len);
    }
    if (!current.empty()) {
      plan.largest_batch_ = std::max<int64_t>(plan.largest_batch_, current.size());
      plan.packed_.push_back(std::move(current));
    }
    dealt = static_cast<int64_t>(plan.packed_.size());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DistributedSampler> order,
                   DistributedSampler::Create(dealt, sampler));
  plan.sampler_ = std::move(order);
  if (options.batch_size > 0) {
    const int64_t per_rank = plan.sampler_->samples_per_rank();
    plan.steps_per_epoch_ = (per_rank + options.batch_size - 1) / options.batch_size;
    plan.largest_batch_ = std::min(per_rank, options.batch_size);
  } else {
    plan.steps_per_epoch_ = plan.sampler_->samples_per_rank();
  }
  if (plan.steps_per_epoch_ == 0) return absl::FailedPreconditionError("an epoch has no batches");
  return plan;
}

EpochPlan::Plan EpochPlan::Compute(int64_t epoch) const {
  Plan plan;
  const std::vector<int64_t> order = sampler_->Indices(epoch);
  if (options_.batch_size > 0) {
    const size_t batch = static_cast<size_t>(options_.batch_size);
    for (size_t i = 0; i < order.size(); i += batch) {
      plan.emplace_back(order.begin() + i, order.begin() + std::min(order.size(), i + batch));
    }
  } else {
    for (int64_t packed : order) plan.push_back(packed_[packed]);
  }
  return plan;
}

std::vector<int64_t> EpochPlan::Batch(int64_t step) {
  const int64_t epoch = step / steps_per_epoch_;
  auto it = cache_.find(epoch);
  if (it == cache_.end()) {
    // A step reads its own epoch and prefetches into the next: two suffice.
    if (cache_.size() >= 2) cache_.erase(cache_.begin());
    it = cache_.emplace(epoch, Compute(epoch)).first;
  }
  return it->second[step % steps_per_epoch_];
}

}  // namespace specstream::student
