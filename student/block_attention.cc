#include "student/block_attention.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "student/blockwise_attention.h"
#include "student/ring_hop.h"

namespace specstream::student {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The grouped-query layout of student/blockwise_attention.h, with the T
// query rows cut into N = T / bs blocks: q is viewed as [B, Hkv, G, N, bs, D],
// and a chunk of nc blocks is flattened to [B, Hkv, G·nc·bs, D]. `context`
// is the context keys' length.
struct Dims : GroupedDims {
  int64_t blocks, bs, context;
};

Dims DimsOf(const torch::Tensor& q, const torch::Tensor& kc, int64_t block_size) {
  const GroupedDims grouped = GroupedDimsOf(q, kc);
  return Dims{grouped, grouped.t / block_size, block_size, kc.size(2)};
}

// One chunk of blocks [j0, j0 + nc): its largest and smallest context limit.
struct Chunk {
  int64_t j0, nc, max_limit, min_limit;
};

std::vector<Chunk> Chunks(const Dims& dims, const torch::Tensor& limit, int64_t query_rows) {
  const int64_t per_chunk = std::max<int64_t>(1, query_rows / std::max<int64_t>(1, dims.bs));
  const auto lim = limit.accessor<int64_t, 2>();
  std::vector<Chunk> chunks;
  for (int64_t j0 = 0; j0 < dims.blocks; j0 += per_chunk) {
    Chunk c{j0, std::min(per_chunk, dims.blocks - j0), 0, std::numeric_limits<int64_t>::max()};
    for (int64_t b = 0; b < dims.batch; ++b) {
      for (int64_t j = j0; j < j0 + c.nc; ++j) {
        c.max_limit = std::max(c.max_limit, lim[b][j]);
        c.min_limit = std::min(c.min_limit, lim[b][j]);
      }
    }
    if (dims.batch == 0) c.min_limit = 0;
    chunks.push_back(c);
  }
  return chunks;
}

// Context scores of a flattened query chunk against keys [ks, ks + lk),
// scaled, with keys at or past each block's limit hidden: [B, Hkv, rows, lk].
torch::Tensor ContextScores(const torch::Tensor& qf, const torch::Tensor& kcb,
                            const torch::Tensor& chunk_limit, const Chunk& c, int64_t ks,
                            int64_t lk, double scale, const Dims& dims) {
  torch::Tensor s = torch::matmul(qf, kcb.transpose(-1, -2)).mul_(scale);
  if (ks + lk > c.min_limit) {
    torch::Tensor keys = torch::arange(ks, ks + lk, chunk_limit.options());
    torch::Tensor hidden = keys.view({1, 1, lk}) >= chunk_limit.unsqueeze(-1);  // [B, nc, lk]
    s.view({dims.batch, dims.kv_heads, dims.group, c.nc, dims.bs, lk})
        .masked_fill_(hidden.view({dims.batch, 1, 1, c.nc, 1, lk}),
                      -std::numeric_limits<double>::infinity());
  }
  return s;
}

// The running softmax of one chunk of query rows: max, sum and the
// unnormalised output, all [B, Hkv, rows(, D)] in the compute type.
struct ChunkState {
  torch::Tensor m, l, acc;
};

// Where the context keys a pass reads sit: rows [0, length) of k and v
// ([B, Hkv, length, D]) hold global positions [offset, offset + length).
struct KeySpan {
  const torch::Tensor& k;
  const torch::Tensor& v;
  int64_t offset, length;
};

// The keys of `span` below each chunk's largest limit, merged into the
// chunks' running softmax in key blocks of `key_block`.
// `q5` is the queries as [B, Hkv, G, T, D].
void ContextForward(const torch::Tensor& q5, const KeySpan& span, const std::vector<Chunk>& chunks,
                    const torch::Tensor& limit_dev, double scale, int64_t key_block,
                    const Dims& dims, torch::ScalarType ct, std::vector<ChunkState>& states) {
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const Chunk& c = chunks[ci];
    const int64_t end = std::min(span.offset + span.length, c.max_limit);
    if (end <= span.offset) continue;
    torch::Tensor qf = FlatRows(q5, c.j0 * dims.bs, c.nc * dims.bs, dims, ct);
    const torch::Tensor chunk_limit = limit_dev.narrow(1, c.j0, c.nc);
    ChunkState& st = states[ci];
    for (int64_t ks = span.offset; ks < end; ks += key_block) {
      const int64_t lk = std::min(key_block, end - ks);
      torch::Tensor kcb = span.k.narrow(2, ks - span.offset, lk).to(ct);
      torch::Tensor vcb = span.v.narrow(2, ks - span.offset, lk).to(ct);
      torch::Tensor s = ContextScores(qf, kcb, chunk_limit, c, ks, lk, scale, dims);
      torch::Tensor m_new = torch::maximum(st.m, s.amax(-1));
      torch::Tensor alpha = (st.m - m_new).exp_();
      torch::Tensor pc = (s - m_new.unsqueeze(-1)).exp_();
      st.l.mul_(alpha).add_(pc.sum(-1));
      st.acc.mul_(alpha.unsqueeze(-1)).add_(torch::matmul(pc, vcb));
      st.m.copy_(m_new);
    }
  }
}

