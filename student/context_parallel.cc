#include "student/context_parallel.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"
#include "student/blockwise_attention.h"
#include "student/ring_hop.h"
#include "student/ttt_attention.h"

namespace specstream::student {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

CommGroup& GroupFrom(AutogradContext* ctx) { return GroupFromCapsule(ctx->saved_data["group"]); }

// Two-byte floats are moved (never summed) as their bytes: exact, in the
// tensor's own width, and every backend moves bytes.
torch::Tensor AsWire(const torch::Tensor& x) {
  torch::Tensor wire = x.contiguous();
  return wire.element_size() == 2 && wire.is_floating_point() ? wire.view(torch::kUInt8) : wire;
}

// ---------------------------------------------------------------------------
// Sequence all-gather.

class SequenceAllGatherFunction final
    : public torch::autograd::Function<SequenceAllGatherFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& local, CommGroup* group) {
    const int cp = group->getSize();
    ctx->saved_data["group"] = GroupCapsule(*group);
    ctx->saved_data["shard"] = local.size(1);
    std::vector<int64_t> shape = local.sizes().vec();
    shape[1] *= cp;
    // Same shape on every rank, so an empty shard is empty everywhere and no
    // rank communicates.
    if (local.numel() == 0) return torch::zeros(shape, local.options());
    torch::Tensor wire = AsWire(local);
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int i = 0; i < cp; ++i) outputs[0].push_back(torch::empty_like(wire));
    std::vector<torch::Tensor> inputs{wire};
    group->allgather(outputs, inputs)->wait();
    torch::Tensor gathered = torch::cat(outputs[0], 1);
    return wire.scalar_type() == local.scalar_type() ? gathered
                                                     : gathered.view(local.scalar_type());
  }

  // Padded reduce-scatter(SUM): every rank's gathered copy received a
  // gradient; the owner of rows [r·Tpad, (r+1)·Tpad) gets their sum
  // (ReduceScatterSum: the real collective on NCCL and on Gloo from LibTorch
  // 2.x, all_reduce + slice on Gloo in 1.13).
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    CommGroup& group = GroupFrom(ctx);
    const int64_t shard = ctx->saved_data["shard"].toInt();
    const torch::Tensor& grad = grad_outputs[0];
    if (grad.numel() == 0) return {grad.narrow(1, 0, shard), torch::Tensor()};
    // [B, cp·Tpad, ...] -> [cp, B, Tpad, ...]: rank r's rows first along dim 0.
    std::vector<int64_t> split = grad.sizes().vec();
    split[1] = shard;
    split.insert(split.begin() + 1, group.getSize());
    torch::Tensor parts = grad.reshape(split).transpose(0, 1).contiguous();
    absl::StatusOr<torch::Tensor> mine = ReduceScatterSum(group, parts.flatten(0, 1));
    ThrowIfError(Annotate(mine.status(), "SequenceAllGather backward"));
    return {mine->view(parts.sizes().slice(1)), torch::Tensor()};
  }
};

// ---------------------------------------------------------------------------
// Ring attention.

// The grouped-query layout of student/blockwise_attention.h.
using Dims = GroupedDims;

// Scaled scores of a flattened query chunk against key chunk [ks, ks + lk) of
// a block. On the diagonal block (the rank's own keys, same global offset as
// its queries) key j is hidden from query i when j > i; off-diagonal blocks
// that are computed at all lie wholly before the queries.
torch::Tensor BlockScores(const torch::Tensor& qb, const torch::Tensor& kb, int64_t qs, int64_t len,
                          int64_t ks, int64_t lk, bool diagonal, double scale, const Dims& dims) {
  if (diagonal) return CausalBlockScores(qb, kb, qs, len, ks, lk, scale, dims);
  return torch::matmul(qb, kb.transpose(-1, -2)).mul_(scale);
}

// Keys of the block visible to query chunk [qs, qs + len): all of them off
// the diagonal, those up to the chunk's last query on it.
int64_t VisibleKeys(int64_t qs, int64_t len, int64_t t, bool diagonal) {
  return diagonal ? qs + len : t;
}

