#include "tests/testing/fake_target_runtime.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace specstream::testing {

FakeTargetRuntime::FakeTargetRuntime(FakeTargetRuntimeOptions options) {
  description_.model_type = "fake";
  description_.runtime = "fake";
  description_.hidden_size = options.hidden_size;
  description_.vocab_size = options.vocab_size;
  description_.num_layers = options.num_layers;
  description_.max_position_embeddings = options.max_position_embeddings;
  description_.capture_layer_ids = options.capture_layer_ids;
  description_.dtype = torch::kFloat32;
}

torch::Tensor FakeTargetRuntime::ExpectedAux(const std::vector<int32_t>& ids,
                                             const std::vector<int>& layers) const {
  const std::vector<int>& captured = layers.empty() ? description_.capture_layer_ids : layers;
  const int64_t t = static_cast<int64_t>(ids.size());
  const int64_t h = description_.hidden_size;
  std::vector<torch::Tensor> columns;
  for (int k : captured) columns.push_back(torch::arange(k * h, (k + 1) * h, torch::kFloat32));
  const int64_t width = static_cast<int64_t>(captured.size()) * h;
  torch::Tensor id = torch::tensor(std::vector<int32_t>(ids)).to(torch::kFloat32).view({t, 1});
  torch::Tensor pos = torch::arange(t, torch::kFloat32).view({t, 1}) / 1000;
  torch::Tensor col = torch::cat(columns).view({1, width}) / 1e6;
  return (id + pos + col).contiguous();
}

torch::Tensor FakeTargetRuntime::ExpectedLast(const std::vector<int32_t>& ids) const {
  const int64_t t = static_cast<int64_t>(ids.size());
  const int64_t h = description_.hidden_size;
  torch::Tensor id = torch::tensor(std::vector<int32_t>(ids)).to(torch::kFloat32).view({t, 1});
  torch::Tensor col = torch::arange(h, torch::kFloat32).view({1, h}) / 1000;
  return (-(id + col)).contiguous();
}

absl::StatusOr<std::vector<teacher::SequenceCapture>> FakeTargetRuntime::Forward(
    const teacher::ForwardRequest& request) {
  int32_t poison = -1;
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
    ++waiting_;
    mu_.Await(absl::Condition(&released));
    --waiting_;
    batch_sizes_.push_back(static_cast<int64_t>(request.sequences.size()));
    capture_requests_.push_back(request.capture_layer_ids);
    for (const std::vector<int32_t>& ids : request.sequences) {
      first_ids_.push_back(ids.empty() ? -1 : ids.front());
    }
    poison = poison_id_;
    delay = forward_delay_;
  }
  absl::SleepFor(delay);
  for (int k : request.capture_layer_ids) {
    if (k < 0 || k >= description_.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("capture layer id ", k, " is outside [0, ", description_.num_layers, ")"));
    }
  }
  std::vector<teacher::SequenceCapture> out;
  for (const std::vector<int32_t>& ids : request.sequences) {
    if (ids.empty()) return absl::InvalidArgumentError("an empty sequence");
    for (int32_t id : ids) {
      if (id < 0 || id >= description_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside the vocab"));
      }
      if (id == poison) return absl::InternalError(absl::StrCat("poison token id ", id));
    }
    teacher::SequenceCapture capture;
    capture.aux_hidden = ExpectedAux(ids, request.capture_layer_ids);
    capture.last_hidden = ExpectedLast(ids);
    if (request.want_target_ids) {
      capture.target_ids = ((torch::tensor(std::vector<int32_t>(ids)) + 1) %
                            static_cast<int32_t>(description_.vocab_size))
                               .to(torch::kInt32);
    }
    out.push_back(std::move(capture));
  }
  return out;
}

void FakeTargetRuntime::set_poison_id(int32_t id) {
  absl::MutexLock lock(&mu_);
  poison_id_ = id;
}

void FakeTargetRuntime::set_forward_delay(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  forward_delay_ = delay;
}

void FakeTargetRuntime::Hold() {
  absl::MutexLock lock(&mu_);
  held_ = true;
}

void FakeTargetRuntime::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
}

int64_t FakeTargetRuntime::forward_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(batch_sizes_.size());
}

std::vector<int64_t> FakeTargetRuntime::batch_sizes() const {
  absl::MutexLock lock(&mu_);
  return batch_sizes_;
}

std::vector<int32_t> FakeTargetRuntime::first_ids() const {
  absl::MutexLock lock(&mu_);
  return first_ids_;
}

std::vector<std::vector<int>> FakeTargetRuntime::capture_requests() const {
  absl::MutexLock lock(&mu_);
  return capture_requests_;
}

bool FakeTargetRuntime::AwaitHeldForward(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto waiting = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ > 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&waiting), timeout);
}

bool FakeTargetRuntime::AwaitSamples(int64_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t total = 0;
    for (int64_t b : batch_sizes_) total += b;
    return total >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

}  // namespace specstream::testing