// Per chunk, what the backward's context passes read and accumulate.
struct ChunkGrad {
  torch::Tensor qf, dof, lsef, deltaf, dq;  // dq: [B, Hkv, rows, D], unscaled
};

// The gradients of the keys of `span` (into dkv, [2, B, Hkv, length, D] in
// the compute type) and of the chunks' queries (into each ChunkGrad::dq).
void ContextBackward(const KeySpan& span, const std::vector<Chunk>& chunks,
                     const torch::Tensor& limit_dev, double scale, int64_t key_block,
                     const Dims& dims, torch::ScalarType ct, std::vector<ChunkGrad>& grads,
                     torch::Tensor& dkv) {
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const Chunk& c = chunks[ci];
    const int64_t end = std::min(span.offset + span.length, c.max_limit);
    if (end <= span.offset) continue;
    ChunkGrad& g = grads[ci];
    const torch::Tensor chunk_limit = limit_dev.narrow(1, c.j0, c.nc);
    for (int64_t ks = span.offset; ks < end; ks += key_block) {
      const int64_t lk = std::min(key_block, end - ks), at = ks - span.offset;
      torch::Tensor kcb = span.k.narrow(2, at, lk).to(ct);
      torch::Tensor vcb = span.v.narrow(2, at, lk).to(ct);
      torch::Tensor p =
          ContextScores(g.qf, kcb, chunk_limit, c, ks, lk, scale, dims).sub_(g.lsef).exp_();
      dkv[1].narrow(2, at, lk).add_(torch::matmul(p.transpose(-1, -2), g.dof));
      torch::Tensor ds = torch::matmul(g.dof, vcb.transpose(-1, -2)).sub_(g.deltaf).mul_(p);
      g.dq.add_(torch::matmul(ds, kcb));
      dkv[0].narrow(2, at, lk).add_(torch::matmul(ds.transpose(-1, -2), g.qf), scale);
    }
  }
}

// Per-chunk tensors that travel as one flat buffer: each chunk's parts, in
// order, are views into it (so in-place updates land in the buffer).
// `widths` gives each part's trailing size per row (1: [B, Hkv, rows];
// D: [B, Hkv, rows, D]).
torch::Tensor ZerosPacked(const std::vector<Chunk>& chunks, const Dims& dims,
                          const std::vector<int64_t>& widths, const torch::TensorOptions& options) {
  int64_t total = 0;
  for (const Chunk& c : chunks) {
    for (int64_t w : widths) total += dims.batch * dims.kv_heads * dims.group * c.nc * dims.bs * w;
  }
  return torch::zeros({total}, options);
}

