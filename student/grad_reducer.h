// Data-parallel gradients (DDP): every parameter's gradient summed over the
// ranks of a group, the all-reduce overlapping the backward pass.
//
// Parameters are grouped into flat fp32 buckets of about bucket_elements,
// filled from the last parameter backwards (gradients become ready roughly
// in reverse order of use). A hook on each parameter copies its gradient
// into its bucket; a bucket's all-reduce starts once it and every bucket
// before it are complete, so every rank issues the collectives in the same
// order. Finish() launches what backward left incomplete (a parameter
// without gradient this step contributes zeros), waits, and writes the sums
// back into the gradients.
//
// Thread-safety: one thread (the trainer's); the hooks run inside its
// backward call.
#ifndef SPECSTREAM_STUDENT_GRAD_REDUCER_H_
#define SPECSTREAM_STUDENT_GRAD_REDUCER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "common/torch/compat.h"

namespace specstream::student {

class GradReducer final {
 public:
  using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

  // Registers the hooks on `params` (gradients then live on `device`). A
  // null group reduces nothing: Prepare and Finish do no work.
  GradReducer(const NamedParams& params, c10::intrusive_ptr<CommGroup> group,
              int64_t bucket_elements, torch::Device device);

  // Before each backward pass.
  void Prepare();
  // After it: every gradient is the sum over the group.
  absl::Status Finish();
  // Rank `root`'s parameter values on every rank (before training).
  absl::Status BroadcastParameters(int root = 0);

  int64_t num_buckets() const;

 private:
  struct State;
  NamedParams params_;
  // The group and the buckets, shared with the hooks, which outlive nothing
  // they point to.
  std::shared_ptr<State> state_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_GRAD_REDUCER_H_