// Partial attention of every local query over one K/V block: the output
// normalised within the block and its per-row logsumexp, [B, Hkv, G, T, D] and
// [B, Hkv, G, T] in the compute type. Every row sees at least one key (the
// diagonal block always includes the row's own position; off-diagonal blocks
// are wholly visible), so the lse is finite.
std::pair<torch::Tensor, torch::Tensor> BlockForward(const torch::Tensor& q5,
                                                     const torch::Tensor& kv, bool diagonal,
                                                     double scale, int64_t block, const Dims& dims,
                                                     torch::ScalarType ct) {
  torch::Tensor out5 =
      torch::empty({dims.batch, dims.kv_heads, dims.group, dims.t, dims.d}, q5.options().dtype(ct));
  torch::Tensor lse4 =
      torch::empty({dims.batch, dims.kv_heads, dims.group, dims.t}, q5.options().dtype(ct));
  for (int64_t qs = 0; qs < dims.t; qs += block) {
    const int64_t len = std::min(block, dims.t - qs);
    torch::Tensor qb = FlatRows(q5, qs, len, dims, ct);
    // Online softmax; the first key chunk is visible to every row, so `m` is
    // finite after it and exp(m_old - m_new) never sees -inf - (-inf).
    torch::Tensor m = torch::full({dims.batch, dims.kv_heads, dims.group * len},
                                  -std::numeric_limits<double>::infinity(), qb.options());
    torch::Tensor l = torch::zeros_like(m);
    torch::Tensor acc = torch::zeros_like(qb);
    const int64_t keys = VisibleKeys(qs, len, dims.t, diagonal);
    for (int64_t ks = 0; ks < keys; ks += block) {
      const int64_t lk = std::min(block, keys - ks);
      torch::Tensor kb = kv[0].narrow(2, ks, lk).to(ct);
      torch::Tensor vb = kv[1].narrow(2, ks, lk).to(ct);
      torch::Tensor s = BlockScores(qb, kb, qs, len, ks, lk, diagonal, scale, dims);
      torch::Tensor m_new = torch::maximum(m, s.amax(-1));
      torch::Tensor alpha = (m - m_new).exp_();
      torch::Tensor p = s.sub_(m_new.unsqueeze(-1)).exp_();
      l.mul_(alpha).add_(p.sum(-1));
      acc.mul_(alpha.unsqueeze(-1)).add_(torch::matmul(p, vb));
      m = m_new;
    }
    out5.narrow(3, qs, len)
        .copy_((acc / l.unsqueeze(-1)).view({dims.batch, dims.kv_heads, dims.group, len, dims.d}));
    lse4.narrow(3, qs, len).copy_((m + l.log()).view({dims.batch, dims.kv_heads, dims.group, len}));
  }
  return {out5, lse4};
}

// Gradient contributions of one K/V block, recomputed from the final lse:
// adds into dq5 ([B, Hkv, G, T, D]) and dkv ([2, B, Hkv, T, D]), both in the
// compute type. `delta4` is rowsum(dO ∘ O) - dlse: the softmax-Jacobian
// correction with the lse output's own gradient folded in (d lse / d s = P).
void BlockBackward(const torch::Tensor& q5, const torch::Tensor& do5, const torch::Tensor& lse4,
                   const torch::Tensor& delta4, const torch::Tensor& kv, bool diagonal,
                   double scale, int64_t block, const Dims& dims, torch::ScalarType ct,
                   torch::Tensor& dq5, torch::Tensor& dkv) {
  for (int64_t qs = 0; qs < dims.t; qs += block) {
    const int64_t len = std::min(block, dims.t - qs);
    torch::Tensor qb = FlatRows(q5, qs, len, dims, ct);
    torch::Tensor dob = FlatRows(do5, qs, len, dims, ct);
    torch::Tensor lseb = FlatRowStats(lse4, qs, len, dims);
    torch::Tensor deltab = FlatRowStats(delta4, qs, len, dims);
    torch::Tensor dqb = torch::zeros_like(qb);
    const int64_t keys = VisibleKeys(qs, len, dims.t, diagonal);
    for (int64_t ks = 0; ks < keys; ks += block) {
      const int64_t lk = std::min(block, keys - ks);
      torch::Tensor kb = kv[0].narrow(2, ks, lk).to(ct);
      torch::Tensor vb = kv[1].narrow(2, ks, lk).to(ct);
      torch::Tensor p =
          BlockScores(qb, kb, qs, len, ks, lk, diagonal, scale, dims).sub_(lseb).exp_();
      dkv[1].narrow(2, ks, lk).add_(torch::matmul(p.transpose(-1, -2), dob));
      torch::Tensor ds = torch::matmul(dob, vb.transpose(-1, -2)).sub_(deltab).mul_(p);
      dqb.add_(torch::matmul(ds, kb));
      dkv[0].narrow(2, ks, lk).add_(torch::matmul(ds.transpose(-1, -2), qb), scale);
    }
    dq5.narrow(3, qs, len)
        .add_(dqb.mul_(scale).view({dims.batch, dims.kv_heads, dims.group, len, dims.d}));
  }
}

