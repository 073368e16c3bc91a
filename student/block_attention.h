// Block-draft attention with KV injection (DFlash / DSpark, DESIGN.md §10),
// memory-linear in the context length and in the number of blocks, with its
// own backward.
//
// The draft's queries come only from its N blocks of `block_size` tokens
// each. Query row (block j, slot i) attends, in ONE softmax, to
//   (a) the context keys/values at positions p < limit[b, j] (block j's
//       anchor: the context strictly before it), and
//   (b) every slot of its own block j (bidirectional),
// and to nothing else. A dummy block passes limit 0: it sees only its own
// slots, so every row has at least one key and nothing is NaN.
//
// Computed flash-attention style: per chunk of blocks, the own-block scores
// ([block_size × block_size] per block) first, then the context keys in
// key blocks up to the chunk's largest limit, merged with an online softmax.
// No [N·bs, S] or [N·bs, S + N·bs] score or mask matrix is ever held: beyond
// inputs and outputs the forward keeps the per-row logsumexp (O(N·bs)) and
// O(chunk × key block) scratch. The backward recomputes the scores chunk by
// chunk from the saved logsumexp; the context key/value gradients accumulate
// in the compute type (O(S·D)).
//
// Numerics: scores, softmax and accumulation in fp32 (float64 for float64
// inputs); the output is cast to q's dtype. GQA as Hugging Face repeat_kv
// (query head h reads kv head h / (Hq / Hkv)), without repeating K or V.
//
// Thread-safety: a pure function of its inputs; autograd as usual (the ring
// variant: distinct groups from distinct threads).
#ifndef SPECSTREAM_STUDENT_BLOCK_ATTENTION_H_
#define SPECSTREAM_STUDENT_BLOCK_ATTENTION_H_

#include <cstdint>

#include <torch/torch.h>

#include "common/torch/compat.h"

namespace specstream::student {

struct BlockAttentionOptions {
  double scale = 1.0;        // usually 1/sqrt(head_dim)
  int64_t query_rows = 256;  // query rows (whole blocks, at least one) per chunk
  int64_t key_block = 256;   // context keys per score block
  int tag_base = 0;          // RingBlockAttention's p2p tags: [tag_base, tag_base + 8·cp)
};

// q:      [B, Hq, N·bs, D]   block queries (q_norm and RoPE applied by the caller)
// kc, vc: [B, Hkv, S, D]     context keys/values
// kb, vb: [B, Hkv, N·bs, D]  block keys/values
// limit:  [B, N] int64 on the CPU, each in [0, S]: block j sees context
//         positions < limit[b, j].
// Returns [B, Hq, N·bs, D] in q's dtype. q, kc, vc, kb and vb share dtype
// and device; Hq must be a multiple of Hkv. Differentiable with respect to
// q, kc, vc, kb and vb. Throws c10::Error on bad shapes or limits.
torch::Tensor BlockAttention(const torch::Tensor& q, const torch::Tensor& kc,
                             const torch::Tensor& vc, const torch::Tensor& kb,
                             const torch::Tensor& vb, const torch::Tensor& limit,
                             int64_t block_size, const BlockAttentionOptions& options);

// The same with the context sharded over a CP group (context parallelism):
// kc, vc: [B, Hkv, L, D] are this rank's shard, global positions
// [rank·L, (rank+1)·L) (ShardRange; padding rows at the end of the sequence
// lie past every limit, so they need no mask); limit holds global positions
// in [0, cp·L]. The keys and values stay with their owner: the blocks'
// queries go round the group's ring instead (with their running softmax;
// in backward with dO, the logsumexp, Δ and an fp32 dQ accumulator), cp
// hops that bring each rank's package home, so the ring holds O(N·bs·D)
// per rank whatever the context length, and each rank's fp32 dK/dV is its
// own shard's. Every rank passes the same number of blocks (DealBlocks
// pads). The result equals BlockAttention over the gathered context (the
// same sums, taken shard by shard). Collective over `context_group`: every rank calls it, and runs its
// backward, in the same order with same-shaped arguments; the group is kept
// alive by the graph until backward.
torch::Tensor RingBlockAttention(const torch::Tensor& q, const torch::Tensor& kc,
                                 const torch::Tensor& vc, const torch::Tensor& kb,
                                 const torch::Tensor& vb, const torch::Tensor& limit,
                                 int64_t block_size, CommGroup& context_group,
                                 const BlockAttentionOptions& options);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_BLOCK_ATTENTION_H_