std::vector<std::vector<torch::Tensor>> Unpack(const torch::Tensor& flat,
                                               const std::vector<Chunk>& chunks, const Dims& dims,
                                               const std::vector<int64_t>& widths) {
  std::vector<std::vector<torch::Tensor>> parts;
  int64_t at = 0;
  for (const Chunk& c : chunks) {
    const int64_t rows = dims.group * c.nc * dims.bs;
    std::vector<torch::Tensor> chunk;
    for (int64_t w : widths) {
      const int64_t n = dims.batch * dims.kv_heads * rows * w;
      torch::Tensor part = flat.narrow(0, at, n);
      chunk.push_back(w == 1 ? part.view({dims.batch, dims.kv_heads, rows})
                             : part.view({dims.batch, dims.kv_heads, rows, w}));
      at += n;
    }
    parts.push_back(std::move(chunk));
  }
  return parts;
}

// The tensors of one hop round the ring: sent to the next rank while the
// previous rank's arrive (empty parts stay).
std::vector<torch::Tensor> HopAll(CommGroup& group, const std::vector<torch::Tensor>& out,
                                  int64_t tag) {
  std::vector<torch::Tensor> in;
  std::vector<std::unique_ptr<RingHop>> hops;
  for (size_t i = 0; i < out.size(); ++i) {
    in.push_back(torch::empty_like(out[i]));
    hops.push_back(std::make_unique<RingHop>(group, out[i], in.back(),
                                             static_cast<int>(tag + static_cast<int64_t>(i))));
  }
  for (auto& hop : hops) hop->Wait();
  return in;
}

