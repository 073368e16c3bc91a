#include "student/block_draft.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/block_draft.h"
#include "common/capture_layers.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"
#include "student/block_attention.h"
#include "student/context_parallel.h"
#include "student/step_rng.h"

namespace specstream::student {
namespace {

// Full-vocab logits held at once by the loss's chunks when not configured.
constexpr int64_t kLossChunkLogits = int64_t{1} << 21;

// A chunk's vocab-wide loss terms, per row [B, rows], and their gradient
// with respect to the logits.
struct VocabTerms {
  torch::Tensor term;         // DFlash: CE; DSpark: ce·CE + l1·L1
  torch::Tensor l1;           // DSpark: Σ|p − q|, p the draft's softmax, q the teacher's
  torch::Tensor argmax;       // the draft's token
  torch::Tensor logits_grad;  // d(Σ_rows scale·term) / d logits, [B, rows, V]
};

// Softmax over the last dim, in place; returns the log-sum-exp [..., 1].
torch::Tensor SoftmaxInPlace(torch::Tensor& x) {
  const torch::Tensor max = x.amax(-1, /*keepdim=*/true);
  x.sub_(max).exp_();
  const torch::Tensor sum = x.sum(-1, /*keepdim=*/true);
  x.div_(sum);
  return max + sum.log();
}

// `logits` [B, rows, V] (fp32 or fp64) and, for DSpark, `teacher_logits`
// (the same shape; undefined for DFlash) are overwritten: they end as the
// draft's softmax and as the gradient, so that the chunk holds two
// vocab-wide buffers rather than the about nine of autograd over
// log_softmax, softmax and abs. `scale` [B, rows]: each row's weight over
// the global weight sum. With s = sign(p − q), the gradient of a row is
//   scale · (ce·(p − onehot(label)) + l1·p ⊙ (s − ⟨p, s⟩))
// (DFlash: ce = 1, l1 = 0); sign(0) = 0, as autograd's abs has it.
VocabTerms VocabLoss(torch::Tensor logits, torch::Tensor teacher_logits, const torch::Tensor& label,
                     const torch::Tensor& scale, double ce, double l1) {
  torch::NoGradGuard no_grad;
  VocabTerms out;
  torch::Tensor& p = logits;
  out.argmax = p.argmax(-1);
  const torch::Tensor index = label.unsqueeze(-1);
  const torch::Tensor picked = p.gather(-1, index);
  const torch::Tensor cross_entropy = (SoftmaxInPlace(p) - picked).squeeze(-1);
  if (!teacher_logits.defined()) {
    out.term = cross_entropy;
    out.logits_grad =
        p.scatter_add_(-1, index, torch::full_like(picked, -1.0)).mul_(scale.unsqueeze(-1));
    return out;
  }
  torch::Tensor& g = teacher_logits;
  SoftmaxInPlace(g);
  g.neg_().add_(p);  // p − q
  out.l1 = RowAbsSum(g);
  const torch::Tensor p_dot_s = at::matmul(p.unsqueeze(-2), g.sign_().unsqueeze(-1)).squeeze(-1);
  g.sub_(p_dot_s).mul_(p).mul_(l1).add_(p, ce);
  g.scatter_add_(-1, index, torch::full_like(picked, -ce)).mul_(scale.unsqueeze(-1));
  out.term = ce * cross_entropy + l1 * out.l1;
  out.logits_grad = g;
  return out;
}

}  // namespace

torch::Tensor RowAbsSum(const torch::Tensor& x) {
  // fp32's vector norm (and a plain fp32 sum) drift by 1e-5 to 1e-4
  // relative over a 50k vocab; a float64 accumulator stays near fp32's own
  // rounding of the result.
  return x.abs().sum(-1, /*keepdim=*/false, torch::kFloat64).to(x.scalar_type());
}

const char* BlockDraftKindName(BlockDraftKind kind) {
  return kind == BlockDraftKind::kDFlash ? "dflash" : "dspark";
}

absl::StatusOr<BlockDraftKind> BlockDraftKindFromName(const std::string& name) {
  if (name == "dflash") return BlockDraftKind::kDFlash;
  if (name == "dspark") return BlockDraftKind::kDSpark;
  return absl::InvalidArgumentError(
      absl::StrCat("model.draft.type: \"", name, "\" is not a block draft (dflash, dspark)"));
}

nlohmann::json BlockDraftOptionsJson(const BlockDraftOptions& o) {
  return {{"type", BlockDraftKindName(o.kind)},
          {"num_layers", o.num_layers},
          {"block_size", o.block_size},
          {"num_anchors", o.num_anchors},
          {"mask_token_id", o.mask_token_id},
          {"target_layer_ids", o.target_layer_ids},
          {"loss_decay_gamma", o.loss_decay_gamma},
          {"markov_rank", o.markov_rank},
          {"markov_head_type", "vanilla"},
          {"enable_confidence_head", o.confidence_head},
          {"confidence_head_with_markov", o.confidence_with_markov},
          {"loss_weights", {{"ce", o.ce_weight}, {"l1", o.l1_weight}, {"conf", o.conf_weight}}}};
}

absl::StatusOr<BlockDraftOptions> BlockDraftOptionsFromJson(const nlohmann::json& j) {
  BlockDraftOptions o;
  std::string key;
  try {
    key = "type";
    ASSIGN_OR_RETURN(o.kind, BlockDraftKindFromName(j.at(key).get<std::string>()));
    key = "num_layers";
    o.num_layers = j.at(key).get<int64_t>();
    key = "block_size";
    o.block_size = j.at(key).get<int64_t>();
    key = "num_anchors";
    o.num_anchors = j.at(key).get<int64_t>();
    key = "mask_token_id";
    o.mask_token_id = j.at(key).get<int64_t>();
    key = "target_layer_ids";
    ASSIGN_OR_RETURN(o.target_layer_ids,
                     NarrowCaptureLayerIds(j.at(key).get<std::vector<int64_t>>(),
                                           "block_draft.target_layer_ids"));
    key = "loss_decay_gamma";
    o.loss_decay_gamma = j.at(key).get<double>();
    key = "markov_rank";
    o.markov_rank = j.at(key).get<int64_t>();
    key = "enable_confidence_head";
    o.confidence_head = j.at(key).get<bool>();
    key = "confidence_head_with_markov";
    o.confidence_with_markov = j.at(key).get<bool>();
    key = "loss_weights";
    const nlohmann::json& w = j.at(key);
    o.ce_weight = w.at("ce").get<double>();
    o.l1_weight = w.at("l1").get<double>();
    o.conf_weight = w.at("conf").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("block_draft.", key, ": ", e.what()));
  }
  return o;
}

