#include "student/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace specstream::student {

AdamW::AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, AdamWOptions options)
    : params_(std::move(params)), options_(options) {
  for (const auto& [name, p] : params_) {
    exp_avg_.push_back(torch::zeros_like(p));
    exp_avg_sq_.push_back(torch::zeros_like(p));
  }
}

void AdamW::Step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].second;
    torch::Tensor grad = p.grad();
    if (!grad.defined()) continue;
    p.mul_(1.0 - lr * options_.weight_decay);
    exp_avg_[i].lerp_(grad, 1.0 - options_.beta1);
    exp_avg_sq_[i].mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    torch::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bias2)).add_(options_.eps);
    p.addcdiv_(exp_avg_[i], denom, -lr / bias1);
  }
}

std::map<std::string, torch::Tensor> AdamW::State() const {
  std::map<std::string, torch::Tensor> state;
  for (size_t i = 0; i < params_.size(); ++i) {
    state[params_[i].first + ".exp_avg"] = exp_avg_[i];
    state[params_[i].first + ".exp_avg_sq"] = exp_avg_sq_[i];
  }
  state["step"] = torch::tensor(step_, torch::kInt64);
  return state;
}

absl::Status AdamW::LoadState(const std::map<std::string, torch::Tensor>& state) {
  auto step = state.find("step");
  if (step == state.end()) return absl::InvalidArgumentError("optimizer state lacks \"step\"");
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto* target : {&exp_avg_[i], &exp_avg_sq_[i]}) {
      std::string name = params_[i].first + (target == &exp_avg_[i] ? ".exp_avg" : ".exp_avg_sq");
      auto it = state.find(name);
      if (it == state.end()) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer state lacks \"", name, "\""));
      }
      if (!it->second.sizes().equals(target->sizes())) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state \"", name, "\" has the wrong shape"));
      }
      torch::NoGradGuard no_grad;
      target->copy_(it->second);
    }
  }
  step_ = step->second.item<int64_t>();
  return absl::OkStatus();
}

double LrSchedule::At(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (!cosine) return peak_lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  const double min_lr = min_lr_ratio * peak_lr;
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

torch::Tensor ClipGradNorm(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                           double max_norm) {
  torch::NoGradGuard no_grad;
  torch::Tensor total;
  for (const auto& [name, p] : params) {
    if (!p.grad().defined()) continue;
    torch::Tensor squares = p.grad().to(torch::kFloat64).pow(2).sum();
    total = total.defined() ? total + squares : squares;
  }
  if (!total.defined()) {
    return torch::zeros({}, params.empty()
                                ? torch::TensorOptions(torch::kFloat64)
                                : params.front().second.options().dtype(torch::kFloat64));
  }
  const torch::Tensor norm = total.sqrt();
  if (max_norm > 0) {
    // In float64 as a scalar would be, then applied as the gradients' type.
    const torch::Tensor factor = (max_norm / (norm + 1e-6)).clamp_max(1.0);
    for (const auto& [name, p] : params) {
      if (p.grad().defined()) p.mutable_grad().mul_(factor.to(p.grad().scalar_type()));
    }
  }
  return norm;
}

}  // namespace specstream::student
