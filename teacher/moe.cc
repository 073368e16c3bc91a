#include "teacher/moe.h"

#include <vector>

#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"

namespace specstream::teacher::moe {
namespace {

// One expert over rows [M, H]: down(silu(gate x) * up x).
torch::Tensor ExpertForward(const torch::Tensor& rows, const Experts& experts, int64_t local) {
  const int64_t inter = experts.intermediate();
  torch::Tensor gate_up = torch::linear(rows, experts.gate_up[local]);
  return torch::linear(torch::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter),
                       experts.down[local]);
}

}  // namespace

Experts FuseExperts(const MoeLayerWeights& w) {
  std::vector<torch::Tensor> gate_up;
  for (size_t e = 0; e < w.gate.size(); ++e) gate_up.push_back(torch::cat({w.gate[e], w.up[e]}, 0));
  Experts experts;
  experts.gate_up = torch::stack(gate_up);
  experts.down = torch::stack(w.down);
  experts.first = w.first_expert;
  return experts;
}

Routing Route(const torch::Tensor& x, const torch::Tensor& router, int64_t top_k,
              bool renormalize) {
  torch::Tensor probs = torch::softmax(torch::linear(x, router).to(torch::kFloat32), -1);
  auto [weights, experts] = probs.topk(top_k, -1);
  if (renormalize) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return Routing{experts, weights.to(x.scalar_type())};
}

torch::Tensor RunGrouped(const torch::Tensor& rows, const torch::Tensor& local_ids,
                         const Experts& experts) {
  torch::Tensor out = torch::empty_like(rows);
  if (rows.size(0) == 0) return out;
  torch::Tensor order = local_ids.argsort();
  // Row counts size the per-expert slices: read on the host (the one sync
  // grouped experts need; SGLang's dispatch reads its counts too).
  const torch::Tensor counts = torch::bincount(local_ids, {}, experts.count()).to(torch::kCPU);
  const int64_t* count = counts.data_ptr<int64_t>();
  int64_t start = 0;
  for (int64_t e = 0; e < experts.count(); ++e) {
    if (count[e] == 0) continue;
    torch::Tensor index = order.narrow(0, start, count[e]);
    out.index_copy_(0, index, ExpertForward(rows.index_select(0, index), experts, e));
    start += count[e];
  }
  return out;
}

torch::Tensor CombineLocal(const torch::Tensor& x, const Routing& routing, const Experts& experts) {
  const int64_t k = routing.experts.size(1);
  torch::Tensor token =
      torch::arange(x.size(0), x.options().dtype(torch::kInt64)).repeat_interleave(k);
  torch::Tensor y =
      RunGrouped(x.index_select(0, token), routing.experts.reshape({-1}) - experts.first, experts);
  return torch::zeros_like(x).index_add_(0, token, y * routing.weights.reshape({-1, 1}));
}

torch::Tensor PerTokenLoop(const torch::Tensor& x, const Routing& routing, const Experts& experts) {
  torch::Tensor out = torch::zeros_like(x);
  auto ids = routing.experts.accessor<int64_t, 2>();
  for (int64_t t = 0; t < x.size(0); ++t) {
    torch::Tensor row = x.narrow(0, t, 1);
    for (int64_t k = 0; k < routing.experts.size(1); ++k) {
      out.narrow(0, t, 1) +=
          routing.weights[t][k] * ExpertForward(row, experts, ids[t][k] - experts.first);
    }
  }
  return out;
}

TokenChunk ChunkOf(int64_t n, int rank, int size) {
  const int64_t base = n / size, extra = n % size;
  return TokenChunk{rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

absl::StatusOr<torch::Tensor> DispatchCombine(const torch::Tensor& x, const Routing& routing,
                                              const Experts& experts, const ParallelLayout& layout,
                                              CommGroup& group) {
  const int ranks = layout.tp_size, moe_tp = layout.moe_tp_size();
  const int64_t k = routing.experts.size(1);
  // Every (token, slot) pair, ordered by the EP rank owning its expert.
  torch::Tensor token =
      torch::arange(x.size(0), x.options().dtype(torch::kInt64)).repeat_interleave(k);
  torch::Tensor expert = routing.experts.reshape({-1});
  torch::Tensor weight = routing.weights.reshape({-1});
  torch::Tensor owner = torch::div(expert, experts.count(), "floor");
  const torch::Tensor pairs_per_owner = torch::bincount(owner, {}, layout.ep_size).to(torch::kCPU);
  torch::Tensor order = owner.argsort();
  // Each pair goes to every MoE-TP rank of its owner (they hold slices of the
  // same experts), so the blocks for ranks owner*moe_tp .. +moe_tp-1 repeat.
  std::vector<int64_t> send_rows(ranks), block_start(layout.ep_size, 0);
  const int64_t* per_owner = pairs_per_owner.data_ptr<int64_t>();
  for (int owner_rank = 1; owner_rank < layout.ep_size; ++owner_rank) {
    block_start[owner_rank] = block_start[owner_rank - 1] + per_owner[owner_rank - 1];
  }
  std::vector<torch::Tensor> send_index;
  for (int rank = 0; rank < ranks; ++rank) {
    const int owner_rank = rank / moe_tp;
    send_rows[rank] = per_owner[owner_rank];
    send_index.push_back(order.narrow(0, block_start[owner_rank], per_owner[owner_rank]));
  }
  torch::Tensor sent = torch::cat(send_index);  // pair index of every row sent
  torch::Tensor sent_token = token.index_select(0, sent);
  torch::Tensor local_ids =
      expert.index_select(0, sent) - owner.index_select(0, sent) * experts.count();

  // How many rows each rank will receive from each other rank.
  std::vector<int64_t> ones(ranks, 1);
  ASSIGN_OR_RETURN(
      torch::Tensor incoming,
      AllToAllRows(group, CopyToDevice(torch::tensor(send_rows, torch::kInt64), x.device()), ones,
                   ones));
  incoming = incoming.to(torch::kCPU);
  std::vector<int64_t> recv_rows(incoming.data_ptr<int64_t>(),
                                 incoming.data_ptr<int64_t>() + ranks);

  ASSIGN_OR_RETURN(torch::Tensor rows,
                   AllToAllRows(group, x.index_select(0, sent_token), send_rows, recv_rows));
  ASSIGN_OR_RETURN(torch::Tensor ids, AllToAllRows(group, local_ids, send_rows, recv_rows));
  torch::Tensor outputs = RunGrouped(rows, ids, experts);
  ASSIGN_OR_RETURN(torch::Tensor back, AllToAllRows(group, outputs, recv_rows, send_rows));
  // Partial outputs of the MoE-TP slices add up like the weighted experts.
  return torch::zeros_like(x).index_add_(0, sent_token,
                                         back * weight.index_select(0, sent).reshape({-1, 1}));
}

}  // namespace specstream::teacher::moe