double CalibrationError(const double* bins, int64_t num_bins) {
  double count = 0, gap = 0;
  for (int64_t i = 0; i < num_bins; ++i) {
    count += bins[3 * i];
    gap += std::abs(bins[3 * i + 1] - bins[3 * i + 2]);
  }
  return count > 0 ? gap / count : 0.0;
}

BlockAnchors SampleBlockAnchors(const DraftBatch& batch, const std::vector<int64_t>& sample_keys,
                                uint64_t seed, int64_t step, int64_t num_anchors) {
  const int64_t b = batch.input_ids.size(0);
  const torch::Tensor mask = batch.loss_mask.to(torch::kCPU).to(torch::kUInt8).contiguous();
  const int64_t t = mask.size(1);
  std::vector<std::vector<int64_t>> chosen(b);
  int64_t width = 1;
  for (int64_t row = 0; row < b; ++row) {
    const uint8_t* m = mask.data_ptr<uint8_t>() + row * t;
    const int64_t len = std::min(batch.host_lengths[row], t);
    std::vector<int64_t> candidates;
    for (int64_t i = 0; i + 1 < len; ++i) {
      if (m[i] != 0 && m[i + 1] != 0) candidates.push_back(i);
    }
    std::mt19937_64 rng = StepRng(seed, step, sample_keys[row]);
    candidates = UniformSubset(std::move(candidates), num_anchors, rng);
    const int64_t n = static_cast<int64_t>(candidates.size());
    width = std::max(width, n);
    chosen[row] = std::move(candidates);
  }
  BlockAnchors out;
  out.anchors = torch::zeros({b, width}, torch::kInt64);
  out.keep = torch::zeros({b, width}, torch::kBool);
  auto anchors = out.anchors.accessor<int64_t, 2>();
  auto keep = out.keep.accessor<bool, 2>();
  for (int64_t row = 0; row < b; ++row) {
    for (size_t j = 0; j < chosen[row].size(); ++j) {
      anchors[row][j] = chosen[row][j];
      keep[row][j] = true;
    }
  }
  return out;
}

BlockAnchors DealBlocks(const BlockAnchors& all, int64_t size, int64_t rank) {
  const int64_t b = all.anchors.size(0), n = all.anchors.size(1);
  const int64_t width = std::max<int64_t>(1, (n + size - 1) / size);
  BlockAnchors out;
  out.anchors = torch::zeros({b, width}, torch::kInt64);
  out.keep = torch::zeros({b, width}, torch::kBool);
  if (n > rank) {
    const torch::Tensor mine = torch::arange(rank, n, size, torch::kInt64);
    out.anchors.narrow(1, 0, mine.size(0)).copy_(all.anchors.index_select(1, mine));
    out.keep.narrow(1, 0, mine.size(0)).copy_(all.keep.index_select(1, mine));
  }
  return out;
}

torch::Tensor& BlockDraft::Add(const std::string& name, torch::Tensor value) {
  index_[name] = params_.size();
  params_.emplace_back(name, value.to(torch::kFloat32).contiguous());
  return params_.back().second;
}

