#include "student/ttt_attention.h"

#include <algorithm>
#include <limits>

#include "student/blockwise_attention.h"

namespace specstream::student {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The grouped-query layout of student/blockwise_attention.h, and the number
// of diagonal steps (kd's first dimension; 0 without them).
struct Dims : GroupedDims {
  int64_t steps;
};

class TttAttentionFunction final : public torch::autograd::Function<TttAttentionFunction> {
 public:
  // kd/vd are absent when there are no diagonal steps (optional: autograd
  // then treats them as non-tensor arguments and expects no gradient).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k0, const torch::Tensor& v0,
                               const c10::optional<torch::Tensor>& kd_opt,
                               const c10::optional<torch::Tensor>& vd_opt, double scale,
                               int64_t block) {
    const torch::Tensor kd = kd_opt.value_or(torch::Tensor());
    const torch::Tensor vd = vd_opt.value_or(torch::Tensor());
    const Dims dims = DimsOf(q, k0, kd);
    const torch::ScalarType ct = AttentionComputeType(q.scalar_type());
    const torch::Tensor q5 = q.reshape({dims.batch, dims.kv_heads, dims.group, dims.t, dims.d});
    torch::Tensor out = torch::empty_like(q, torch::MemoryFormat::Contiguous);
    torch::Tensor lse = torch::empty({dims.batch, dims.q_heads, dims.t}, q.options().dtype(ct));
    torch::Tensor out5 = out.view({dims.batch, dims.kv_heads, dims.group, dims.t, dims.d});
    torch::Tensor lse4 = lse.view({dims.batch, dims.kv_heads, dims.group, dims.t});

    for (int64_t qs = 0; qs < dims.t; qs += block) {
      const int64_t len = std::min(block, dims.t - qs);
      const int64_t rows = dims.group * len;
      torch::Tensor qb = FlatRows(q5, qs, len, dims, ct);
      // Online softmax state per query row. Key 0 is visible to every row and
      // sits in the first key block, so `m` is finite after that block and
      // exp(m_old - m_new) never sees -inf - (-inf).
      torch::Tensor m = torch::full({dims.batch, dims.kv_heads, rows},
                                    -std::numeric_limits<double>::infinity(), qb.options());
      torch::Tensor l = torch::zeros_like(m);
      torch::Tensor acc = torch::zeros_like(qb);
      auto update = [&](const torch::Tensor& s) {  // returns P relative to the new max
        torch::Tensor m_new = torch::maximum(m, s.amax(-1));
        torch::Tensor alpha = (m - m_new).exp_();
        torch::Tensor p = (s - m_new.unsqueeze(-1)).exp_();
        l.mul_(alpha).add_(p.sum(-1));
        acc.mul_(alpha.unsqueeze(-1));
        m = m_new;
        return p;
      };

      for (int64_t ks = 0; ks < qs + len; ks += block) {
        const int64_t lk = std::min(block, qs + len - ks);
        torch::Tensor kb = k0.narrow(2, ks, lk).to(ct);
        torch::Tensor vb = v0.narrow(2, ks, lk).to(ct);
        torch::Tensor p = update(CausalBlockScores(qb, kb, qs, len, ks, lk, scale, dims));
        acc.add_(torch::matmul(p, vb));
      }
      if (dims.steps > 0) {
        // Diagonals: row (g, t) sees kd[s, t] for every step s; [B, Hkv, G, L, S].
        torch::Tensor q5b = qb.view({dims.batch, dims.kv_heads, dims.group, len, dims.d});
        torch::Tensor kdb = kd.narrow(3, qs, len).to(ct);
        torch::Tensor vdb = vd.narrow(3, qs, len).to(ct);
        torch::Tensor sd = torch::einsum("bhgld,sbhld->bhgls", {q5b, kdb}).mul_(scale);
        torch::Tensor pd = update(sd.reshape({dims.batch, dims.kv_heads, rows, dims.steps}));
        pd = pd.view({dims.batch, dims.kv_heads, dims.group, len, dims.steps});
        acc.add_(torch::einsum("bhgls,sbhld->bhgld", {pd, vdb}).reshape_as(acc));
      }
      out5.narrow(3, qs, len)
          .copy_(
              (acc / l.unsqueeze(-1)).view({dims.batch, dims.kv_heads, dims.group, len, dims.d}));
      lse4.narrow(3, qs, len)
          .copy_((m + l.log()).view({dims.batch, dims.kv_heads, dims.group, len}));
    }

    ctx->save_for_backward({q, k0, v0, kd, vd, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block"] = block;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k0 = saved[1], &v0 = saved[2], &kd = saved[3],
                        &vd = saved[4], &out = saved[5], &lse = saved[6];
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t block = ctx->saved_data["block"].toInt();
    const Dims dims = DimsOf(q, k0, kd);
    const torch::ScalarType ct = AttentionComputeType(q.scalar_type());
    const bool need_q = ctx->needs_input_grad(0);
    const bool need_k0 = ctx->needs_input_grad(1);
    const bool need_v0 = ctx->needs_input_grad(2);
    const bool need_kd = dims.steps > 0 && ctx->needs_input_grad(3);
    const bool need_vd = dims.steps > 0 && ctx->needs_input_grad(4);
    // dS is needed by every gradient except the values'.
    const bool need_ds = need_q || need_k0 || need_kd;

    auto as5 = [&](const torch::Tensor& x) {
      return x.reshape({dims.batch, dims.kv_heads, dims.group, dims.t, dims.d});
    };
    const torch::Tensor q5 = as5(q), out5 = as5(out), do5 = as5(grad_outputs[0]);
    const torch::Tensor lse4 = lse.view({dims.batch, dims.kv_heads, dims.group, dims.t});

    torch::Tensor dq, dq5, dk0, dv0, dkd, dvd;
    if (need_q) {
      dq = torch::empty_like(q, torch::MemoryFormat::Contiguous);
      dq5 = as5(dq);
    }
    // Every query block touches the step-0 keys at or before it, so these
    // accumulate in the compute type across blocks.
    if (need_k0) dk0 = torch::zeros(k0.sizes(), k0.options().dtype(ct));
    if (need_v0) dv0 = torch::zeros(v0.sizes(), v0.options().dtype(ct));
    // A diagonal key is seen only by its own position: each block is written once.
    if (need_kd) dkd = torch::empty(kd.sizes(), kd.options());
    if (need_vd) dvd = torch::empty(vd.sizes(), vd.options());

    for (int64_t qs = 0; qs < dims.t; qs += block) {
      const int64_t len = std::min(block, dims.t - qs);
      torch::Tensor qb = FlatRows(q5, qs, len, dims, ct);
      torch::Tensor dob = FlatRows(do5, qs, len, dims, ct);
      torch::Tensor lseb = FlatRowStats(lse4, qs, len, dims);
      // Δ = rowsum(dO ∘ O), the softmax-Jacobian correction.
      torch::Tensor delta;
      if (need_ds) delta = (dob * FlatRows(out5, qs, len, dims, ct)).sum(-1, /*keepdim=*/true);
      torch::Tensor dqb;
      if (need_q) dqb = torch::zeros_like(qb);

      for (int64_t ks = 0; ks < qs + len; ks += block) {
        const int64_t lk = std::min(block, qs + len - ks);
        torch::Tensor kb = k0.narrow(2, ks, lk).to(ct);
        torch::Tensor p = CausalBlockScores(qb, kb, qs, len, ks, lk, scale, dims).sub_(lseb).exp_();
        if (need_v0) dv0.narrow(2, ks, lk).add_(torch::matmul(p.transpose(-1, -2), dob));
        if (!need_ds) continue;
        torch::Tensor vb = v0.narrow(2, ks, lk).to(ct);
        torch::Tensor ds = torch::matmul(dob, vb.transpose(-1, -2)).sub_(delta).mul_(p);
        if (need_q) dqb.add_(torch::matmul(ds, kb));
        if (need_k0) dk0.narrow(2, ks, lk).add_(torch::matmul(ds.transpose(-1, -2), qb), scale);
      }
      if (dims.steps > 0 && (need_ds || need_vd)) {
        const std::vector<int64_t> shape5 = {dims.batch, dims.kv_heads, dims.group, len, dims.d};
        const std::vector<int64_t> stat5 = {dims.batch, dims.kv_heads, dims.group, len, 1};
        torch::Tensor q5b = qb.view(shape5);
        torch::Tensor do5b = dob.view(shape5);
        torch::Tensor kdb = kd.narrow(3, qs, len).to(ct);
        torch::Tensor pd = torch::einsum("bhgld,sbhld->bhgls", {q5b, kdb})
                               .mul_(scale)
                               .sub_(lseb.view(stat5))
                               .exp_();
        // Sums over g: the query heads sharing a kv head.
        if (need_vd) dvd.narrow(3, qs, len).copy_(torch::einsum("bhgls,bhgld->sbhld", {pd, do5b}));
        if (need_ds) {
          torch::Tensor vdb = vd.narrow(3, qs, len).to(ct);
          torch::Tensor dsd =
              torch::einsum("bhgld,sbhld->bhgls", {do5b, vdb}).sub_(delta.view(stat5)).mul_(pd);
          if (need_q) dqb.add_(torch::einsum("bhgls,sbhld->bhgld", {dsd, kdb}).reshape_as(dqb));
          if (need_kd) {
            dkd.narrow(3, qs, len)
                .copy_(torch::einsum("bhgls,bhgld->sbhld", {dsd, q5b}).mul_(scale));
          }
        }
      }
      if (need_q)
        dq5.narrow(3, qs, len)
            .copy_(dqb.mul_(scale).view({dims.batch, dims.kv_heads, dims.group, len, dims.d}));
    }

    if (need_k0) dk0 = dk0.to(k0.scalar_type());
    if (need_v0) dv0 = dv0.to(v0.scalar_type());
    // One gradient per forward argument, scale and block included.
    return {dq, dk0, dv0, dkd, dvd, torch::Tensor(), torch::Tensor()};
  }

 private:
  static Dims DimsOf(const torch::Tensor& q, const torch::Tensor& k0, const torch::Tensor& kd) {
    return Dims{GroupedDimsOf(q, k0), kd.defined() ? kd.size(0) : 0};
  }
};

}  // namespace

torch::Tensor TttAttention(const torch::Tensor& q, const torch::Tensor& k0, const torch::Tensor& v0,
                           const torch::Tensor& kd, const torch::Tensor& vd,
                           const TttAttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4, "TttAttention: q must be [B, Hq, T, D], got ", q.sizes());
  TORCH_CHECK(k0.dim() == 4 && k0.sizes() == v0.sizes(),
              "TttAttention: k0 and v0 must both be [B, Hkv, T, D], got ", k0.sizes(), " and ",
              v0.sizes());
  const int64_t batch = q.size(0), q_heads = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t kv_heads = k0.size(1);
  TORCH_CHECK(k0.size(0) == batch && k0.size(2) == t && k0.size(3) == d, "TttAttention: k0 ",
              k0.sizes(), " does not match q ", q.sizes());
  TORCH_CHECK(kv_heads > 0 && q_heads % kv_heads == 0, "TttAttention: Hq (", q_heads,
              ") must be a multiple of Hkv (", kv_heads, ")");
  TORCH_CHECK(options.block_size > 0, "TttAttention: block_size must be positive");
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), "TttAttention: q must be floating point");
  TORCH_CHECK(k0.scalar_type() == q.scalar_type() && v0.scalar_type() == q.scalar_type(),
              "TttAttention: q, k0 and v0 must share a dtype");
  TORCH_CHECK(kd.defined() == vd.defined(), "TttAttention: kd and vd must both be given or not");
  const bool has_steps = kd.defined() && kd.numel() > 0;
  if (kd.defined()) {
    TORCH_CHECK(kd.dim() == 5 && kd.sizes() == vd.sizes(),
                "TttAttention: kd and vd must both be [S, B, Hkv, T, D], got ", kd.sizes(), " and ",
                vd.sizes());
    TORCH_CHECK(kd.size(1) == batch && kd.size(2) == kv_heads && kd.size(3) == t && kd.size(4) == d,
                "TttAttention: kd ", kd.sizes(), " does not match k0 ", k0.sizes());
    TORCH_CHECK(
        !has_steps || (kd.scalar_type() == q.scalar_type() && vd.scalar_type() == q.scalar_type()),
        "TttAttention: kd and vd must share q's dtype");
  }
  // S = 0 (or an empty batch) goes through as absent tensors: nothing to
  // attend to and no gradient to return.
  using OptionalTensor = c10::optional<torch::Tensor>;
  return TttAttentionFunction::apply(q, k0, v0, has_steps ? OptionalTensor(kd) : c10::nullopt,
                                     has_steps ? OptionalTensor(vd) : c10::nullopt, options.scale,
                                     options.block_size);
}

}  // namespace specstream::student
