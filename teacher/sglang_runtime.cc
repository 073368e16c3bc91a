#include "teacher/sglang_runtime.h"

#include <cmath>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"
#include "teacher/model_weights.h"
#include "teacher/moe.h"

namespace specstream::teacher {

// One decoder layer with SGLang's fused projections, sliced to this TP rank.
struct SglangRuntime::Layer {
  torch::Tensor input_norm, post_norm;
  torch::Tensor qkv, qkv_bias;  // [(Hq + 2 Hkv) D / tp, H]: cat(q, k, v) shards
  torch::Tensor o, o_bias;      // o row shard; bias added once, after the reduce
  torch::Tensor q_norm, k_norm;
  torch::Tensor gate_up, gate_up_bias;  // [2 I / tp, H]: cat(gate, up) shards
  torch::Tensor down, down_bias;
  // Sparse layers (router defined): the router, this rank's experts, and the
  // shared expert (gate_up/down shards like a dense MLP) where the model has one.
  torch::Tensor router;
  moe::Experts experts;
  torch::Tensor shared_gate_up, shared_down, shared_expert_gate;
  std::optional<int64_t> sliding_window;
};

namespace {

// down(silu(gate x) * up x) with gate and up fused into one matmul.
torch::Tensor FusedMlp(const torch::Tensor& x, const torch::Tensor& gate_up,
                       const torch::Tensor& gate_up_bias, const torch::Tensor& down) {
  torch::Tensor y = nn::Linear(x, gate_up, gate_up_bias);
  const int64_t inter = gate_up.size(0) / 2;
  return torch::linear(torch::silu(y.narrow(1, 0, inter)) * y.narrow(1, inter, inter), down);
}

torch::Tensor CatDefined(const torch::Tensor& a, const torch::Tensor& b,
                         const torch::Tensor& c = {}) {
  if (!a.defined()) return {};
  return c.defined() ? torch::cat({a, b, c}, 0) : torch::cat({a, b}, 0);
}

}  // namespace

SglangRuntime::~SglangRuntime() = default;

absl::StatusOr<std::unique_ptr<SglangRuntime>> SglangRuntime::Create(SglangRuntimeOptions options) {
  TuneAllocatorForTensors();
  std::unique_ptr<SglangRuntime> runtime(new SglangRuntime());
  runtime->options_ = std::move(options);
  RETURN_IF_ERROR(runtime->Load());
  return runtime;
}

absl::Status SglangRuntime::Load() {
  if (options_.moe_per_token_loop && options_.tp_size != 1) {
    return absl::InvalidArgumentError("the per-token expert loop runs on one rank (tp_size 1)");
  }
  ASSIGN_OR_RETURN(LoadedModel model, LoadTargetModel(options_, "sglang", /*allow_moe=*/true));
  config_ = std::move(model.config);
  description_ = std::move(model.description);
  dtype_ = description_.dtype;
  device_ = model.device;
  ModelWeights& weights = model.weights;
  const HfModelConfig& c = config_;
  embed_ = weights.embed;
  norm_ = weights.norm;
  lm_head_ = weights.lm_head;
  layers_.resize(weights.layers.size());
  // Fuse once here; the separate tensors are released with `weights`.
  RETURN_IF_ERROR(CatchTorch("fusing qkv and gate_up", [&] {
    for (size_t i = 0; i < weights.layers.size(); ++i) {
      LayerWeights& w = weights.layers[i];
      Layer& l = layers_[i];
      l.input_norm = w.input_norm;
      l.post_norm = w.post_norm;
      l.qkv = torch::cat({w.q, w.k, w.v}, 0);
      l.qkv_bias = CatDefined(w.q_bias, w.k_bias, w.v_bias);
      l.o = w.o;
      l.o_bias = w.o_bias;
      l.q_norm = w.q_norm;
      l.k_norm = w.k_norm;
      if (w.moe) {
        l.router = w.moe->router;
        l.experts = moe::FuseExperts(*w.moe);
        if (w.moe->shared_gate.defined()) {
          l.shared_gate_up = torch::cat({w.moe->shared_gate, w.moe->shared_up}, 0);
          l.shared_down = w.moe->shared_down;
          l.shared_expert_gate = w.moe->shared_expert_gate;
        }
      } else {
        l.gate_up = torch::cat({w.gate, w.up}, 0);
        l.gate_up_bias = CatDefined(w.gate_bias, w.up_bias);
        l.down = w.down;
        l.down_bias = w.down_bias;
      }
      l.sliding_window = w.sliding_window;
      w = LayerWeights();
    }
  }));
  ASSIGN_OR_RETURN(auto rotary, nn::Rotary::Create(c.head_dim, c.rope_theta, c.rope_scaling,
                                                   c.max_position_embeddings));
  rotary_.emplace(std::move(rotary));
  return absl::OkStatus();
}

torch::Tensor SglangRuntime::SparseMlp(const Layer& l, const torch::Tensor& x) {
  const HfModelConfig& c = config_;
  const ParallelLayout layout{options_.tp_rank, options_.tp_size, options_.ep_size};
  torch::Tensor out;
  if (layout.ep_size == 1) {
    const moe::Routing routing = moe::Route(x, l.router, c.num_experts_per_tok, c.norm_topk_prob);
    out = options_.moe_per_token_loop ? moe::PerTokenLoop(x, routing, l.experts)
                                      : moe::CombineLocal(x, routing, l.experts);
  } else {
    // This rank routes its chunk of the tokens; the other rows stay zero
    // here and are filled by their ranks' chunks in the caller's all-reduce.
    const moe::TokenChunk chunk = moe::ChunkOf(x.size(0), layout.tp_rank, layout.tp_size);
    const torch::Tensor rows = x.narrow(0, chunk.begin, chunk.size);
    const moe::Routing routing =
        moe::Route(rows, l.router, c.num_experts_per_tok, c.norm_topk_prob);
    absl::StatusOr<torch::Tensor> combined =
        moe::DispatchCombine(rows, routing, l.experts, layout, ActivationGroup());
    ThrowIfError(combined.status());
    out = torch::zeros_like(x);
    out.narrow(0, chunk.begin, chunk.size).copy_(*combined);
  }
  if (l.shared_gate_up.defined()) {
    out += torch::sigmoid(torch::linear(x, l.shared_expert_gate)) *
           FusedMlp(x, l.shared_gate_up, {}, l.shared_down);
  }
  return out;
}

absl::StatusOr<std::vector<SequenceCapture>> SglangRuntime::Compute(
    const torch::Tensor& host_ids, const std::vector<int64_t>& lengths, bool want_target_ids,
    const CaptureLayerIds& capture_ids) {
  std::vector<SequenceCapture> out;
  absl::Status status = CatchTorch("sglang forward", [&] {
    torch::NoGradGuard no_grad;
    const torch::Tensor ids = host_ids.to(device_);
    const HfModelConfig& c = config_;
    const int64_t n = ids.size(0), d = c.head_dim;
    const int64_t q_heads = c.num_attention_heads / options_.tp_size;
    const int64_t kv_heads = c.num_key_value_heads / options_.tp_size;
    const int64_t q_size = q_heads * d, kv_size = kv_heads * d;
    const double eps = c.rms_norm_eps;
    auto reduce = [&](torch::Tensor& x) {
      if (options_.tp_size > 1) {
        absl::Status s = AllReduceSum(ActivationGroup(), x);
        ThrowIfError(s);
      }
    };

    // cu_seqlens, and positions restarting at 0 for every sequence.
    std::vector<int64_t> offsets(lengths.size() + 1, 0);
    std::vector<torch::Tensor> position_parts;
    for (size_t s = 0; s < lengths.size(); ++s) {
      offsets[s + 1] = offsets[s] + lengths[s];
      position_parts.push_back(torch::arange(lengths[s], ids.options()));
    }
    auto [cos, sin] = rotary_->CosSin(torch::cat(position_parts), dtype_);
    cos = cos.unsqueeze(1);  // [N, 1, D]: broadcast over heads
    sin = sin.unsqueeze(1);

    torch::Tensor h = embed_.index_select(0, ids);  // [N, H]
    std::vector<torch::Tensor> ordered(capture_ids.size());
    nn::AttentionOptions attention;
    attention.scale = 1.0 / std::sqrt(static_cast<double>(d));
    attention.max_score_elements = options_.max_score_elements;

    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const Layer& l = layers_[i];
      torch::Tensor x = nn::RmsNorm(h, l.input_norm, eps);
      torch::Tensor qkv = nn::Linear(x, l.qkv, l.qkv_bias);  // one matmul
      torch::Tensor q = qkv.narrow(1, 0, q_size).reshape({n, q_heads, d});
      torch::Tensor k = qkv.narrow(1, q_size, kv_size).reshape({n, kv_heads, d});
      torch::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).reshape({n, kv_heads, d});
      if (l.q_norm.defined()) {
        q = nn::RmsNorm(q, l.q_norm, eps);
        k = nn::RmsNorm(k, l.k_norm, eps);
      }
      q = nn::ApplyRotary(q, cos, sin);
      k = nn::ApplyRotary(k, cos, sin);
      attention.sliding_window = l.sliding_window;
      // Ragged attention: each sequence segment attends causally to itself.
      torch::Tensor a = torch::empty({n, q_heads, d}, q.options());
      for (size_t s = 0; s < lengths.size(); ++s) {
        auto segment = [&](const torch::Tensor& t) {
          return t.narrow(0, offsets[s], lengths[s]).transpose(0, 1).unsqueeze(0).contiguous();
        };
        torch::Tensor o = nn::CausalAttention(segment(q), segment(k), segment(v), attention);
        a.narrow(0, offsets[s], lengths[s]).copy_(o[0].transpose(0, 1));
      }
      a = torch::linear(a.view({n, q_size}), l.o);
      reduce(a);
      if (l.o_bias.defined()) a = a + l.o_bias;
      h = h + a;

      x = nn::RmsNorm(h, l.post_norm, eps);
      torch::Tensor m =
          l.router.defined() ? SparseMlp(l, x) : FusedMlp(x, l.gate_up, l.gate_up_bias, l.down);
      reduce(m);
      if (l.down_bias.defined()) m = m + l.down_bias;
      h = h + m;
      for (size_t j = 0; j < capture_ids.size(); ++j) {
        if (capture_ids[j] == i) ordered[j] = h;
      }
    }
    torch::Tensor aux = torch::cat(ordered, -1);
    torch::Tensor last = nn::RmsNorm(h, norm_, eps);
    for (size_t s = 0; s < lengths.size(); ++s) {
      SequenceCapture capture;
      capture.aux_hidden = aux.narrow(0, offsets[s], lengths[s]).contiguous();
      capture.last_hidden = last.narrow(0, offsets[s], lengths[s]).contiguous();
      if (want_target_ids && options_.tp_rank == 0) {
        capture.target_ids = FullVocabArgmax(capture.last_hidden, lm_head_);
      }
      out.push_back(std::move(capture));
    }
  });
  if (!status.ok()) return status;
  return out;
}

}  // namespace specstream::teacher
