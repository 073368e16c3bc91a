// The draft's loss head fused with its soft cross-entropy: Σ_n w_n · CE(p_n,
// softmax(h_n Wᵀ)) computed in row chunks, with a backward that recomputes
// the logits chunk by chunk. No [N, draft_vocab] logits are kept for
// backward, so memory per TTT step is O(N·H), not O(N·V).
#ifndef SPECSTREAM_STUDENT_SOFT_CROSS_ENTROPY_H_
#define SPECSTREAM_STUDENT_SOFT_CROSS_ENTROPY_H_

#include <torch/torch.h>

namespace specstream::student {

struct SoftCrossEntropyResult {
  torch::Tensor loss;     // scalar fp32, differentiable w.r.t. hidden and weight
  torch::Tensor correct;  // scalar int64: rows with w > 0 whose argmax equals target_argmax
};

// hidden [B, L, H] (compute dtype), weight [V, H] (compute dtype),
// target_logp [B, L, V] fp32 log-probabilities (no grad; may be a narrowed
// view), target_argmax [B, L] int64, row_weight [B, L] fp32 (0 drops a row).
// Logits and softmax are fp32. `chunk_rows` 0 picks chunks of about 2^20
// logits (4 MiB fp32 per chunk temporary, at most 1024 and at least 64
// rows): the transient memory is a few chunks whatever the length, which
// keeps a context-parallel shard's memory proportional to its rows.
SoftCrossEntropyResult FusedSoftCrossEntropy(
    const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& target_logp,
    const torch::Tensor& target_argmax, const torch::Tensor& row_weight, int64_t chunk_rows = 0);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_SOFT_CROSS_ENTROPY_H_