torch::Tensor& BlockDraft::parameter(const std::string& name) {
  return params_.at(index_.at(name)).second;
}

absl::StatusOr<std::unique_ptr<BlockDraft>> BlockDraft::Create(const DraftShape& shape,
                                                               const BlockDraftOptions& options,
                                                               const std::string& target_dir,
                                                               uint64_t seed,
                                                               torch::Device device) {
  const DraftShape& s = shape;
  const BlockDraftOptions& o = options;
  const char* type = BlockDraftKindName(o.kind);
  auto refuse = [&](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.draft.", field, ": ", why, " (", type, " draft)"));
  };
  for (auto [field, v] : {std::pair<const char*, int64_t>{"hidden_size", s.hidden_size},
                          {"intermediate_size", s.intermediate_size},
                          {"num_attention_heads", s.num_attention_heads},
                          {"num_key_value_heads", s.num_key_value_heads},
                          {"head_dim", s.head_dim},
                          {"num_layers", o.num_layers},
                          {"block_size", o.block_size},
                          {"num_anchors", o.num_anchors}}) {
    if (v <= 0) return refuse(field, absl::StrCat("must be positive, got ", v));
  }
  if (s.num_attention_heads % s.num_key_value_heads != 0) {
    return refuse("num_key_value_heads", "must divide num_attention_heads");
  }
  if (s.hidden_size != s.target_hidden_size) {
    return refuse("hidden_size",
                  absl::StrCat(s.hidden_size, " must equal the target's ", s.target_hidden_size,
                               " (the draft reuses its embeddings and lm_head)"));
  }
  if (o.kind == BlockDraftKind::kDFlash && o.block_size < 2) {
    return refuse("block_size", "must be >= 2 (slot 0 is never trained)");
  }
  if (o.target_layer_ids.empty() ||
      static_cast<int64_t>(o.target_layer_ids.size()) != s.num_captures) {
    return refuse("target_layer_ids", absl::StrCat(o.target_layer_ids.size(), " ids for ",
                                                   s.num_captures, " captured layers in the data"));
  }
  if (o.mask_token_id < 0 || o.mask_token_id >= s.target_vocab_size) {
    return refuse("mask_token_id", absl::StrCat(o.mask_token_id, " is not a row of the target's ",
                                                s.target_vocab_size, " embeddings"));
  }
  if (!(o.loss_decay_gamma > 0) || !std::isfinite(o.loss_decay_gamma)) {
    return refuse("loss_decay_gamma", "must be a finite number > 0");
  }
  if (o.kind == BlockDraftKind::kDSpark && o.markov_rank <= 0) {
    return refuse("markov_rank", "must be positive");
  }

  std::unique_ptr<BlockDraft> draft(new BlockDraft());
  draft->shape_ = s;
  draft->options_ = o;
  const int64_t H = s.hidden_size, V = s.target_vocab_size;
  ASSIGN_OR_RETURN(auto frozen, LoadTargetEmbeddings(target_dir, V, H, device));
  draft->embed_ = frozen.first;
  draft->lm_head_ = frozen.second;

  // HF-style init on the host: linears N(0, 0.02), norms 1. The Markov
  // head's output starts at zero, so training starts from the target's
  // lm_head alone.
  auto gen = at::detail::createCPUGenerator(seed);
  auto normal = [&](const std::vector<int64_t>& dims) { return HfInitNormal(gen, dims); };
  const int64_t A = s.num_attention_heads, B = s.num_key_value_heads, D = s.head_dim;
  const int64_t I = s.intermediate_size;
  draft->Add("fc.weight", normal({H, s.num_captures * H}));
  draft->Add("hidden_norm.weight", torch::ones({H}));
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    draft->Add(p + "self_attn.q_proj.weight", normal({A * D, H}));
    draft->Add(p + "self_attn.k_proj.weight", normal({B * D, H}));
    draft->Add(p + "self_attn.v_proj.weight", normal({B * D, H}));
    draft->Add(p + "self_attn.o_proj.weight", normal({H, A * D}));
    draft->Add(p + "self_attn.q_norm.weight", torch::ones({D}));
    draft->Add(p + "self_attn.k_norm.weight", torch::ones({D}));
    draft->Add(p + "mlp.gate_proj.weight", normal({I, H}));
    draft->Add(p + "mlp.up_proj.weight", normal({I, H}));
    draft->Add(p + "mlp.down_proj.weight", normal({H, I}));
    draft->Add(p + "input_layernorm.weight", torch::ones({H}));
    draft->Add(p + "post_attention_layernorm.weight", torch::ones({H}));
  }
  draft->Add("norm.weight", torch::ones({H}));
  if (o.kind == BlockDraftKind::kDSpark) {
    const int64_t r = o.markov_rank;
    draft->Add("markov_head.markov_w1.weight", normal({V, r}));
    draft->Add("markov_head.markov_w2.weight", torch::zeros({V, r}));
    if (o.confidence_head) {
      draft->Add("confidence_head.proj.weight", normal({1, o.confidence_with_markov ? H + r : H}));
      draft->Add("confidence_head.proj.bias", torch::zeros({1}));
    }
  }
  for (auto& [name, p] : draft->params_) p = p.detach().to(device).set_requires_grad(true);
  ASSIGN_OR_RETURN(auto rotary,
                   nn::Rotary::Create(D, s.rope_theta, s.rope_scaling, s.max_position_embeddings));
  draft->rotary_.emplace(std::move(rotary));
  return draft;
}

