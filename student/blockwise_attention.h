// The pieces the blockwise attention kernels share: TTT attention
// (ttt_attention.cc), ring attention under context parallelism
// (context_parallel.cc) and the block drafts' attention (block_attention.cc).
//
// The grouped-query layout: q [B, Hq, T, D] is viewed as [B, Hkv, G, T, D]
// (G = Hq / Hkv, HF's repeat_kv grouping), and a query block [qs, qs + L) is
// flattened to [B, Hkv, G·L, D], so that one batched matmul against a key
// block [B, Hkv, Lk, D] serves every query head of a kv head: K and V are
// never repeated, and the Pᵀ·dO and dSᵀ·Q products sum a group's dK and dV.
// Scores, softmax statistics and accumulators are kept in the compute type.
#ifndef SPECSTREAM_STUDENT_BLOCKWISE_ATTENTION_H_
#define SPECSTREAM_STUDENT_BLOCKWISE_ATTENTION_H_

#include <cstdint>

#include <torch/torch.h>

namespace specstream::student {

// The grouped-query sizes of q [B, Hq, T, D] against keys [B, Hkv, *, D].
struct GroupedDims {
  int64_t batch, q_heads, kv_heads, group, t, d;
};
GroupedDims GroupedDimsOf(const torch::Tensor& q, const torch::Tensor& k);

// fp32 for fp32 and bf16 inputs; float64 for float64 ones, so that finite
// differences can check a backward.
torch::ScalarType AttentionComputeType(torch::ScalarType input);

// Query rows [start, start + len) of a [B, Hkv, G, T, D] tensor as a
// contiguous [B, Hkv, G·len, D] in `type`.
torch::Tensor FlatRows(const torch::Tensor& x5, int64_t start, int64_t len,
                       const GroupedDims& dims, torch::ScalarType type);

// Rows [start, start + len) of a per-row statistic [B, Hkv, G, T] (the
// softmax's lse, the backward's correction) as [B, Hkv, G·len, 1], the
// column beside FlatRows's block of the same rows.
torch::Tensor FlatRowStats(const torch::Tensor& x4, int64_t start, int64_t len,
                           const GroupedDims& dims);

// The causal mask of a block of scores: [q_len, k_len] bool on `device`,
// true where key position k_begin + j lies after query position q_begin + i
// (hidden).
torch::Tensor CausalHidden(int64_t q_begin, int64_t q_len, int64_t k_begin, int64_t k_len,
                           torch::Device device);

// Scaled scores [B, Hkv, G·len, lk] of a flattened query block (rows
// [qs, qs + len)) against key block [ks, ks + lk) of the same sequence, with
// the keys after each query hidden (-inf).
torch::Tensor CausalBlockScores(const torch::Tensor& qb, const torch::Tensor& kb, int64_t qs,
                                int64_t len, int64_t ks, int64_t lk, double scale,
                                const GroupedDims& dims);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_BLOCKWISE_ATTENTION_H_
