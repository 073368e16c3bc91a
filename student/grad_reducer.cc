#include "student/grad_reducer.h"

#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"

namespace specstream::student {

struct GradReducer::State {
  struct Bucket {
    std::vector<size_t> params;    // indices into the parameter list
    std::vector<int64_t> offsets;  // element offset of each in `flat`
    torch::Tensor flat;
    int64_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
  };
  c10::intrusive_ptr<CommGroup> group;
  std::vector<Bucket> buckets;
  size_t next = 0;  // buckets are launched in index order

  void LaunchReady() {
    while (next < buckets.size() && buckets[next].pending == 0) Launch(buckets[next++]);
  }
  void LaunchAll() {
    while (next < buckets.size()) Launch(buckets[next++]);
  }
  void Launch(Bucket& bucket) {
    std::vector<torch::Tensor> flat{bucket.flat};
    bucket.work = group->allreduce(flat);
  }
};

GradReducer::GradReducer(const NamedParams& params, c10::intrusive_ptr<CommGroup> group,
                         int64_t bucket_elements, torch::Device device)
    : params_(params), state_(std::make_shared<State>()) {
  state_->group = std::move(group);
  if (!state_->group) return;
  auto& buckets = state_->buckets;
  int64_t filled = 0;
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    const int64_t numel = params_[i].second.numel();
    if (buckets.empty() || (filled > 0 && filled + numel > bucket_elements)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().params.push_back(static_cast<size_t>(i));
    buckets.back().offsets.push_back(filled);
    filled += numel;
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    State::Bucket& bucket = buckets[b];
    int64_t total = 0;
    for (size_t p : bucket.params) total += params_[p].second.numel();
    bucket.flat = torch::zeros({total}, torch::TensorOptions(torch::kFloat32).device(device));
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      torch::Tensor param = params_[bucket.params[j]].second;
      const int64_t offset = bucket.offsets[j];
      std::weak_ptr<State> weak = state_;
      param.register_hook([weak, b, offset](torch::Tensor grad) {
        std::shared_ptr<State> state = weak.lock();
        if (!state) return;
        State::Bucket& target = state->buckets[b];
        target.flat.narrow(0, offset, grad.numel()).copy_(grad.reshape({-1}));
        --target.pending;
        state->LaunchReady();
      });
    }
  }
}

int64_t GradReducer::num_buckets() const { return static_cast<int64_t>(state_->buckets.size()); }

void GradReducer::Prepare() {
  state_->next = 0;
  for (State::Bucket& bucket : state_->buckets) {
    bucket.flat.zero_();
    bucket.pending = static_cast<int64_t>(bucket.params.size());
    bucket.work.reset();
  }
}

absl::Status GradReducer::Finish() {
  if (!state_->group) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  // The loss is normalised by the global count, so the reduction is a sum.
  return CatchTorch("gradient all_reduce", [&] {
    // Buckets whose gradients did not all arrive (a 1-token batch leaves
    // the head without gradient) go now, still in index order.
    state_->LaunchAll();
    for (State::Bucket& bucket : state_->buckets) {
      bucket.work->wait();
      for (size_t j = 0; j < bucket.params.size(); ++j) {
        torch::Tensor param = params_[bucket.params[j]].second;
        torch::Tensor reduced =
            bucket.flat.narrow(0, bucket.offsets[j], param.numel()).view_as(param);
        if (param.grad().defined()) {
          param.mutable_grad().copy_(reduced);
        } else {
          param.mutable_grad() = reduced.clone();
        }
      }
    }
  });
}

absl::Status GradReducer::BroadcastParameters(int root) {
  if (!state_->group) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) {
    torch::Tensor data = p.detach();
    RETURN_IF_ERROR(Annotate(Broadcast(*state_->group, data, root), name));
  }
  return absl::OkStatus();
}

}  // namespace specstream::student
