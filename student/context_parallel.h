// Context-parallel (CP) primitives for the draft trainer (DESIGN.md §6): one
// sequence split into contiguous shards over the ranks of a CP group.
//
//  * Layout: PaddedShardLength / ShardRange / ShardSequence say which global
//    positions a rank owns. Every rank holds the same static number of rows,
//    ceil(T / cp_size); the trailing shards are padded at the END (rows past
//    T), and a shard may be entirely padding when T < cp_size.
//  * SequenceAllGather: the autograd-correct all-gather of equal shards along
//    dim 1; its backward is a padded reduce-scatter(SUM), done as all_reduce +
//    slice because Gloo has no reduce_scatter.
//  * RingCausalAttention: the step-0 causal block of TTT attention with K/V
//    blocks passed around the CP group (point-to-point send/recv), merged by
//    log-sum-exp, with a backward that returns dK/dV to their owners. It also
//    returns the per-row logsumexp so that the caller can merge the TTT
//    diagonal keys (which only touch the same position, so stay local).
//
// Collectives: every function here is a collective over `cp_group`; all ranks
// of the group must call it in the same order with same-shaped shards, and the
// backward passes are collectives too (so every rank must run backward through
// the same calls, in the same order). The group must outlive the backward; it
// is kept alive by the autograd graph (c10d groups are intrusive_ptr-owned).
//
// Thread-safety: pure functions of their inputs; distinct groups may be used
// from distinct threads (the tests run one rank per thread).
#ifndef SPECSTREAM_STUDENT_CONTEXT_PARALLEL_H_
#define SPECSTREAM_STUDENT_CONTEXT_PARALLEL_H_

#include <chrono>
#include <cstdint>
#include <string>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "common/torch/compat.h"

namespace specstream::student {

// Where one CP rank's shard sits in a sequence of `total_length` positions.
struct CpShard {
  int64_t begin = 0;          // global position of the shard's first row: cp_rank * padded_length
  int64_t length = 0;         // real (non-padding) rows, in [0, padded_length]
  int64_t padded_length = 0;  // rows every rank holds: ceil(total_length / cp_size)
};

// ceil(total_length / cp_size); 0 for an empty sequence. Throws c10::Error on
// a negative length or cp_size < 1.
int64_t PaddedShardLength(int64_t total_length, int64_t cp_size);

// The contiguous shard of `cp_rank` in [0, cp_size): rows
// [begin, begin + length) are real, rows [begin + length, begin +
// padded_length) are padding. Shards tile [0, cp_size * padded_length) in rank
// order; `length` is 0 for ranks whose shard starts at or past total_length.
CpShard ShardRange(int64_t total_length, int64_t cp_size, int64_t cp_rank);

// This rank's shard of `full` along `dim` (size T there), zero-padded at the
// end to padded_length rows: a new contiguous tensor (no autograd link to
// positions of other ranks; differentiable with respect to `full`).
torch::Tensor ShardSequence(const torch::Tensor& full, int64_t dim, int64_t cp_size,
                            int64_t cp_rank);

// True for the real rows of this rank's shard: a bool tensor [padded_length]
// on `device`.
torch::Tensor ShardValidMask(int64_t total_length, int64_t cp_size, int64_t cp_rank,
                             torch::Device device = torch::kCPU);

// local: [B, Tpad, ...], this rank's shard (the same shape on every rank).
// Returns [B, cp_size * Tpad, ...]: the shards in rank order (padding rows
// included; narrow dim 1 to T for the real sequence). Differentiable: the
// gradient of a shard is the SUM over ranks of the gradients of its rows in
// every rank's gathered copy (ReduceScatterSum: a real reduce-scatter on
// NCCL and on Gloo from LibTorch 2.x, all_reduce + slice on Gloo in 1.13).
// bf16/fp16 are gathered as their bytes and summed natively where the group
// can (fp32 otherwise); the result and the gradient keep the input dtype.
// Throws c10::Error on a communication failure or a tensor with fewer than
// two dims.
torch::Tensor SequenceAllGather(const torch::Tensor& local, CommGroup& cp_group);

struct RingAttentionOptions {
  double scale = 1.0;        // usually 1/sqrt(head_dim)
  int64_t block_size = 128;  // query and key rows per compute block (memory: O(block²·heads))
  int tag_base = 0;          // p2p tags used: [tag_base, tag_base + 3·cp_size)
};

struct RingAttentionOutput {
  torch::Tensor out;  // [B, Hq, Tpad, D] in q's dtype
  torch::Tensor lse;  // [B, Hq, Tpad] per-row logsumexp of the scaled scores, fp32 (fp64 for fp64)
};

// Causal attention of this rank's query shard over the keys of every shard at
// or before it. q: [B, Hq, Tpad, D]; k, v: [B, Hkv, Tpad, D]; rank r holds
// global positions [r·Tpad, (r+1)·Tpad) (ShardRange). The result equals rows
// [r·Tpad, (r+1)·Tpad) of full causal attention over the gathered sequence,
// with GQA as HF repeat_kv (query head h reads kv head h / (Hq / Hkv)).
//
// Padding needs no mask: padding rows sit at the END of the sequence, so a
// real query (position < T) never sees a padded key under the causal mask.
// Padded query rows produce values the caller must ignore (loss mask); when
// their output and lse gradients are zero, they contribute no gradient.
//
// Differentiable with respect to q, k, v through both outputs (a caller may
// merge extra keys using lse: out' = out·exp(lse - lse') + ..., and the
// gradient through lse is honoured). Forward: cp_size - 1 ring passes of the
// K/V block (isend to rank+1, recv from rank-1, overlapped with compute).
// Backward: recomputes scores blockwise from the saved lse; dQ stays local;
// each K/V block travels the ring again with an fp32 dK/dV accumulator that
// returns to the block's owner after a full cycle. Memory beyond inputs and
// outputs: two K/V blocks, two dK/dV accumulators, O(block²·heads) scratch.
// Scores and accumulators are fp32 (fp64 for fp64 inputs). Throws c10::Error
// on bad shapes or a communication failure.
RingAttentionOutput RingCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, CommGroup& cp_group,
                                        const RingAttentionOptions& options);