// Tags: forward K/V hops use [base, base + cp), backward K/V hops
// [base + cp, base + 2cp), backward dK/dV hops [base + 2cp, base + 3cp).
class RingCausalAttentionFunction final
    : public torch::autograd::Function<RingCausalAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, CommGroup* group, double scale,
                               int64_t block, int64_t tag_base) {
    const int rank = group->getRank();
    const Dims dims = GroupedDimsOf(q, k);
    const torch::ScalarType ct = AttentionComputeType(q.scalar_type());
    torch::Tensor out5 = torch::zeros({dims.batch, dims.kv_heads, dims.group, dims.t, dims.d},
                                      q.options().dtype(ct));
    torch::Tensor lse4 = torch::full({dims.batch, dims.kv_heads, dims.group, dims.t},
                                     -std::numeric_limits<double>::infinity(), out5.options());
    if (dims.t > 0) {
      const torch::Tensor q5 = q.reshape({dims.batch, dims.kv_heads, dims.group, dims.t, dims.d});
      RingForward(group, torch::stack({k, v}), tag_base, [&](const torch::Tensor& kv, int src) {
        // Blocks of later ranks are wholly in the future of every local query.
        if (src > rank) return;
        auto [block_out, block_lse] = BlockForward(q5, kv, src == rank, scale, block, dims, ct);
        // Log-sum-exp merge; the first block (s = 0) is the rank's own,
        // where every row has a finite lse, so the -inf start washes out.
        torch::Tensor merged = torch::logaddexp(lse4, block_lse);
        out5.mul_((lse4 - merged).exp_().unsqueeze(-1))
            .add_(block_out.mul_((block_lse - merged).exp_().unsqueeze(-1)));
        lse4 = merged;
      });
    }
    torch::Tensor out = out5.view(q.sizes()).to(q.scalar_type());
    torch::Tensor lse = lse4.view({dims.batch, dims.q_heads, dims.t});
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["group"] = GroupCapsule(*group);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block"] = block;
    ctx->saved_data["tag_base"] = tag_base;
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3],
                        &lse = saved[4];
    CommGroup& group = GroupFrom(ctx);
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t block = ctx->saved_data["block"].toInt();
    const int64_t tag_base = ctx->saved_data["tag_base"].toInt();
    const int rank = group.getRank();
    const Dims dims = GroupedDimsOf(q, k);
    const torch::ScalarType ct = AttentionComputeType(q.scalar_type());
    const torch::Tensor none;
    if (dims.t == 0) {
      return {
          torch::zeros_like(q), torch::zeros_like(k), torch::zeros_like(v), none, none, none, none};
    }

    auto as5 = [&](const torch::Tensor& x) {
      return x.reshape({dims.batch, dims.kv_heads, dims.group, dims.t, dims.d});
    };
    // Gradients are materialised (zeros for an unused output).
    const torch::Tensor q5 = as5(q), do5 = as5(grad_outputs[0]);
    const torch::Tensor lse4 = lse.view({dims.batch, dims.kv_heads, dims.group, dims.t});
    const torch::Tensor delta4 =
        (do5.to(ct) * as5(out).to(ct)).sum(-1).sub_(grad_outputs[1].to(ct).reshape_as(lse4));
    torch::Tensor dq5 = torch::zeros(q5.sizes(), q.options().dtype(ct));
    const torch::Tensor dkv = RingBackward(
        &group, torch::stack({k, v}), ct, tag_base,
        [&](const torch::Tensor& kv, int src, torch::Tensor& acc) {
          if (src <= rank) {
            BlockBackward(q5, do5, lse4, delta4, kv, src == rank, scale, block, dims, ct, dq5, acc);
          }
        });
    return {dq5.view(q.sizes()).to(q.scalar_type()),
            dkv[0].to(k.scalar_type()),
            dkv[1].to(v.scalar_type()),
            none,
            none,
            none,
            none};
  }
};

