// The mixture-of-experts block of the sglang runtime (qwen3_moe, mixtral):
// routing, grouped expert execution, and expert-parallel dispatch/combine.
//
//   * Routing as transformers defines both families: router logits in the
//     compute dtype, softmax over all experts in fp32, top-k, the k weights
//     renormalised to sum 1 when the config says so (always for mixtral),
//     then cast back to the compute dtype.
//   * Grouped execution (SGLang's fused MoE, without the kernel): the
//     (token, expert) pairs are grouped by expert, each expert runs one
//     gate_up matmul and one down matmul over all its rows.
//   * Expert parallelism (teacher/model_weights.h has the layout): each TP
//     rank takes a contiguous chunk of the tokens, routes it, and sends every
//     (token, expert) pair's row to the ranks holding that expert (the MoE-TP
//     ranks of its EP rank) with one all-to-all; they run their experts and
//     send the rows back with a second all-to-all; the sender combines them
//     with the routing weights.
//
// Internal to specstream_teacher.
#ifndef SPECSTREAM_TEACHER_MOE_H_
#define SPECSTREAM_TEACHER_MOE_H_

#include <cstdint>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/torch/compat.h"
#include "teacher/model_weights.h"

namespace specstream::teacher::moe {

// The experts one rank holds, fused per expert.
struct Experts {
  torch::Tensor gate_up;  // [E_local, 2 I', H]: cat(gate, up) of each expert's slice
  torch::Tensor down;     // [E_local, H, I']
  int64_t first = 0;      // global id of local expert 0
  int64_t count() const { return gate_up.size(0); }
  int64_t intermediate() const { return down.size(2); }
};

// Fuses and stacks the loaded experts of one layer.
Experts FuseExperts(const MoeLayerWeights& weights);

struct Routing {
  torch::Tensor experts;  // int64 [N, K]: global expert ids, by descending weight
  torch::Tensor weights;  // [N, K] in the compute dtype
};

// x [N, H], router [E, H].
Routing Route(const torch::Tensor& x, const torch::Tensor& router, int64_t top_k, bool renormalize);

// Row m of `rows` [M, H] through local expert local_ids[m] (int64 [M]):
// [M, H]. Grouped: one gate_up and one down matmul per expert present.
torch::Tensor RunGrouped(const torch::Tensor& rows, const torch::Tensor& local_ids,
                         const Experts& experts);

// Σ_k weights[t, k] · expert_{experts[t, k]}(x[t]) for every token, when this
// rank holds every expert (EP 1). Under TP the experts hold an intermediate
// slice and the result is this rank's partial sum.
torch::Tensor CombineLocal(const torch::Tensor& x, const Routing& routing, const Experts& experts);

// The same sum computed token by token and expert by expert: the reference
// the grouped and expert-parallel paths are checked against.
torch::Tensor PerTokenLoop(const torch::Tensor& x, const Routing& routing, const Experts& experts);

// Expert parallelism (layout.ep_size > 1). Collective over the TP group:
// every rank calls it with its own token rows x [n, H] (n may be 0) and their
// routing, and gets back the full Σ_k weights · expert(x) for its rows.
absl::StatusOr<torch::Tensor> DispatchCombine(const torch::Tensor& x, const Routing& routing,
                                              const Experts& experts, const ParallelLayout& layout,
                                              CommGroup& group);

// The contiguous chunk [begin, begin + size) of n tokens that TP rank `rank`
// of `size` routes under expert parallelism.
struct TokenChunk {
  int64_t begin = 0;
  int64_t size = 0;
};
TokenChunk ChunkOf(int64_t n, int rank, int size);

}  // namespace specstream::teacher::moe

#endif  // SPECSTREAM_TEACHER_MOE_H_