std::pair<torch::Tensor, torch::Tensor> BlockDraft::LabelsAndWeights(
    const DraftBatch& batch, const torch::Tensor& anchors, const torch::Tensor& keep) const {
  torch::NoGradGuard no_grad;
  const int64_t b = anchors.size(0), n = anchors.size(1), bs = options_.block_size;
  const int64_t t = batch.input_ids.size(1);
  const auto i64 = anchors.options();
  const torch::Tensor k = torch::arange(bs, i64);
  const torch::Tensor len = batch.lengths.view({b, 1, 1});
  const torch::Tensor kept = keep.unsqueeze(-1);
  auto gather = [&](const torch::Tensor& x, const torch::Tensor& pos) {
    return x.gather(1, pos.clamp(0, std::max<int64_t>(t - 1, 0)).reshape({b, -1})).view({b, n, bs});
  };
  const torch::Tensor pos = anchors.unsqueeze(-1) + k;  // [B, N, bs]
  const double gamma = options_.loss_decay_gamma;
  torch::Tensor labels, weights;
  if (options_.kind == BlockDraftKind::kDFlash) {
    labels = gather(batch.input_ids, pos);
    torch::Tensor valid = kept & (pos < len) & (k > 0) & (gather(batch.loss_mask, pos) != 0);
    torch::Tensor decay = torch::exp(-(k - 1).to(torch::kFloat64) / gamma);
    weights = valid.to(torch::kFloat64) * decay;
  } else {
    const torch::Tensor next = pos + 1;
    labels = gather(batch.input_ids, next);
    torch::Tensor eval = kept & (next < len) & (gather(batch.loss_mask, next) != 0);
    // Only the contiguous supervised prefix of a block counts.
    eval = eval.to(torch::kInt64).cumprod(-1);
    weights = eval.to(torch::kFloat64) * torch::exp(-k.to(torch::kFloat64) / gamma);
  }
  return {labels, weights};
}

torch::Tensor BlockDraft::WeightSum(const DraftBatch& batch, const BlockAnchors& anchors) const {
  const torch::Device dev = batch.input_ids.device();
  return LabelsAndWeights(batch, anchors.anchors.to(dev), anchors.keep.to(dev)).second.sum();
}