// ---------------------------------------------------------------------------
// Ulysses all-to-all.

// Equal-split all-to-all along dim 0 (size = group size): chunk i goes to
// group rank i, and chunk i of the result came from group rank i. Two-byte
// floats travel as bytes (Gloo moves them bit-exactly that way).
torch::Tensor AllToAll(const torch::Tensor& chunks, CommGroup& group) {
  torch::Tensor wire = AsWire(chunks);
  const bool as_bytes = wire.scalar_type() != chunks.scalar_type();
  torch::Tensor out = torch::empty_like(wire);
  if (wire.numel() > 0) {
    std::vector<int64_t> equal_split;
    group.alltoall_base(out, wire, equal_split, equal_split)->wait();
  }
  return as_bytes ? out.view(chunks.scalar_type()) : out;
}

// [B, H, Tl, D] sequence chunk -> [B, H/u, u·Tl, D] head slice.
torch::Tensor SequenceToHeadsRaw(const torch::Tensor& x, CommGroup& group) {
  const int64_t u = group.getSize();
  const int64_t b = x.size(0), h = x.size(1), tl = x.size(2), d = x.size(3);
  torch::Tensor chunks = x.reshape({b, u, h / u, tl, d}).permute({1, 0, 2, 3, 4});
  torch::Tensor received = AllToAll(chunks, group);  // [u (sequence chunk), B, H/u, Tl, D]
  return received.permute({1, 2, 0, 3, 4}).reshape({b, h / u, u * tl, d});
}

// [B, H/u, u·Tl, D] head slice -> [B, H, Tl, D] sequence chunk.
torch::Tensor HeadsToSequenceRaw(const torch::Tensor& x, CommGroup& group) {
  const int64_t u = group.getSize();
  const int64_t b = x.size(0), hl = x.size(1), tl = x.size(2) / u, d = x.size(3);
  torch::Tensor chunks = x.reshape({b, hl, u, tl, d}).permute({2, 0, 1, 3, 4});
  torch::Tensor received = AllToAll(chunks, group);  // [u (head slice), B, H/u, Tl, D]
  return received.permute({1, 0, 2, 3, 4}).reshape({b, u * hl, tl, d});
}

// One autograd function for both directions: the backward of one is the
// other.
class UlyssesAllToAllFunction final : public torch::autograd::Function<UlyssesAllToAllFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, CommGroup* group,
                               bool to_heads) {
    ctx->saved_data["group"] = GroupCapsule(*group);
    ctx->saved_data["to_heads"] = to_heads;
    return to_heads ? SequenceToHeadsRaw(x, *group) : HeadsToSequenceRaw(x, *group);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    CommGroup& group = GroupFrom(ctx);
    const torch::Tensor grad = grad_outputs[0].contiguous();
    torch::Tensor result = ctx->saved_data["to_heads"].toBool() ? HeadsToSequenceRaw(grad, group)
                                                                : SequenceToHeadsRaw(grad, group);
    return {result, torch::Tensor(), torch::Tensor()};
  }
};

// ---------------------------------------------------------------------------
// TTT diagonal merge.

// out = w_r · ring_out + Σ_j w_j · vd_j, where (w_r, w_j) = softmax(ring_lse,
// s_j) and s_j = scale · <q, kd_j> (GQA: query head h reads kv head h / G).
// Computed in fp32 (fp64 for fp64) from the inputs' dtype; only the inputs
// and the merged lse are saved, and backward recomputes the weights, so a
// bf16 step keeps no fp32 copies alive. Backward, with G = dout and
// c = <G, out>: d ring_out = w_r G; d vd_j = Σ_group w_j G; d ring_lse =
// w_r (<G, ring_out> - c); d s_j = w_j (<G, vd_j> - c); dq = scale Σ_j d s_j
// kd_j; d kd_j = scale Σ_group d s_j q.
class DiagonalMergeFunction final : public torch::autograd::Function<DiagonalMergeFunction> {
 public:
  // Shapes in the compute type: q5, out5 [B, Hkv, G, T, D]; lse4 [B, Hkv, G,
  // T]; kd6, vd6 [S, B, Hkv, 1, T, D]; scores and weights [S, B, Hkv, G, T].
  struct Parts {
    torch::Tensor q5, out5, ring_lse4, kd6, vd6, scores, lse;
  };

