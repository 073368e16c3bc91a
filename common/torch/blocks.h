// Transformer building blocks with Hugging Face numerics, shared by the
// teacher's target runtimes and the student's EAGLE-3 draft. Functional:
// weights are passed in, nothing is owned.
//
// Shapes: hidden states are [B, T, H] (or [T, H]); attention works on
// q [B, Hq, T, D], k/v [B, Hkv, T, D] with Hq a multiple of Hkv (GQA).
#ifndef SPECSTREAM_COMMON_TORCH_BLOCKS_H_
#define SPECSTREAM_COMMON_TORCH_BLOCKS_H_

#include <optional>
#include <utility>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/hf_config.h"

namespace specstream::nn {

// LlamaRMSNorm: x * rsqrt(mean(x², -1) + eps) computed in fp32 (float64 for
// float64 x), cast back to x's dtype, then scaled by `weight`.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// y = x Wᵀ (+ b).
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias = {});

// SwiGLU MLP: down(silu(gate(x)) * up(x)).
torch::Tensor SwiGluMlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                        const torch::Tensor& down);

// Rotary position embedding tables, as transformers computes them for
// default, linear, llama3 and yarn rope_scaling.
class Rotary final {
 public:
  // `dim` is the rotary dimension (head_dim).
  static absl::StatusOr<Rotary> Create(int64_t dim, double theta, const RopeScaling& scaling,
                                       int64_t max_position_embeddings);

  // cos and sin [T, dim] (fp32 math, attention scaling applied, cast to
  // `dtype`) for int64 positions [T], on the positions' device.
  std::pair<torch::Tensor, torch::Tensor> CosSin(const torch::Tensor& positions,
                                                 torch::Dtype dtype) const;

  const torch::Tensor& inv_freq() const { return inv_freq_; }
  double attention_scaling() const { return attention_scaling_; }

 private:
  Rotary(torch::Tensor inv_freq, double attention_scaling)
      : inv_freq_(std::move(inv_freq)), attention_scaling_(attention_scaling) {}
  torch::Tensor inv_freq_;  // fp32 [dim / 2]
  double attention_scaling_;
};

// x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1).
// x [..., T, D]; cos/sin [T, D] broadcast over the leading dimensions.
torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin);

struct AttentionOptions {
  double scale = 1.0;                     // usually 1/sqrt(head_dim)
  std::optional<int64_t> sliding_window;  // key j visible to query i iff i - j < window
  // Upper bound on score elements held at once; query blocks are sized to
  // stay under it, so memory grows linearly with T.
  int64_t max_score_elements = int64_t{1} << 22;
  // On LibTorch 2.x, without a sliding window: LibTorch's fused kernel
  // (at::scaled_dot_product_attention: flash / memory-efficient on CUDA, a
  // blocked kernel accumulating in fp32 on CPU). False, on 1.13 or with a
  // window: the blockwise kernel below.
  bool fused = true;
};

// True when CausalAttention with these options runs LibTorch's fused kernel.
bool UsesFusedAttention(const AttentionOptions& options);

// Causal scaled-dot-product attention with GQA. q [B, Hq, T, D], k/v
// [B, Hkv, T, D] with Hq a multiple of Hkv. Returns [B, Hq, T, D] in q's
// dtype and on q's device. The blockwise kernel works over query blocks:
// scores in the input dtype, softmax in fp32 and cast back (eager HF
// numerics); the fused one keeps scores in fp32 (agrees within bf16
// rounding).
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionOptions& options);

}  // namespace specstream::nn

#endif  // SPECSTREAM_COMMON_TORCH_BLOCKS_H_