torch::Tensor BlockDraft::Backbone(const DraftBatch& batch, const BlockAnchors& anchors,
                                   const torch::Tensor& positions, torch::Dtype cd,
                                   CommGroup* cp_group) {
  const DraftShape& s = shape_;
  const BlockDraftOptions& o = options_;
  const int64_t b = batch.input_ids.size(0), n = anchors.anchors.size(1), bs = o.block_size;
  const int64_t m = n * bs, H = s.hidden_size, A = s.num_attention_heads;
  const int64_t KV = s.num_key_value_heads, D = s.head_dim;
  const double eps = s.rms_norm_eps;
  auto P = [&](const std::string& name) { return parameter(name).to(cd); };
  const torch::Tensor anchor = anchors.anchors.to(device());
  // The block tokens: x[a] then mask tokens.
  torch::Tensor block_ids = torch::full({b, n, bs}, o.mask_token_id, anchor.options());
  block_ids.select(2, 0).copy_(batch.input_ids.gather(1, anchor));
  torch::Tensor h = embed_.index_select(0, block_ids.view({-1})).view({b, m, H}).to(cd);

  auto [cos_b, sin_b] = rotary_->CosSin(positions.view({-1}), cd);
  cos_b = cos_b.view({b, 1, m, D});
  sin_b = sin_b.view({b, 1, m, D});
  // Under CP the context stays sharded: this rank's rows are global
  // positions [rank·L, (rank+1)·L), and RingBlockAttention passes the
  // shards' keys and values round the CP group.
  const int64_t shard_len = batch.aux_hidden.size(1);
  const int64_t shard_begin = cp_group != nullptr ? cp_group->getRank() * shard_len : 0;
  auto [cos_c, sin_c] =
      rotary_->CosSin(torch::arange(shard_begin, shard_begin + shard_len, anchor.options()), cd);
  // Dummy blocks see no context.
  const torch::Tensor limit = anchors.anchors * anchors.keep.to(torch::kInt64);
  BlockAttentionOptions attention;
  attention.scale = 1.0 / std::sqrt(static_cast<double>(D));
  const torch::Tensor context = nn::RmsNorm(torch::linear(batch.aux_hidden.to(cd), P("fc.weight")),
                                            P("hidden_norm.weight"), eps);
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    const torch::Tensor q_w = P(p + "self_attn.q_proj.weight");
    const torch::Tensor k_w = P(p + "self_attn.k_proj.weight");
    const torch::Tensor v_w = P(p + "self_attn.v_proj.weight");
    const torch::Tensor q_norm = P(p + "self_attn.q_norm.weight");
    const torch::Tensor k_norm = P(p + "self_attn.k_norm.weight");
    torch::Tensor x = nn::RmsNorm(h, P(p + "input_layernorm.weight"), eps);
    auto heads = [&](const torch::Tensor& in, const torch::Tensor& w, int64_t rows, int64_t count,
                     const torch::Tensor* norm) {
      torch::Tensor y = torch::linear(in, w).view({b, rows, count, D});
      if (norm != nullptr) y = nn::RmsNorm(y, *norm, eps);
      return y.transpose(1, 2);
    };
    torch::Tensor q = nn::ApplyRotary(heads(x, q_w, m, A, &q_norm), cos_b, sin_b);
    torch::Tensor kb = nn::ApplyRotary(heads(x, k_w, m, KV, &k_norm), cos_b, sin_b);
    torch::Tensor vb = heads(x, v_w, m, KV, nullptr);
    torch::Tensor kc =
        nn::ApplyRotary(heads(context, k_w, shard_len, KV, &k_norm), cos_c, sin_c).contiguous();
    torch::Tensor vc = heads(context, v_w, shard_len, KV, nullptr).contiguous();
    torch::Tensor a = cp_group != nullptr
                          ? RingBlockAttention(q.contiguous(), kc, vc, kb.contiguous(),
                                               vb.contiguous(), limit, bs, *cp_group, attention)
                          : BlockAttention(q.contiguous(), kc, vc, kb.contiguous(), vb.contiguous(),
                                           limit, bs, attention);
    h = h +
        torch::linear(a.transpose(1, 2).reshape({b, m, A * D}), P(p + "self_attn.o_proj.weight"));
    h = h + nn::SwiGluMlp(nn::RmsNorm(h, P(p + "post_attention_layernorm.weight"), eps),
                          P(p + "mlp.gate_proj.weight"), P(p + "mlp.up_proj.weight"),
                          P(p + "mlp.down_proj.weight"));
  }
  const torch::Tensor hn = nn::RmsNorm(h, P("norm.weight"), eps);
  return hn;
}