// Without a group the context is local (offset 0). With one, each rank
// holds a shard of `length` keys at offset rank·length, and the QUERIES go
// round the ring, not the keys: a block draft has few query rows and a long
// context, so each rank's blocks visit every shard with their running
// softmax (backward: with dO, the logsumexp, Δ and the dQ accumulator),
// while the keys, values and their fp32 gradients stay with their owner.
// After cp hops a package is home again. The ring's memory is then a few
// query packages, whatever the context length. Tags: forward hop s uses
// [tag_base + 3s, tag_base + 3s + 3), backward hop s [tag_base + 3cp + 5s,
// tag_base + 3cp + 5s + 5).
class BlockAttentionFunction final : public torch::autograd::Function<BlockAttentionFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& kc, const torch::Tensor& vc,
                               const torch::Tensor& kb, const torch::Tensor& vb,
                               const torch::Tensor& limit, int64_t block_size, double scale,
                               int64_t query_rows, int64_t key_block, CommGroup* group,
                               int64_t tag_base) {
    const Dims dims = DimsOf(q, kc, block_size);
    const torch::ScalarType ct = AttentionComputeType(q.scalar_type());
    const std::vector<int64_t> q6_shape = {dims.batch,  dims.kv_heads, dims.group,
                                           dims.blocks, dims.bs,       dims.d};
    const std::vector<int64_t> q5_shape = {dims.batch, dims.kv_heads, dims.group, dims.t, dims.d};
    const torch::Tensor q6 = q.reshape(q6_shape);
    const torch::Tensor kb5 = kb.reshape({dims.batch, dims.kv_heads, dims.blocks, dims.bs, dims.d});
    const torch::Tensor vb5 = vb.reshape({dims.batch, dims.kv_heads, dims.blocks, dims.bs, dims.d});
    const std::vector<Chunk> chunks = Chunks(dims, limit, query_rows);
    // Per chunk: running max, sum and unnormalised output.
    const std::vector<int64_t> widths = {1, 1, dims.d};
    auto states_of = [&](const torch::Tensor& flat, const std::vector<Chunk>& at) {
      std::vector<ChunkState> states;
      for (auto& part : Unpack(flat, at, dims, widths))
        states.push_back({part[0], part[1], part[2]});
      return states;
    };

    // Own block first: every row sees it, so the running max is finite
    // before any (possibly fully hidden) context block.
    torch::Tensor packed = ZerosPacked(chunks, dims, widths, q.options().dtype(ct));
    {
      std::vector<ChunkState> states = states_of(packed, chunks);
      for (size_t ci = 0; ci < chunks.size(); ++ci) {
        const Chunk& c = chunks[ci];
        torch::Tensor qc = q6.narrow(3, c.j0, c.nc).to(ct);
        torch::Tensor kbc = kb5.narrow(2, c.j0, c.nc).to(ct);
        torch::Tensor vbc = vb5.narrow(2, c.j0, c.nc).to(ct);
        torch::Tensor sb = torch::einsum("bhgnid,bhnjd->bhgnij", {qc, kbc}).mul_(scale);
        torch::Tensor m = std::get<0>(sb.max(-1));
        torch::Tensor p = (sb - m.unsqueeze(-1)).exp_();
        states[ci].m.copy_(m.reshape_as(states[ci].m));
        states[ci].l.copy_(p.sum(-1).reshape_as(states[ci].l));
        states[ci].acc.copy_(
            torch::einsum("bhgnij,bhnjd->bhgnid", {p, vbc}).reshape_as(states[ci].acc));
      }
    }

    // The context: this rank's blocks (hop 0), then each other rank's,
    // against the local shard.
    const int rank = group != nullptr ? group->getRank() : 0;
    const int cp = group != nullptr ? group->getSize() : 1;
    torch::Tensor q_at = q.contiguous(), limit_at = limit.to(q.device());
    for (int s = 0; s < cp; ++s) {
      const torch::Tensor limit_cpu = limit_at.cpu();
      const std::vector<Chunk> at = s == 0 ? chunks : Chunks(dims, limit_cpu, query_rows);
      std::vector<ChunkState> states = states_of(packed, at);
      ContextForward(q_at.reshape(q5_shape), KeySpan{kc, vc, rank * dims.context, dims.context}, at,
                     limit_at, scale, key_block, dims, ct, states);
      if (cp == 1) break;
      const int64_t tag = tag_base + 3 * s;
      if (s + 1 < cp) {
        std::vector<torch::Tensor> in = HopAll(*group, {q_at, limit_at, packed}, tag);
        q_at = in[0];
        limit_at = in[1];
        packed = in[2];
      } else {
        packed = HopAll(*group, {packed}, tag)[0];  // home
      }
    }

    torch::Tensor out = torch::empty_like(q, torch::MemoryFormat::Contiguous);
    torch::Tensor lse = torch::empty({dims.batch, dims.q_heads, dims.t}, q.options().dtype(ct));
    torch::Tensor out6 = out.view(q6_shape);
    torch::Tensor lse5 = lse.view({dims.batch, dims.kv_heads, dims.group, dims.blocks, dims.bs});
    const std::vector<ChunkState> states = states_of(packed, chunks);
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const Chunk& c = chunks[ci];
      const ChunkState& st = states[ci];
      out6.narrow(3, c.j0, c.nc)
          .copy_((st.acc / st.l.unsqueeze(-1))
                     .view({dims.batch, dims.kv_heads, dims.group, c.nc, dims.bs, dims.d}));
      lse5.narrow(3, c.j0, c.nc)
          .copy_((st.m + st.l.log()).view({dims.batch, dims.kv_heads, dims.group, c.nc, dims.bs}));
    }

    ctx->save_for_backward({q, kc, vc, kb, vb, limit, out, lse});
    ctx->saved_data["block_size"] = block_size;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["query_rows"] = query_rows;
    ctx->saved_data["key_block"] = key_block;
    ctx->saved_data["tag_base"] = tag_base;
    if (group != nullptr) ctx->saved_data["group"] = GroupCapsule(*group);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &kc = saved[1], &vc = saved[2], &kb = saved[3],
                        &vb = saved[4], &limit = saved[5], &out = saved[6], &lse = saved[7];
    const int64_t block_size = ctx->saved_data["block_size"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t query_rows = ctx->saved_data["query_rows"].toInt();
    const int64_t key_block = ctx->saved_data["key_block"].toInt();
    const int64_t tag_base = ctx->saved_data["tag_base"].toInt();
    CommGroup* group =
        ctx->saved_data.count("group") != 0 ? &GroupFromCapsule(ctx->saved_data["group"]) : nullptr;
    const Dims dims = DimsOf(q, kc, block_size);
    const torch::ScalarType ct = AttentionComputeType(q.scalar_type());
    const std::vector<Chunk> chunks = Chunks(dims, limit, query_rows);

    const std::vector<int64_t> q6_shape = {dims.batch,  dims.kv_heads, dims.group,
                                           dims.blocks, dims.bs,       dims.d};
    const std::vector<int64_t> row_shape = {dims.batch, dims.kv_heads, dims.group, dims.blocks,
                                            dims.bs};
    const std::vector<int64_t> q5_shape = {dims.batch, dims.kv_heads, dims.group, dims.t, dims.d};
    const std::vector<int64_t> row4_shape = {dims.batch, dims.kv_heads, dims.group, dims.t};
    auto as5 = [&](const torch::Tensor& x) {
      return x.reshape({dims.batch, dims.kv_heads, dims.blocks, dims.bs, dims.d});
    };
    const torch::Tensor out6 = out.reshape(q6_shape);
    const torch::Tensor do6 = grad_outputs[0].reshape(q6_shape);
    const torch::Tensor kb5 = as5(kb), vb5 = as5(vb);
    const torch::Tensor lse5 = lse.view(row_shape);
    // Δ = rowsum(dO ∘ O), the softmax-Jacobian correction; it travels with
    // the logsumexp as one buffer [2, B, Hkv, G, N, bs].
    torch::Tensor rows_at = torch::stack({lse5, (do6.to(ct) * out6.to(ct)).sum(-1)});

    torch::Tensor dkb = torch::empty_like(kb, torch::MemoryFormat::Contiguous);
    torch::Tensor dvb = torch::empty_like(vb, torch::MemoryFormat::Contiguous);
    torch::Tensor dkb5 = as5(dkb), dvb5 = as5(dvb);
    // The dQ accumulators (unscaled), one [B, Hkv, rows, D] per chunk.
    const std::vector<int64_t> widths = {dims.d};
    torch::Tensor dq_packed = ZerosPacked(chunks, dims, widths, q.options().dtype(ct));
    // What a pass reads for the blocks of q_at/do_at/rows_at.
    auto grads_of = [&](const torch::Tensor& q_at, const torch::Tensor& do_at,
                        const torch::Tensor& rows, const std::vector<Chunk>& at) {
      const torch::Tensor qa = q_at.reshape(q5_shape), da = do_at.reshape(q5_shape);
      const torch::Tensor lse_a = rows[0].reshape(row4_shape);
      const torch::Tensor delta_a = rows[1].reshape(row4_shape);
      std::vector<std::vector<torch::Tensor>> dq = Unpack(dq_packed, at, dims, widths);
      std::vector<ChunkGrad> grads;
      for (size_t ci = 0; ci < at.size(); ++ci) {
        const int64_t start = at[ci].j0 * dims.bs, len = at[ci].nc * dims.bs;
        grads.push_back({FlatRows(qa, start, len, dims, ct), FlatRows(da, start, len, dims, ct),
                         FlatRowStats(lse_a, start, len, dims),
                         FlatRowStats(delta_a, start, len, dims), dq[ci][0]});
      }
      return grads;
    };

    // Own block: each block's keys are seen by its own rows only, so their
    // gradients are written once (summed over the group's query heads).
    std::vector<ChunkGrad> own = grads_of(q, grad_outputs[0], rows_at, chunks);
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const Chunk& c = chunks[ci];
      const std::vector<int64_t> chunk6 = {dims.batch, dims.kv_heads, dims.group,
                                           c.nc,       dims.bs,       dims.d};
      torch::Tensor qc = own[ci].qf.view(chunk6), doc = own[ci].dof.view(chunk6);
      torch::Tensor lsec = rows_at[0].narrow(3, c.j0, c.nc);
      torch::Tensor delta = rows_at[1].narrow(3, c.j0, c.nc);
      torch::Tensor kbc = kb5.narrow(2, c.j0, c.nc).to(ct);
      torch::Tensor vbc = vb5.narrow(2, c.j0, c.nc).to(ct);
      torch::Tensor pb = torch::einsum("bhgnid,bhnjd->bhgnij", {qc, kbc})
                             .mul_(scale)
                             .sub_(lsec.unsqueeze(-1))
                             .exp_();
      dvb5.narrow(2, c.j0, c.nc).copy_(torch::einsum("bhgnij,bhgnid->bhnjd", {pb, doc}));
      torch::Tensor dsb =
          torch::einsum("bhgnid,bhnjd->bhgnij", {doc, vbc}).sub_(delta.unsqueeze(-1)).mul_(pb);
      dkb5.narrow(2, c.j0, c.nc)
          .copy_(torch::einsum("bhgnij,bhgnid->bhnjd", {dsb, qc}).mul_(scale));
      own[ci].dq.add_(torch::einsum("bhgnij,bhnjd->bhgnid", {dsb, kbc}).reshape_as(own[ci].dq));
    }

    // The context: this rank's blocks, then each other rank's, against the
    // local shard, whose dK/dV accumulate here.
    const int rank = group != nullptr ? group->getRank() : 0;
    const int cp = group != nullptr ? group->getSize() : 1;
    torch::Tensor dkv =
        torch::zeros({2, dims.batch, dims.kv_heads, dims.context, dims.d}, kc.options().dtype(ct));
    torch::Tensor q_at = q, do_at = grad_outputs[0], limit_at = limit.to(q.device());
    for (int s = 0; s < cp; ++s) {
      const torch::Tensor limit_cpu = limit_at.cpu();
      const std::vector<Chunk> at = s == 0 ? chunks : Chunks(dims, limit_cpu, query_rows);
      std::vector<ChunkGrad> grads = s == 0 ? own : grads_of(q_at, do_at, rows_at, at);
      ContextBackward(KeySpan{kc, vc, rank * dims.context, dims.context}, at, limit_at, scale,
                      key_block, dims, ct, grads, dkv);
      if (cp == 1) break;
      const int64_t tag = tag_base + 3 * cp + 5 * s;
      if (s + 1 < cp) {
        std::vector<torch::Tensor> in = HopAll(
            *group, {q_at.contiguous(), do_at.contiguous(), rows_at, limit_at, dq_packed}, tag);
        q_at = in[0];
        do_at = in[1];
        rows_at = in[2];
        limit_at = in[3];
        dq_packed = in[4];
      } else {
        dq_packed = HopAll(*group, {dq_packed}, tag)[0];  // home
      }
    }

    torch::Tensor dq = torch::empty_like(q, torch::MemoryFormat::Contiguous);
    torch::Tensor dq6 = dq.view(q6_shape);
    const std::vector<std::vector<torch::Tensor>> dq_chunks =
        Unpack(dq_packed, chunks, dims, widths);
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const Chunk& c = chunks[ci];
      dq6.narrow(3, c.j0, c.nc)
          .copy_((dq_chunks[ci][0] * scale)
                     .view({dims.batch, dims.kv_heads, dims.group, c.nc, dims.bs, dims.d}));
    }
    // One gradient per forward argument (limit, the scalars and the group
    // get none).
    const torch::Tensor none;
    return {dq,
            dkv[0].to(kc.scalar_type()),
            dkv[1].to(vc.scalar_type()),
            dkb,
            dvb,
            none,
            none,
            none,
            none,
            none,
            none,
            none};
  }
};