  static Parts Expand(const torch::Tensor& q, const torch::Tensor& ring_out,
                      const torch::Tensor& ring_lse, const torch::Tensor& kd,
                      const torch::Tensor& vd, double scale) {
    const int64_t b = q.size(0), hq = q.size(1), hkv = kd.size(2), t = q.size(2), d = q.size(3);
    const int64_t g = hq / hkv;
    const torch::ScalarType ct = AttentionComputeType(q.scalar_type());
    Parts p;
    p.q5 = q.to(ct).reshape({b, hkv, g, t, d});
    p.out5 = ring_out.to(ct).reshape({b, hkv, g, t, d});
    p.ring_lse4 = ring_lse.to(ct).reshape({b, hkv, g, t});
    p.kd6 = kd.to(ct).unsqueeze(3);
    p.vd6 = vd.to(ct).unsqueeze(3);
    p.scores = (p.q5.unsqueeze(0) * p.kd6).sum(-1).mul_(scale);
    p.lse = torch::logsumexp(torch::cat({p.ring_lse4.unsqueeze(0), p.scores}, 0), 0);
    return p;
  }

  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& ring_out, const torch::Tensor& ring_lse,
                               const torch::Tensor& kd, const torch::Tensor& vd, double scale) {
    torch::NoGradGuard no_grad;
    Parts p = Expand(q, ring_out, ring_lse, kd, vd, scale);
    torch::Tensor out = p.out5 * (p.ring_lse4 - p.lse).exp_().unsqueeze(-1);
    out += ((p.scores - p.lse).exp_().unsqueeze(-1) * p.vd6).sum(0);
    ctx->save_for_backward({q, ring_out, ring_lse, kd, vd});
    ctx->saved_data["scale"] = scale;
    return out.reshape(q.sizes()).to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    torch::NoGradGuard no_grad;
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &ring_out = saved[1], &ring_lse = saved[2], &kd = saved[3],
                        &vd = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    Parts p = Expand(q, ring_out, ring_lse, kd, vd, scale);
    const torch::Tensor grad = grad_outputs[0].to(p.q5.scalar_type()).reshape(p.q5.sizes());
    torch::Tensor w_ring = (p.ring_lse4 - p.lse).exp_();           // [B, Hkv, G, T]
    torch::Tensor w_diag = (p.scores - p.lse).exp_();              // [S, B, Hkv, G, T]
    torch::Tensor g_ring = (grad * p.out5).sum(-1);                // <G, ring_out>
    torch::Tensor g_diag = (grad.unsqueeze(0) * p.vd6).sum(-1);    // <G, vd_j>
    torch::Tensor c = w_ring * g_ring + (w_diag * g_diag).sum(0);  // <G, out>
    torch::Tensor d_out = grad * w_ring.unsqueeze(-1);
    torch::Tensor d_lse = w_ring * (g_ring - c);
    torch::Tensor d_scores = (w_diag * (g_diag - c.unsqueeze(0))).mul_(scale);
    torch::Tensor d_q = (d_scores.unsqueeze(-1) * p.kd6).sum(0);
    torch::Tensor d_kd = (d_scores.unsqueeze(-1) * p.q5.unsqueeze(0)).sum(3);
    torch::Tensor d_vd = (w_diag.unsqueeze(-1) * grad.unsqueeze(0)).sum(3);
    return {d_q.reshape(q.sizes()).to(q.scalar_type()),
            d_out.reshape(ring_out.sizes()).to(ring_out.scalar_type()),
            d_lse.reshape(ring_lse.sizes()).to(ring_lse.scalar_type()),
            d_kd.to(kd.scalar_type()),
            d_vd.to(vd.scalar_type()),
            torch::Tensor()};
  }
};

}  // namespace

