// AdamW (PyTorch's torch.optim.AdamW update, decoupled weight decay) and the
// warmup + cosine learning-rate schedule, with state as plain named tensors
// so checkpoints hold it directly.
#ifndef SPECSTREAM_STUDENT_OPTIMIZER_H_
#define SPECSTREAM_STUDENT_OPTIMIZER_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"

namespace specstream::student {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class AdamW final {
 public:
  // `params` are fp32 leaf tensors (name, tensor); the optimizer keeps
  // references, not copies.
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, AdamWOptions options);

  // One update with learning rate `lr` from the params' .grad().
  void Step(double lr);
  int64_t steps() const { return step_; }

  // "<param>.exp_avg", "<param>.exp_avg_sq" and "step" (int64 scalar).
  std::map<std::string, torch::Tensor> State() const;
  // InvalidArgument naming the missing or mis-shaped tensor.
  absl::Status LoadState(const std::map<std::string, torch::Tensor>& state);

 private:
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

struct LrSchedule {
  double peak_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  bool cosine = true;
  double min_lr_ratio = 0.0;

  // Learning rate for 0-based `step`: linear warmup (step+1)/warmup, then
  // cosine decay to min_lr_ratio·peak at total_steps (or constant).
  double At(int64_t step) const;
};

// Global L2 norm of the gradients; scales them down to `max_norm` when above
// it (0: no clipping). Returns the norm before clipping as a float64 scalar
// on the gradients' device: nothing is read back, the clip factor is
// min(1, max_norm / (norm + 1e-6)) applied on the device (a factor of 1
// leaves a gradient bit for bit unchanged).
torch::Tensor ClipGradNorm(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                           double max_norm);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_OPTIMIZER_H_