// ---------------------------------------------------------------------------
// Rank layout and groups of a DP × CP world (DESIGN.md §6).
//
// World rank r = dp_rank · cp_size + cp_rank. Inside a CP group, cp_size =
// ulysses · ring and cp_rank = ring_rank · ulysses + ulysses_rank: a Ulysses
// group holds `ulysses` consecutive shards (so after its all-to-all every
// member sees one contiguous chunk of ulysses · Tpad rows, for its slice of
// the heads), and a ring group links the members with the same head slice,
// chunk after chunk. cp_mode ring is ulysses = 1, ulysses is ring = 1, usp
// is both > 1.
struct CpLayout {
  int world_size = 1;
  int cp_size = 1;
  int ulysses = 1;  // Ulysses degree; divides cp_size
  int rank = 0;     // world rank

  int dp_size() const { return world_size / cp_size; }
  int dp_rank() const { return rank / cp_size; }
  int cp_rank() const { return rank % cp_size; }
  int ring_size() const { return cp_size / ulysses; }
  int ring_rank() const { return cp_rank() / ulysses; }
  int ulysses_rank() const { return cp_rank() % ulysses; }
};

// Refuses a layout that cannot run, naming the job field: cp_size not
// dividing the world, a Ulysses degree not dividing cp_size, or attention
// heads (query or key/value) not divisible by the Ulysses degree.
absl::Status ValidateCpLayout(const CpLayout& layout, int64_t q_heads, int64_t kv_heads);

// The sub-groups one rank attends over; null where the degree is 1. `cp` is
// the whole CP group (the DP group's cp_size ranks in cp_rank order; the
// ring or Ulysses group when that one spans it), null when cp_size is 1.
struct CpGroups {
  c10::intrusive_ptr<CommGroup> ulysses;
  c10::intrusive_ptr<CommGroup> ring;
  c10::intrusive_ptr<CommGroup> cp;
};

// Creates this rank's Ulysses and ring groups over prefixes of the world's
// rendezvous store, for tensors on `device` (Gloo on CPU, NCCL on CUDA:
// CreateDeviceGroup). Collective: every world rank must call it with the
// same layout. `host` is this rank's own address, which the groups bind
// for their connections (ResolveLocalAddress). `join_timeout` bounds every
// member's arrival (a training job's parallel.rendezvous_timeout_s, as for
// the world group); collectives then take kCollectiveTimeout.
absl::StatusOr<CpGroups> CreateCpGroups(const CpLayout& layout,
                                        const c10::intrusive_ptr<c10d::Store>& store,
                                        const std::string& host,
                                        std::chrono::milliseconds join_timeout,
                                        torch::Device device = torch::kCPU);

// ---------------------------------------------------------------------------
// Ulysses: all-to-all between sequence and head sharding.

// x: [B, H, Tl, D], this rank's sequence chunk with every head. Returns
// [B, H / u, u · Tl, D]: heads [g · H/u, (g+1) · H/u) (g = this rank in the
// group of size u) over the u chunks concatenated in group-rank order.
// Differentiable (the backward is the inverse all-to-all). H must be
// divisible by u. bf16/fp16 travel bit-exactly. Collective over `group`.
torch::Tensor SequenceToHeads(const torch::Tensor& x, CommGroup& group);

// The inverse: [B, H / u, u · Tl, D] -> [B, H, Tl, D].
torch::Tensor HeadsToSequence(const torch::Tensor& x, CommGroup& group);

// ---------------------------------------------------------------------------
// TTT attention (ttt_attention.h semantics) with the step-0 keys spread over
// a ring: RingCausalAttention for the causal part, then the keys of steps
// 1..S (which only touch the same position) merged locally through the
// ring's logsumexp. q: [B, Hq, Tpad, D]; k0, v0: [B, Hkv, Tpad, D]; kd, vd:
// [S, B, Hkv, Tpad, D] or undefined / S = 0. Differentiable with respect to
// every input; the merge runs in fp32 (fp64 for fp64) and the result has q's
// dtype. Collective over `ring_group`.
torch::Tensor RingTttAttention(const torch::Tensor& q, const torch::Tensor& k0,
                               const torch::Tensor& v0, const torch::Tensor& kd,
                               const torch::Tensor& vd, CommGroup& ring_group,
                               const RingAttentionOptions& options);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_CONTEXT_PARALLEL_H_