absl::StatusOr<BlockOutputs> BlockDraft::Forward(const DraftBatch& batch,
                                                 const BlockAnchors& anchors,
                                                 const torch::Tensor& global_weight_sum,
                                                 torch::Dtype cd, CommGroup* cp_group) {
  BlockOutputs out;
  absl::Status status = CatchTorch("block draft forward", [&] {
    const DraftShape& s = shape_;
    const BlockDraftOptions& o = options_;
    const bool dspark = o.kind == BlockDraftKind::kDSpark;
    const int64_t cp = cp_group != nullptr ? cp_group->getSize() : 1;
    const int64_t b = batch.input_ids.size(0), ctx_len = batch.aux_hidden.size(1) * cp;
    TORCH_CHECK(batch.input_ids.size(1) == ctx_len && (cp > 1 || batch.offset == 0),
                "block draft forward: ", batch.input_ids.size(1), " token ids for ", ctx_len,
                " context positions (", cp, " shard(s) of ", batch.aux_hidden.size(1),
                " rows): the ids must cover the whole sequence");
    TORCH_CHECK(anchors.anchors.dim() == 2 && anchors.anchors.size(0) == b &&
                    anchors.keep.sizes() == anchors.anchors.sizes(),
                "block draft forward: anchors ", anchors.anchors.sizes(), " do not match ", b,
                " samples");
    const int64_t n = anchors.anchors.size(1), bs = o.block_size, m = n * bs;
    const int64_t H = s.hidden_size, V = s.target_vocab_size;
    const torch::Device dev = device();
    const torch::ScalarType ft = cd == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;

    const torch::Tensor anchor = anchors.anchors.to(dev);
    const torch::Tensor keep = anchors.keep.to(dev);
    auto [labels, weights] = LabelsAndWeights(batch, anchor, keep);
    const torch::Tensor k_slots = torch::arange(bs, anchor.options());
    const torch::Tensor positions = (anchor.unsqueeze(-1) + k_slots).view({b, m});

    const int64_t shard_len = batch.aux_hidden.size(1);
    const int64_t shard_begin = cp_group != nullptr ? cp_group->getRank() * shard_len : 0;
    // DSpark's teacher rows [B, m, H]: last_hidden at each slot's position
    // (clamped; rows past the sequence carry no weight). Under CP a slot's
    // row may live on any rank: every rank fills, for every rank's slots
    // (the positions are all-gathered), the rows its shard holds and zeros
    // elsewhere, and a sum over the group completes them, so the exchange
    // is O(slots·H) rather than the whole sequence's O(S·H).
    torch::Tensor teacher_rows;
    if (dspark) {
      torch::NoGradGuard no_grad;
      const torch::Tensor at = positions.clamp(0, std::max<int64_t>(ctx_len - 1, 0));
      auto rows_at = [&](const torch::Tensor& index) {
        return batch.last_hidden.gather(
            1, index.unsqueeze(-1).expand({b, index.size(1), batch.last_hidden.size(2)}));
      };
      if (cp_group == nullptr) {
        teacher_rows = rows_at(at);
      } else {
        const torch::Tensor local = SequenceAllGather(at.contiguous(), *cp_group) - shard_begin;
        const torch::Tensor mine = ((local >= 0) & (local < shard_len)).unsqueeze(-1);
        torch::Tensor all_rows =
            shard_len == 0
                ? torch::zeros({b, local.size(1), H}, batch.last_hidden.options().dtype(ft))
                : torch::where(mine, rows_at(local.clamp(0, shard_len - 1)).to(ft),
                               torch::zeros({}, batch.last_hidden.options().dtype(ft)));
        ThrowIfError(Annotate(AllReduceSum(*cp_group, all_rows), "block draft forward"));
        teacher_rows = all_rows.narrow(1, cp_group->getRank() * m, m);
      }
    }
    const torch::Tensor hn = Backbone(batch, anchors, positions, cd, cp_group);

    // The heads and the loss, a chunk of blocks at a time. A chunk's
    // gradient is written out by hand where it is vocab-wide (the logits,
    // the Markov head: accumulated in place, so that no [V, r] gradient is
    // made per chunk) and taken from autograd (torch::autograd::grad) for
    // the confidence head only. The sums, with respect to the final hidden
    // state and to the heads' masters, then reach the parameters through
    // one surrogate term in weighted_loss, so that every parameter receives
    // its gradient exactly once per backward (the DDP reducer's hooks count
    // on it, and LibTorch 2.x runs a leaf's hooks in autograd::grad too: the
    // masters themselves stay out of the chunks' graphs).
    const bool grad = torch::GradMode::is_enabled();
    const torch::Tensor head = lm_head_.to(cd);
    // Indices into head_names / head_grads.
    enum { kMarkovW1 = 0, kMarkovW2 = 1, kConfidenceW = 2, kConfidenceB = 3 };
    std::vector<std::string> head_names;
    torch::Tensor markov_w1, markov_w2;  // the compute-dtype copies, without graph
    if (dspark) {
      head_names = {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"};
      if (o.confidence_head) {
        head_names.push_back("confidence_head.proj.weight");
        head_names.push_back("confidence_head.proj.bias");
      }
      torch::NoGradGuard no_grad;
      markov_w1 = parameter(head_names[kMarkovW1]).to(cd);
      markov_w2 = parameter(head_names[kMarkovW2]).to(cd);
    }
    // The confidence head's detached copies, the leaves of its autograd.
    std::map<std::string, torch::Tensor> head_leaves;
    for (size_t i = kConfidenceW; i < head_names.size(); ++i) {
      head_leaves[head_names[i]] = parameter(head_names[i]).detach().requires_grad_(grad);
    }
    auto Head = [&](const std::string& name) { return head_leaves.at(name).to(cd); };
    torch::Tensor hidden_grad;
    std::vector<torch::Tensor> head_grads;
    if (grad) {
      hidden_grad = torch::zeros(hn.sizes(), hn.options().dtype(ft));
      for (const std::string& name : head_names) {
        head_grads.push_back(torch::zeros_like(parameter(name).detach()));
      }
    }
    const torch::Tensor denominator =
        torch::where(global_weight_sum > 0, global_weight_sum, torch::ones_like(global_weight_sum))
            .to(ft);
    const int64_t chunk_rows =
        o.loss_chunk_rows > 0 ? o.loss_chunk_rows : std::max<int64_t>(1, kLossChunkLogits / V);
    const int64_t blocks_per_chunk =
        std::max<int64_t>(1, chunk_rows / std::max<int64_t>(1, b * bs));
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(dev);
    torch::Tensor loss_sum = torch::zeros({}, f64);
    torch::Tensor correct_all =
        torch::zeros({b, n, bs}, torch::TensorOptions().dtype(torch::kBool).device(dev));
    torch::Tensor calibration = torch::zeros({kCalibrationBins, 3}, f64);

    for (int64_t j0 = 0; j0 < n; j0 += blocks_per_chunk) {
      const int64_t nc = std::min(blocks_per_chunk, n - j0), rows = nc * bs;
      torch::Tensor hc = hn.detach().narrow(1, j0 * bs, rows).detach().requires_grad_(grad);
      torch::Tensor label = labels.narrow(1, j0, nc).reshape({b, rows});
      torch::Tensor weight = weights.narrow(1, j0, nc).reshape({b, rows}).to(ft);
      torch::Tensor logits, prev, prev_embed;
      {
        torch::NoGradGuard no_grad;
        logits = torch::linear(hc, head).to(ft);
        if (dspark) {
          // Teacher forcing: slot k's previous token is x[a+k].
          prev = batch.input_ids
                     .gather(1, positions.narrow(1, j0 * bs, rows)
                                    .clamp(0, std::max<int64_t>(ctx_len - 1, 0)))
                     .reshape({-1});
          prev_embed = markov_w1.index_select(0, prev).view({b, rows, -1});
          logits.add_(torch::linear(prev_embed, markov_w2));
        }
      }
      // The vocab-wide terms and their gradient with respect to the logits
      // are written out here, in place on two [rows, V] fp32 buffers (the
      // logits' and the teacher's): autograd over log_softmax, the teacher's
      // softmax and the L1 held about nine.
      torch::Tensor teacher_logits;
      if (dspark) {
        torch::NoGradGuard no_grad;
        teacher_logits = torch::linear(teacher_rows.narrow(1, j0 * bs, rows).to(cd), head).to(ft);
      }
      const VocabTerms vocab =
          VocabLoss(logits, teacher_logits, label, weight / denominator, o.ce_weight, o.l1_weight);
      torch::Tensor term = vocab.term;
      torch::Tensor conf_sum;
      torch::Tensor confidence, target;
      torch::Tensor prev_leaf;  // the confidence head's Markov input, as a leaf
      if (dspark && o.confidence_head) {
        torch::Tensor feature = hc;
        if (o.confidence_with_markov) {
          prev_leaf = prev_embed.detach().requires_grad_(grad);
          feature = torch::cat({hc, prev_leaf}, -1);
        }
        confidence = torch::linear(feature, Head("confidence_head.proj.weight"),
                                   Head("confidence_head.proj.bias"))
                         .squeeze(-1)
                         .to(ft);
        target = (1.0 - 0.5 * vocab.l1).clamp(0.0, 1.0);
        conf_sum = (o.conf_weight *
                    torch::binary_cross_entropy_with_logits(confidence, target, {}, {},
                                                            at::Reduction::None) *
                    weight)
                       .sum();
      }
      torch::Tensor chunk_sum = (term * weight).sum();
      if (conf_sum.defined()) chunk_sum = chunk_sum + conf_sum.detach();
      loss_sum += chunk_sum.to(torch::kFloat64);
      if (grad) {
        // The confidence head's gradient, by autograd: with respect to hc,
        // its weights and (with_markov) prev_embed.
        std::vector<torch::Tensor> conf_grads;
        if (conf_sum.defined()) {
          std::vector<torch::Tensor> inputs = {hc, head_leaves.at(head_names[kConfidenceW]),
                                               head_leaves.at(head_names[kConfidenceB])};
          if (prev_leaf.defined()) inputs.push_back(prev_leaf);
          conf_grads = torch::autograd::grad(
              {conf_sum / denominator}, inputs, {torch::ones({}, conf_sum.options())},
              /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
          conf_grads.resize(4);
        }
        torch::NoGradGuard no_grad;
        // Through the logits, G: d hc = G·lm_head; DSpark's Markov bias
        // (prev_embed·w2ᵀ) adds d w2 = Gᵀ·prev_embed and d prev_embed = G·w2,
        // which w1's rows (prev) collect. G in the compute dtype, as the
        // autograd of a linear in that dtype would take it, except for d w2,
        // accumulated in the master's dtype.
        const torch::Tensor g = vocab.logits_grad.to(cd);
        torch::Tensor hc_grad = torch::matmul(g, head);
        if (!conf_grads.empty()) {
          if (conf_grads[0].defined()) hc_grad.add_(conf_grads[0]);
          if (conf_grads[1].defined()) head_grads[kConfidenceW].add_(conf_grads[1]);
          if (conf_grads[2].defined()) head_grads[kConfidenceB].add_(conf_grads[2]);
        }
        hidden_grad.narrow(1, j0 * bs, rows).add_(hc_grad.to(ft));
        if (dspark) {
          const int64_t r = markov_w2.size(1);
          torch::Tensor prev_grad = torch::matmul(g, markov_w2);
          if (!conf_grads.empty() && conf_grads[3].defined()) prev_grad.add_(conf_grads[3]);
          torch::Tensor& w1_grad = head_grads[kMarkovW1];
          torch::Tensor& w2_grad = head_grads[kMarkovW2];
          w1_grad.index_add_(0, prev, prev_grad.reshape({-1, r}).to(w1_grad.scalar_type()));
          // In place and in the masters' dtype: no [V, r] temporary.
          w2_grad.addmm_(vocab.logits_grad.reshape({-1, g.size(-1)}).t().to(w2_grad.scalar_type()),
                         prev_embed.reshape({-1, r}).to(w2_grad.scalar_type()));
        }
      }
      {
        torch::NoGradGuard no_grad;
        correct_all.narrow(1, j0, nc).copy_((vocab.argmax == label).view({b, nc, bs}));
        if (confidence.defined()) {
          const torch::Tensor counted = (weight > 0).reshape({-1});
          const torch::Tensor pred =
              torch::sigmoid(confidence.detach()).reshape({-1}).index({counted});
          const torch::Tensor bin =
              (pred * kCalibrationBins).floor().clamp(0, kCalibrationBins - 1).to(torch::kInt64);
          const torch::Tensor sums =
              torch::stack({torch::ones_like(pred), pred, target.reshape({-1}).index({counted})}, 1)
                  .to(torch::kFloat64);
          calibration.index_add_(0, bin, sums);
        }
      }
    }

    torch::Tensor value = loss_sum.to(ft) / denominator;
    if (grad) {
      // Value: the loss. Gradient: the sums above, into the layers through
      // the final hidden state and into the heads' masters.
      torch::Tensor surrogate = (hn.to(ft) * hidden_grad).sum();
      for (size_t i = 0; i < head_names.size(); ++i) {
        surrogate = surrogate + (parameter(head_names[i]) * head_grads[i]).sum().to(ft);
      }
      out.weighted_loss = (value + surrogate - surrogate.detach()).to(torch::kFloat32);
    } else {
      out.weighted_loss = value.to(torch::kFloat32);
    }
    torch::NoGradGuard no_grad;
    const torch::Tensor counted = weights > 0;
    const torch::Tensor hit = correct_all & counted;
    out.loss_sum = loss_sum;
    out.weight_sum = weights.sum();
    out.correct = hit.sum(std::vector<int64_t>{0, 1});
    out.counted = counted.sum(std::vector<int64_t>{0, 1});
    // Accepted length of a block: 1 (the target's own token) plus the
    // drafted tokens matched in a row from the first trained slot.
    const int64_t first = dspark ? 0 : 1;
    const torch::Tensor chain = hit.narrow(2, first, bs - first).to(torch::kInt64).cumprod(-1);
    out.accepted = ((chain.sum(-1) + 1).to(torch::kFloat64) * keep.to(torch::kFloat64)).sum();
    out.blocks = keep.sum();
    if (dspark && o.confidence_head) out.calibration = calibration;
  });
  if (!status.ok()) return status;
  return out;
}

int64_t BlockDraft::proposal_length() const {
  return options_.kind == BlockDraftKind::kDSpark ? options_.block_size : options_.block_size - 1;
}

absl::Status BlockDraft::Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                                 int64_t max_tokens, spec::TokenChooser& chooser,
                                 std::vector<int32_t>* tokens) {
  RETURN_IF_ERROR(spec::CheckProposalInputs(ids, aux, "block draft propose"));
  const int64_t n = static_cast<int64_t>(ids.size());
  return CatchTorch("block draft propose", [&] {
    torch::NoGradGuard no_grad;
    const bool dspark = options_.kind == BlockDraftKind::kDSpark;
    const int64_t bs = options_.block_size;
    const auto index = torch::TensorOptions().dtype(torch::kInt64).device(device());
    DraftBatch batch;
    batch.input_ids =
        torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), index).unsqueeze(0);
    batch.aux_hidden = aux.to(device(), torch::kFloat32).unsqueeze(0);
    BlockAnchors anchors;
    anchors.anchors = torch::full({1, 1}, n - 1, torch::kInt64);
    anchors.keep = torch::ones({1, 1}, torch::kBool);
    const torch::Tensor positions = torch::arange(n - 1, n - 1 + bs, index).unsqueeze(0);
    const torch::Tensor hn = Backbone(batch, anchors, positions, torch::kFloat32, nullptr)[0];
    const int64_t first = dspark ? 0 : 1;
    const int64_t count = std::min(max_tokens, bs - first);
    // Every slot's head logits in one GEMM (one pass over the vocab-wide
    // head); only DSpark's Markov term waits for the previous pick.
    const torch::Tensor head_logits =
        torch::linear(hn.narrow(0, first, count), lm_head_.to(torch::kFloat32));
    torch::Tensor w1, w2;
    if (dspark) {
      w1 = parameter("markov_head.markov_w1.weight");
      w2 = parameter("markov_head.markov_w2.weight").to(torch::kFloat32);
    }
    int64_t prev = ids.back();
    for (int64_t k = 0; k < count; ++k) {
      torch::Tensor logits = head_logits[k];
      if (dspark) logits = logits + torch::linear(w1[prev].to(torch::kFloat32), w2);
      const int32_t token = chooser.Choose(logits.cpu());
      tokens->push_back(token);
      prev = token;
    }
  });
}

}  // namespace specstream::student