// Checks the arguments of both entry points (the limits index the local
// context, or with a group the whole sharded one) and applies the function.
torch::Tensor Apply(const torch::Tensor& q, const torch::Tensor& kc, const torch::Tensor& vc,
                    const torch::Tensor& kb, const torch::Tensor& vb, const torch::Tensor& limit,
                    int64_t block_size, const BlockAttentionOptions& options, CommGroup* group) {
  TORCH_CHECK(q.dim() == 4, "BlockAttention: q must be [B, Hq, N·bs, D], got ", q.sizes());
  TORCH_CHECK(kc.dim() == 4 && kc.sizes() == vc.sizes(),
              "BlockAttention: kc and vc must both be [B, Hkv, S, D], got ", kc.sizes(), " and ",
              vc.sizes());
  TORCH_CHECK(kb.dim() == 4 && kb.sizes() == vb.sizes(),
              "BlockAttention: kb and vb must both be [B, Hkv, N·bs, D], got ", kb.sizes(), " and ",
              vb.sizes());
  TORCH_CHECK(block_size > 0, "BlockAttention: block_size must be positive");
  const int64_t batch = q.size(0), q_heads = q.size(1), rows = q.size(2), d = q.size(3);
  const int64_t kv_heads = kc.size(1);
  TORCH_CHECK(rows % block_size == 0, "BlockAttention: ", rows,
              " query rows are not whole blocks of ", block_size);
  TORCH_CHECK(kv_heads > 0 && q_heads % kv_heads == 0, "BlockAttention: Hq (", q_heads,
              ") must be a multiple of Hkv (", kv_heads, ")");
  TORCH_CHECK(kc.size(0) == batch && kc.size(3) == d, "BlockAttention: kc ", kc.sizes(),
              " does not match q ", q.sizes());
  TORCH_CHECK(
      kb.size(0) == batch && kb.size(1) == kv_heads && kb.size(2) == rows && kb.size(3) == d,
      "BlockAttention: kb ", kb.sizes(), " does not match q ", q.sizes());
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), "BlockAttention: q must be floating point");
  for (const torch::Tensor* t : {&kc, &vc, &kb, &vb}) {
    TORCH_CHECK(t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                "BlockAttention: q, kc, vc, kb and vb must share dtype and device");
  }
  TORCH_CHECK(limit.device().is_cpu() && limit.scalar_type() == torch::kInt64 && limit.dim() == 2 &&
                  limit.size(0) == batch && limit.size(1) == rows / block_size,
              "BlockAttention: limit must be a CPU int64 [B, N] = [", batch, ", ",
              rows / block_size, "], got ", limit.sizes());
  const int64_t context = kc.size(2) * (group != nullptr ? group->getSize() : 1);
  const torch::Tensor lim = limit.contiguous();
  if (lim.numel() > 0) {
    TORCH_CHECK(lim.min().item<int64_t>() >= 0 && lim.max().item<int64_t>() <= context,
                "BlockAttention: context limits must lie in [0, ", context, "]");
  }
  TORCH_CHECK(options.query_rows > 0 && options.key_block > 0,
              "BlockAttention: query_rows and key_block must be positive");
  TORCH_CHECK(options.tag_base >= 0, "BlockAttention: tag_base must be >= 0");
  return BlockAttentionFunction::apply(q, kc, vc, kb, vb, lim, block_size, options.scale,
                                       options.query_rows, options.key_block, group,
                                       static_cast<int64_t>(options.tag_base));
}

}  // namespace

torch::Tensor BlockAttention(const torch::Tensor& q, const torch::Tensor& kc,
                             const torch::Tensor& vc, const torch::Tensor& kb,
                             const torch::Tensor& vb, const torch::Tensor& limit,
                             int64_t block_size, const BlockAttentionOptions& options) {
  return Apply(q, kc, vc, kb, vb, limit, block_size, options, nullptr);
}

torch::Tensor RingBlockAttention(const torch::Tensor& q, const torch::Tensor& kc,
                                 const torch::Tensor& vc, const torch::Tensor& kb,
                                 const torch::Tensor& vb, const torch::Tensor& limit,
                                 int64_t block_size, CommGroup& context_group,
                                 const BlockAttentionOptions& options) {
  return Apply(q, kc, vc, kb, vb, limit, block_size, options, &context_group);
}

}  // namespace specstream::student
