// EAGLE-3 training-time-test (TTT) attention, memory-linear in T, with its own
// backward (DESIGN.md §3, "TTT unroll").
//
// At TTT step k (0-based) the query at position t attends, in ONE softmax, to
//   (a) the step-0 keys/values at positions j <= t (causal), and
//   (b) the keys/values of steps 1..k at the same position t ("diagonals"),
// as SpecForge and the EAGLE-3 reference implement it.
//
// Computed flash-attention style: blockwise over query blocks and key blocks
// with an online softmax (running max and sum), so no [T, T] score matrix is
// ever held; beyond inputs and outputs the forward keeps O(T) (the per-row
// logsumexp) plus O(block² · heads) scratch. The backward recomputes the
// scores block by block from the saved logsumexp and keeps fp32 accumulators
// for the step-0 key/value gradients (O(T · D)).
//
// Numerics: scores, softmax and output accumulation run in fp32 (float64 for
// float64 inputs; bf16 blocks are upcast one block at a time); the output is
// cast to q's dtype. GQA follows Hugging Face repeat_kv: query head h reads kv
// head h / (Hq / Hkv), without materialising repeated keys or values.
//
// Padding: none needs masking when sequences are right-padded. A real
// position t only sees step-0 positions j <= t (all real) and its own
// diagonals; padded rows produce garbage that the caller's loss mask drops,
// and their gradients are zero as long as the loss ignores them.
//
// Thread-safety: a pure function of its inputs (no state); autograd as usual.
#ifndef SPECSTREAM_STUDENT_TTT_ATTENTION_H_
#define SPECSTREAM_STUDENT_TTT_ATTENTION_H_

#include <cstdint>

#include <torch/torch.h>

namespace specstream::student {

struct TttAttentionOptions {
  double scale = 1.0;        // usually 1/sqrt(head_dim)
  int64_t block_size = 128;  // queries per block; also the key block size
};

// q:      [B, Hq, T, D]      queries of the current step (RoPE applied by the caller)
// k0, v0: [B, Hkv, T, D]     step-0 keys/values (the causal part)
// kd, vd: [S, B, Hkv, T, D]  keys/values of steps 1..S at the same position;
//                            S = k at step k. For S = 0 pass undefined tensors
//                            or tensors with a size-0 first dimension.
// Returns [B, Hq, T, D] in q's dtype. All inputs share dtype (fp32, bf16 or
// float64) and device; Hq must be a multiple of Hkv. Differentiable with
// respect to every defined input (custom autograd Function; gradients of
// query heads sharing a kv head are summed). Throws c10::Error on bad shapes.
torch::Tensor TttAttention(const torch::Tensor& q, const torch::Tensor& k0, const torch::Tensor& v0,
                           const torch::Tensor& kd, const torch::Tensor& vd,
                           const TttAttentionOptions& options);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_TTT_ATTENTION_H_
