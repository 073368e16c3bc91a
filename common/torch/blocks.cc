#include "common/torch/blocks.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/torch/compat.h"

namespace specstream::nn {

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // fp32 math for fp32/bf16/fp16 (HF); float64 stays float64 (exactness tests).
  torch::Tensor h = x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);
  torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  return bias.defined() ? torch::linear(x, weight, bias) : torch::linear(x, weight);
}

torch::Tensor SwiGluMlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                        const torch::Tensor& down) {
  return torch::linear(torch::silu(torch::linear(x, gate)) * torch::linear(x, up), down);
}

namespace {

double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// transformers' _compute_yarn_parameters.
torch::Tensor YarnInvFreq(int64_t dim, double base, const RopeScaling& s, int64_t original_max,
                          const torch::Tensor& pos_freqs) {
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original_max / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  torch::Tensor ramp = ((torch::arange(dim / 2, torch::kFloat32) - low) / (high - low)).clamp(0, 1);
  torch::Tensor extrapolation_factor = 1 - ramp;
  torch::Tensor extrapolation = 1.0 / pos_freqs;
  torch::Tensor interpolation = 1.0 / (s.factor * pos_freqs);
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

// transformers' _compute_llama3_parameters.
torch::Tensor Llama3InvFreq(const torch::Tensor& inv_freq, const RopeScaling& s) {
  const double old_context = static_cast<double>(*s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  torch::Tensor wavelen = 2 * M_PI / inv_freq;
  torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  torch::Tensor smooth =
      (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  torch::Tensor is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
  return torch::where(is_medium, smoothed, scaled);
}

}  // namespace

absl::StatusOr<Rotary> Rotary::Create(int64_t dim, double theta, const RopeScaling& scaling,
                                      int64_t max_position_embeddings) {
  if (dim <= 0 || dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotary dim ", dim, " must be positive and even"));
  }
  if (theta <= 0) return absl::InvalidArgumentError("rope_theta must be positive");
  // base^(2i/dim) in fp32, as transformers computes it.
  torch::Tensor pos_freqs =
      torch::pow(theta, torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / dim);
  torch::Tensor inv_freq = 1.0 / pos_freqs;
  double attention_scaling = 1.0;
  switch (scaling.kind) {
    case RopeScaling::Kind::kNone:
      break;
    case RopeScaling::Kind::kLinear:
      inv_freq = inv_freq / scaling.factor;
      break;
    case RopeScaling::Kind::kLlama3:
      if (!scaling.original_max_position_embeddings) {
        return absl::InvalidArgumentError(
            "rope_scaling.original_max_position_embeddings is required for llama3");
      }
      inv_freq = Llama3InvFreq(inv_freq, scaling);
      break;
    case RopeScaling::Kind::kYarn: {
      int64_t original_max =
          scaling.original_max_position_embeddings.value_or(max_position_embeddings);
      inv_freq = YarnInvFreq(dim, theta, scaling, original_max, pos_freqs);
      if (scaling.attention_factor) {
        attention_scaling = *scaling.attention_factor;
      } else if (scaling.mscale.value_or(0) != 0 && scaling.mscale_all_dim.value_or(0) != 0) {
        // transformers tests truthiness: a zero counts as unset.
        attention_scaling = YarnMscale(scaling.factor, *scaling.mscale) /
                            YarnMscale(scaling.factor, *scaling.mscale_all_dim);
      } else {
        attention_scaling = YarnMscale(scaling.factor, 1.0);
      }
      break;
    }
  }
  return Rotary(inv_freq.to(torch::kFloat32), attention_scaling);
}

std::pair<torch::Tensor, torch::Tensor> Rotary::CosSin(const torch::Tensor& positions,
                                                       torch::Dtype dtype) const {
  torch::Tensor freqs =
      torch::outer(positions.to(torch::kFloat32), inv_freq_.to(positions.device()));
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {(emb.cos() * attention_scaling_).to(dtype), (emb.sin() * attention_scaling_).to(dtype)};
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor x1 = x.narrow(-1, 0, half);
  torch::Tensor x2 = x.narrow(-1, half, half);
  torch::Tensor rotated = torch::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

bool UsesFusedAttention(const AttentionOptions& options) {
  return SPECSTREAM_TORCH_2 && options.fused && !options.sliding_window;
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionOptions& options) {
#if SPECSTREAM_TORCH_2
  if (UsesFusedAttention(options)) {
    // GQA by repeating k/v heads (linear memory), as transformers' sdpa path
    // does: every backend takes equal head counts, while enable_gqa is not
    // taken by all of them and the fallback materialises T x T scores.
    const int64_t group = q.size(1) / k.size(1);
    auto repeat = [&](const torch::Tensor& x) {
      if (group == 1) return x;
      const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
      return x.unsqueeze(2).expand({b, h, group, t, d}).reshape({b, h * group, t, d});
    };
    return at::scaled_dot_product_attention(q, repeat(k), repeat(v), /*attn_mask=*/std::nullopt,
                                            /*dropout_p=*/0.0, /*is_causal=*/true, options.scale);
  }
#endif
  const int64_t batch = q.size(0), q_heads = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t kv_heads = k.size(1);
  const int64_t group = q_heads / kv_heads;
  // [B, Hkv, group, T, D] against k/v [B, Hkv, 1, T, D]: GQA without copies.
  torch::Tensor qg = q.view({batch, kv_heads, group, t, d});
  torch::Tensor kg = k.unsqueeze(2);
  torch::Tensor vg = v.unsqueeze(2);
  const int64_t per_query_row = std::max<int64_t>(1, batch * q_heads * t);
  const int64_t block = std::clamp<int64_t>(options.max_score_elements / per_query_row, 16, t);

  torch::Tensor out = torch::empty_like(qg);
  for (int64_t start = 0; start < t; start += block) {
    const int64_t len = std::min(block, t - start);
    const int64_t keys_end = start + len;  // causal: keys [key_begin, keys_end)
    int64_t key_begin = 0;
    if (options.sliding_window)
      key_begin = std::max<int64_t>(0, start - *options.sliding_window + 1);
    const int64_t key_len = keys_end - key_begin;
    torch::Tensor qb = qg.narrow(3, start, len);
    torch::Tensor kb = kg.narrow(3, key_begin, key_len);
    torch::Tensor vb = vg.narrow(3, key_begin, key_len);
    torch::Tensor scores = torch::matmul(qb, kb.transpose(-1, -2)) * options.scale;
    // Query i (absolute start + i) sees key j (absolute key_begin + j) iff
    // j <= i and, with a window, i - j < window.
    const auto positions = q.options().dtype(torch::kInt64);
    torch::Tensor qi = torch::arange(start, keys_end, positions).unsqueeze(1);
    torch::Tensor kj = torch::arange(key_begin, keys_end, positions).unsqueeze(0);
    torch::Tensor hidden = kj > qi;
    if (options.sliding_window) hidden = hidden | (qi - kj >= *options.sliding_window);
    scores =
        scores.to(torch::kFloat32).masked_fill(hidden, -std::numeric_limits<float>::infinity());
    torch::Tensor probs = torch::softmax(scores, -1).to(q.scalar_type());
    out.narrow(3, start, len).copy_(torch::matmul(probs, vb));
  }
  return out.view({batch, q_heads, t, d});
}

}  // namespace specstream::nn