int64_t PaddedShardLength(int64_t total_length, int64_t cp_size) {
  TORCH_CHECK(total_length >= 0, "PaddedShardLength: negative length ", total_length);
  TORCH_CHECK(cp_size >= 1, "PaddedShardLength: cp_size must be >= 1, got ", cp_size);
  return (total_length + cp_size - 1) / cp_size;
}

CpShard ShardRange(int64_t total_length, int64_t cp_size, int64_t cp_rank) {
  TORCH_CHECK(cp_rank >= 0 && cp_rank < cp_size, "ShardRange: cp_rank ", cp_rank,
              " must be in [0, ", cp_size, ")");
  CpShard shard;
  shard.padded_length = PaddedShardLength(total_length, cp_size);
  shard.begin = cp_rank * shard.padded_length;
  shard.length = std::clamp(total_length - shard.begin, int64_t{0}, shard.padded_length);
  return shard;
}

torch::Tensor ShardSequence(const torch::Tensor& full, int64_t dim, int64_t cp_size,
                            int64_t cp_rank) {
  TORCH_CHECK(full.dim() > 0, "ShardSequence: a scalar has no sequence dim");
  dim = c10::maybe_wrap_dim(dim, full.dim());
  const CpShard shard = ShardRange(full.size(dim), cp_size, cp_rank);
  torch::Tensor real = full.narrow(dim, std::min(shard.begin, full.size(dim)), shard.length);
  if (shard.length == shard.padded_length) return real.contiguous();
  std::vector<int64_t> pad_shape = full.sizes().vec();
  pad_shape[dim] = shard.padded_length - shard.length;
  return torch::cat({real, torch::zeros(pad_shape, full.options())}, dim);
}

torch::Tensor ShardValidMask(int64_t total_length, int64_t cp_size, int64_t cp_rank,
                             torch::Device device) {
  const CpShard shard = ShardRange(total_length, cp_size, cp_rank);
  return torch::arange(shard.padded_length, torch::TensorOptions(torch::kInt64).device(device)) <
         shard.length;
}

torch::Tensor SequenceAllGather(const torch::Tensor& local, CommGroup& cp_group) {
  TORCH_CHECK(local.dim() >= 2, "SequenceAllGather: expected [B, Tpad, ...], got ", local.sizes());
  return SequenceAllGatherFunction::apply(local, &cp_group);
}

RingAttentionOutput RingCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, CommGroup& cp_group,
                                        const RingAttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4, "RingCausalAttention: q must be [B, Hq, Tpad, D], got ", q.sizes());
  TORCH_CHECK(k.dim() == 4 && k.sizes() == v.sizes(),
              "RingCausalAttention: k and v must both be [B, Hkv, Tpad, D], got ", k.sizes(),
              " and ", v.sizes());
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3),
              "RingCausalAttention: k ", k.sizes(), " does not match q ", q.sizes());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "RingCausalAttention: Hq (", q.size(1),
              ") must be a multiple of Hkv (", k.size(1), ")");
  TORCH_CHECK(options.block_size > 0, "RingCausalAttention: block_size must be positive");
  TORCH_CHECK(options.tag_base >= 0, "RingCausalAttention: tag_base must be >= 0");
  TORCH_CHECK(at::isFloatingType(q.scalar_type()) && k.scalar_type() == q.scalar_type() &&
                  v.scalar_type() == q.scalar_type(),
              "RingCausalAttention: q, k and v must share a floating dtype");
  variable_list outputs = RingCausalAttentionFunction::apply(
      q, k, v, &cp_group, options.scale, options.block_size, int64_t{options.tag_base});
  return RingAttentionOutput{outputs[0], outputs[1]};
}

