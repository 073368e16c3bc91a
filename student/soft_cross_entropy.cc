#include "student/soft_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace specstream::student {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A chunk whose row weights are all zero (padding) adds nothing and is
// skipped where that costs no device sync: on the host. On a device every
// chunk is computed (a zero weight zeroes its terms).
bool NothingToCompute(const torch::Tensor& row_weight) {
  return row_weight.is_cpu() && !row_weight.ne(0).any().item<bool>();
}

class FusedSoftCe final : public torch::autograd::Function<FusedSoftCe> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& target_logp,
                               const torch::Tensor& target_argmax, const torch::Tensor& row_weight,
                               int64_t chunk_rows) {
    torch::NoGradGuard no_grad;
    const int64_t b = hidden.size(0), l = hidden.size(1);
    if (chunk_rows <= 0)
      chunk_rows = std::clamp<int64_t>((int64_t{1} << 20) / weight.size(0), 64, 1024);
    const torch::Tensor w32 = weight.to(torch::kFloat32);
    torch::Tensor loss = torch::zeros({}, hidden.options().dtype(torch::kFloat64));
    torch::Tensor correct = torch::zeros({}, hidden.options().dtype(torch::kInt64));
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t start = 0; start < l; start += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, l - start);
        torch::Tensor rw = row_weight[i].narrow(0, start, rows);
        if (NothingToCompute(rw)) continue;
        torch::Tensor logits =
            torch::matmul(hidden[i].narrow(0, start, rows).to(torch::kFloat32), w32.t());
        torch::Tensor hit = logits.argmax(-1).eq(target_argmax[i].narrow(0, start, rows));
        // CE = -Σ_v p_v (logits_v - lse) = lse · Σp - Σ_v p_v logits_v, with
        // two [rows, V] temporaries (logits, p) and the product taken in place.
        torch::Tensor lse = logits.logsumexp(-1);
        torch::Tensor p = target_logp[i].narrow(0, start, rows).exp();
        torch::Tensor p_sum = p.sum(-1);
        torch::Tensor ce = lse * p_sum - p.mul_(logits).sum(-1);
        loss += (ce * rw).sum().to(torch::kFloat64);
        correct += (hit & rw.ne(0)).sum();
      }
    }
    ctx->save_for_backward({hidden, weight, target_logp, row_weight});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->mark_non_differentiable({correct});
    return {loss.to(torch::kFloat32), correct};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::NoGradGuard no_grad;
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& target_logp = saved[2];
    const torch::Tensor& row_weight = saved[3];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const torch::Tensor scale = grads[0].to(torch::kFloat32);
    const int64_t b = hidden.size(0), l = hidden.size(1);
    const torch::Tensor w32 = weight.to(torch::kFloat32);
    torch::Tensor grad_hidden = torch::zeros_like(hidden);
    torch::Tensor grad_weight =
        torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32));
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t start = 0; start < l; start += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, l - start);
        torch::Tensor rw = row_weight[i].narrow(0, start, rows);
        if (NothingToCompute(rw)) continue;
        torch::Tensor h = hidden[i].narrow(0, start, rows).to(torch::kFloat32);
        // d/dlogits of −Σ p log softmax = softmax − p (Σ p = 1), per row
        // weight, built in place in one [rows, V] buffer plus exp(p).
        torch::Tensor g = torch::matmul(h, w32.t());
        g.sub_(g.logsumexp(-1, /*keepdim=*/true)).exp_();
        g.sub_(target_logp[i].narrow(0, start, rows).exp()).mul_((rw * scale).unsqueeze(1));
        grad_hidden[i].narrow(0, start, rows).copy_(torch::matmul(g, w32));
        grad_weight.addmm_(g.t(), h);
      }
    }
    return {grad_hidden,     grad_weight.to(weight.scalar_type()),
            torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

SoftCrossEntropyResult FusedSoftCrossEntropy(const torch::Tensor& hidden,
                                             const torch::Tensor& weight,
                                             const torch::Tensor& target_logp,
                                             const torch::Tensor& target_argmax,
                                             const torch::Tensor& row_weight, int64_t chunk_rows) {
  variable_list out =
      FusedSoftCe::apply(hidden, weight, target_logp, target_argmax, row_weight, chunk_rows);
  return {out[0], out[1]};
}

}  // namespace specstream::student