absl::Status ValidateCpLayout(const CpLayout& layout, int64_t q_heads, int64_t kv_heads) {
  if (layout.cp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.cp_size must be >= 1, got ", layout.cp_size));
  }
  if (layout.world_size % layout.cp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.cp_size ", layout.cp_size, " does not divide the world of ",
                     layout.world_size, " ranks (world = data-parallel size x cp_size)"));
  }
  if (layout.ulysses < 1 || layout.cp_size % layout.ulysses != 0) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.ulysses_degree ", layout.ulysses,
                                                   " must divide cp_size ", layout.cp_size));
  }
  if (q_heads % layout.ulysses != 0 || kv_heads % layout.ulysses != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.ulysses_degree ", layout.ulysses, " must divide the draft's attention heads (",
        q_heads, " query, ", kv_heads, " key/value): Ulysses gives each rank a slice of heads"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CpGroups> CreateCpGroups(const CpLayout& layout,
                                        const c10::intrusive_ptr<c10d::Store>& store,
                                        const std::string& host,
                                        std::chrono::milliseconds join_timeout,
                                        torch::Device device) {
  CpGroups groups;
  if (layout.cp_size == 1) return groups;
  if (!store) return absl::InvalidArgumentError("context parallelism needs the rendezvous store");
  auto create = [&](const std::string& prefix, int rank,
                    int size) -> absl::StatusOr<c10::intrusive_ptr<CommGroup>> {
    RendezvousOptions options;
    options.rank = rank;
    options.world_size = size;
    options.local_addr = host;
    options.join_timeout = join_timeout;
    return CreateDeviceGroup(options, c10::make_intrusive<c10d::PrefixStore>(prefix, store),
                             device);
  };
  // Group names are unique per (kind, dp rank, index), so each member set
  // meets under its own prefix of the shared store.
  if (layout.ulysses > 1) {
    auto group = create(absl::StrCat("cp/ulysses/", layout.dp_rank(), "/", layout.ring_rank()),
                        layout.ulysses_rank(), layout.ulysses);
    if (!group.ok()) return group.status();
    groups.ulysses = *group;
  }
  if (layout.ring_size() > 1) {
    auto group = create(absl::StrCat("cp/ring/", layout.dp_rank(), "/", layout.ulysses_rank()),
                        layout.ring_rank(), layout.ring_size());
    if (!group.ok()) return group.status();
    groups.ring = *group;
  }
  if (layout.ulysses == 1) {
    groups.cp = groups.ring;
  } else if (layout.ring_size() == 1) {
    groups.cp = groups.ulysses;
  } else {
    auto group =
        create(absl::StrCat("cp/all/", layout.dp_rank()), layout.cp_rank(), layout.cp_size);
    if (!group.ok()) return group.status();
    groups.cp = *group;
  }
  return groups;
}

torch::Tensor SequenceToHeads(const torch::Tensor& x, CommGroup& group) {
  TORCH_CHECK(x.dim() == 4, "SequenceToHeads: expected [B, H, Tl, D], got ", x.sizes());
  TORCH_CHECK(x.size(1) % group.getSize() == 0, "SequenceToHeads: ", x.size(1),
              " heads are not divisible by the Ulysses degree ", group.getSize());
  return UlyssesAllToAllFunction::apply(x, &group, true);
}

torch::Tensor HeadsToSequence(const torch::Tensor& x, CommGroup& group) {
  TORCH_CHECK(x.dim() == 4, "HeadsToSequence: expected [B, H/u, u*Tl, D], got ", x.sizes());
  TORCH_CHECK(x.size(2) % group.getSize() == 0, "HeadsToSequence: ", x.size(2),
              " rows are not divisible by the Ulysses degree ", group.getSize());
  return UlyssesAllToAllFunction::apply(x, &group, false);
}

torch::Tensor RingTttAttention(const torch::Tensor& q, const torch::Tensor& k0,
                               const torch::Tensor& v0, const torch::Tensor& kd,
                               const torch::Tensor& vd, CommGroup& ring_group,
                               const RingAttentionOptions& options) {
  RingAttentionOutput ring = RingCausalAttention(q, k0, v0, ring_group, options);
  if (!kd.defined() || kd.size(0) == 0) return ring.out;
  TORCH_CHECK(kd.dim() == 5 && kd.sizes() == vd.sizes() && kd.size(1) == k0.size(0) &&
                  kd.size(2) == k0.size(1) && kd.size(3) == k0.size(2) && kd.size(4) == k0.size(3),
              "RingTttAttention: kd and vd must be [S, B, Hkv, Tpad, D] matching k0 ", k0.sizes(),
              ", got ", kd.sizes(), " and ", vd.sizes());
  return DiagonalMergeFunction::apply(q, ring.out, ring.lse, kd, vd, options.scale);
}

}  // namespace specstream::student
