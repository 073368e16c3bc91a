#include "student/draft_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/context_parallel.h"
#include "student/eagle3_alignment.h"
#include "student/export.h"
#include "student/metrics_sink.h"
#include "student/soft_cross_entropy.h"
#include "student/ttt_attention.h"

namespace specstream::student {

DraftShape TargetDraftShape(const HfModelConfig& target, int64_t captures) {
  DraftShape shape;
  shape.hidden_size = shape.target_hidden_size = target.hidden_size;
  shape.num_captures = captures;
  shape.intermediate_size = target.intermediate_size;
  shape.num_attention_heads = target.num_attention_heads;
  shape.num_key_value_heads = target.num_key_value_heads;
  shape.head_dim = target.head_dim;
  shape.draft_vocab_size = shape.target_vocab_size = target.vocab_size;
  shape.rms_norm_eps = target.rms_norm_eps;
  shape.rope_theta = target.rope_theta;
  shape.rope_scaling = target.rope_scaling;
  shape.max_position_embeddings = target.max_position_embeddings;
  return shape;
}

absl::Status ValidateEagle3Options(const Eagle3Options& options) {
  if (options.fc_norm && options.norm_before_fc) {
    return absl::InvalidArgumentError(
        "model.draft.fc_norm and model.draft.norm_before_fc are both set: a draft normalises "
        "its captures per layer (fc_norm) or over their concatenation (norm_before_fc), not "
        "both");
  }
  return absl::OkStatus();
}

torch::Tensor HfInitNormal(at::Generator& gen, const std::vector<int64_t>& shape) {
  return at::normal(0.0, 0.02, shape, gen, torch::TensorOptions().dtype(torch::kFloat32));
}

absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> LoadTargetEmbeddings(
    const std::string& target_dir, int64_t vocab, int64_t hidden, torch::Device device) {
  ASSIGN_OR_RETURN(auto checkpoint, CheckpointTensors::Open(target_dir));
  ASSIGN_OR_RETURN(TensorView embed_view, checkpoint->Get("model.embed_tokens.weight"));
  if (embed_view.shape != std::vector<int64_t>{vocab, hidden}) {
    return absl::InvalidArgumentError(
        "target model.embed_tokens.weight does not match [vocab, hidden]");
  }
  torch::Tensor embed, head;
  ASSIGN_OR_RETURN(embed, TensorFromView(embed_view, torch::kFloat32, device));
  head = embed;
  if (checkpoint->Contains("lm_head.weight")) {
    ASSIGN_OR_RETURN(TensorView head_view, checkpoint->Get("lm_head.weight"));
    if (head_view.shape != std::vector<int64_t>{vocab, hidden}) {
      return absl::InvalidArgumentError("target lm_head.weight does not match [vocab, hidden]");
    }
    ASSIGN_OR_RETURN(head, TensorFromView(head_view, torch::kFloat32, device));
  }
  return std::make_pair(embed, head);
}

torch::Tensor& Eagle3Draft::Add(const std::string& name, torch::Tensor value) {
  index_[name] = params_.size();
  params_.emplace_back(name, value.to(torch::kFloat32).contiguous().set_requires_grad(true));
  return params_.back().second;
}

torch::Tensor& Eagle3Draft::parameter(const std::string& name) {
  return params_.at(index_.at(name)).second;
}

absl::StatusOr<std::unique_ptr<Eagle3Draft>> Eagle3Draft::Create(
    const DraftShape& shape, const std::string& target_dir, const VocabMap& vocab_map,
    uint64_t seed, bool need_full_lm_head, torch::Device device, const Eagle3Options& options) {
  const DraftShape& s = shape;
  RETURN_IF_ERROR(ValidateEagle3Options(options));
  auto positive = [](const char* field, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("draft ", field, " must be positive, got ", v));
  };
  RETURN_IF_ERROR(positive("hidden_size", s.hidden_size));
  RETURN_IF_ERROR(positive("intermediate_size", s.intermediate_size));
  RETURN_IF_ERROR(positive("num_attention_heads", s.num_attention_heads));
  RETURN_IF_ERROR(positive("num_key_value_heads", s.num_key_value_heads));
  RETURN_IF_ERROR(positive("head_dim", s.head_dim));
  if (s.num_attention_heads % s.num_key_value_heads != 0) {
    return absl::InvalidArgumentError("draft num_key_value_heads must divide num_attention_heads");
  }
  if (s.hidden_size != s.target_hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft hidden_size ", s.hidden_size, " must equal the target's ",
                     s.target_hidden_size, " (the draft reuses the target's embeddings)"));
  }
  if (vocab_map.draft_vocab() != s.draft_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("vocab map has ", vocab_map.draft_vocab(),
                                                   " draft ids but draft_vocab_size is ",
                                                   s.draft_vocab_size));
  }
  if (vocab_map.target_vocab() != s.target_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("vocab map covers ", vocab_map.target_vocab(),
                                                   " target ids but the target vocab is ",
                                                   s.target_vocab_size));
  }
  std::unique_ptr<Eagle3Draft> draft(new Eagle3Draft());
  draft->shape_ = s;
  draft->options_ = options;
  draft->vocab_map_ = vocab_map;
  const int64_t H = s.hidden_size, Ht = s.target_hidden_size, V = s.target_vocab_size;

  ASSIGN_OR_RETURN(auto frozen, LoadTargetEmbeddings(target_dir, V, Ht, device));
  draft->embed_ = frozen.first;
  const torch::Tensor lm_head = frozen.second;
  torch::Tensor used = torch::tensor(vocab_map.used, torch::kInt64).to(device);
  draft->teacher_head_ = lm_head.index_select(0, used).contiguous();
  if (need_full_lm_head) draft->full_lm_head_ = lm_head;
  draft->t2d_ = torch::tensor(std::vector<int64_t>(vocab_map.t2d.begin(), vocab_map.t2d.end()))
                    .to(device, torch::kBool);

  // HF-style init: linears N(0, 0.02), norms 1; the draft lm_head starts from
  // the target's rows of the draft vocab (the distribution it imitates).
  auto gen = at::detail::createCPUGenerator(seed);
  auto normal = [&](const std::vector<int64_t>& dims) { return HfInitNormal(gen, dims); };
  const int64_t A = s.num_attention_heads, B = s.num_key_value_heads, D = s.head_dim;
  const int64_t I = s.intermediate_size;
  draft->Add("fc.weight", normal({H, s.num_captures * Ht}));
  draft->Add("midlayer.self_attn.q_proj.weight", normal({A * D, 2 * H}));
  draft->Add("midlayer.self_attn.k_proj.weight", normal({B * D, 2 * H}));
  draft->Add("midlayer.self_attn.v_proj.weight", normal({B * D, 2 * H}));
  draft->Add("midlayer.self_attn.o_proj.weight", normal({H, A * D}));
  draft->Add("midlayer.mlp.gate_proj.weight", normal({I, H}));
  draft->Add("midlayer.mlp.up_proj.weight", normal({I, H}));
  draft->Add("midlayer.mlp.down_proj.weight", normal({H, I}));
  draft->Add("midlayer.input_layernorm.weight", torch::ones({H}));
  draft->Add("midlayer.hidden_norm.weight", torch::ones({H}));
  draft->Add("midlayer.post_attention_layernorm.weight", torch::ones({H}));
  draft->Add("norm.weight", torch::ones({H}));
  draft->Add("lm_head.weight", draft->teacher_head_.clone());
  // EAGLE 3.1's norms come last, so that an EAGLE-3 draft draws exactly the
  // same initial weights with or without them.
  if (options.fc_norm) {
    for (int64_t i = 0; i < s.num_captures; ++i) {
      draft->Add(FcNormTensorName(i), torch::ones({Ht}));
    }
  }
  if (options.norm_before_fc) draft->Add(kNormBeforeFcTensor, torch::ones({s.num_captures * Ht}));
  if (options.parallel_drafting) {
    if (options.mask_token_id < 0 || options.mask_token_id >= V) {
      return absl::InvalidArgumentError(absl::StrCat("model.draft.mask_token_id ",
                                                     options.mask_token_id,
                                                     " is not a row of the target's embedding "
                                                     "table [0, ",
                                                     V, ")"));
    }
    // A stand-in for the captures, so of their scale: N(0, 1).
    draft->Add(kMaskHiddenTensor, at::normal(0.0, 1.0, {1, 1, s.num_captures * Ht}, gen,
                                             torch::TensorOptions().dtype(torch::kFloat32)));
  }
  for (auto& [name, p] : draft->params_) {
    p = p.detach().to(device).set_requires_grad(true);
  }
  ASSIGN_OR_RETURN(auto rotary,
                   nn::Rotary::Create(D, s.rope_theta, s.rope_scaling, s.max_position_embeddings));
  draft->rotary_.emplace(std::move(rotary));
  return draft;
}

torch::Tensor Eagle3Draft::FcInput(const torch::Tensor& aux, torch::Dtype cd) {
  const double eps = shape_.rms_norm_eps;
  torch::Tensor x = aux.to(cd);
  if (options_.fc_norm) {
    const int64_t ht = shape_.target_hidden_size;
    std::vector<torch::Tensor> parts;
    for (int64_t i = 0; i < shape_.num_captures; ++i) {
      parts.push_back(nn::RmsNorm(x.narrow(-1, i * ht, ht),
                                  parameter(FcNormTensorName(i)).to(cd), eps));
    }
    x = torch::cat(parts, -1);
  } else if (options_.norm_before_fc) {
    x = nn::RmsNorm(x, parameter(kNormBeforeFcTensor).to(cd), eps);
  }
  return torch::linear(x, parameter("fc.weight").to(cd));
}

torch::Tensor Eagle3Draft::NextHidden(const torch::Tensor& h, const torch::Tensor& norm) const {
  return options_.norm_output ? nn::RmsNorm(h, norm, shape_.rms_norm_eps) : h;
}

torch::Tensor Eagle3Draft::TeacherArgmax(const DraftBatch& batch) const {
  if (batch.target_ids.defined()) return batch.target_ids.to(torch::kInt64);
  // Row chunks keep the [rows, V] logits small.
  torch::NoGradGuard no_grad;
  torch::Tensor last = batch.last_hidden.to(torch::kFloat32);
  const int64_t b = last.size(0), t = last.size(1);
  torch::Tensor flat = last.reshape({b * t, -1});
  torch::Tensor out = torch::empty({b * t}, flat.options().dtype(torch::kInt64));
  constexpr int64_t kRows = 256;
  for (int64_t r = 0; r < b * t; r += kRows) {
    int64_t rows = std::min(kRows, b * t - r);
    out.narrow(0, r, rows).copy_(torch::linear(flat.narrow(0, r, rows), full_lm_head_).argmax(-1));
  }
  return out.view({b, t});
}

torch::Tensor Eagle3Draft::InDraftVocab(const DraftBatch& batch) const {
  return t2d_.index({TeacherArgmax(batch)});
}

torch::Tensor Eagle3Draft::ValidMask(const DraftBatch& batch, const torch::Tensor& in_vocab, int k,
                                     const torch::Tensor& keep) const {
  torch::Tensor valid = Eagle3ValidMask(batch.lengths, batch.offset, batch.loss_mask, in_vocab, k,
                                        batch.aux_hidden.size(1));
  if (options_.parallel_drafting && k > 0) {
    valid = valid.logical_and(keep[k].to(valid.device()));
  }
  return valid;
}

torch::Tensor Eagle3Draft::CountValid(const DraftBatch& batch, int ttt_steps,
                                      const torch::Tensor& keep) const {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(!options_.parallel_drafting || ttt_steps == 1 || keep.defined(),
              "a P-EAGLE draft counts its trained rows from a COD plan");
  if (!options_.parallel_drafting) {
    return Eagle3ValidCounts(batch.lengths, batch.offset, batch.loss_mask, InDraftVocab(batch),
                             ttt_steps, batch.aux_hidden.size(1));
  }
  const torch::Tensor in_vocab = InDraftVocab(batch);
  std::vector<torch::Tensor> counts;
  for (int k = 0; k < ttt_steps; ++k) {
    counts.push_back(ValidMask(batch, in_vocab, k, keep).sum().to(torch::kInt64));
  }
  return torch::stack(counts);
}

torch::Tensor Eagle3Draft::MaskEmbedding(torch::Dtype cd) const {
  return embed_.narrow(0, options_.mask_token_id, 1).to(cd);
}

torch::Tensor Eagle3Draft::MaskHidden(torch::Dtype cd) {
  return FcInput(parameter(kMaskHiddenTensor).view({1, -1}), cd);
}

absl::StatusOr<TttOutputs> Eagle3Draft::Forward(const DraftBatch& batch, int ttt_steps,
                                                const torch::Tensor& valid_denominators,
                                                torch::Dtype cd, const DraftParallel& parallel,
                                                const torch::Tensor& keep) {
  if (valid_denominators.dim() != 1 || valid_denominators.size(0) != ttt_steps) {
    return absl::InvalidArgumentError("one valid-position denominator per TTT step is required");
  }
  const bool parallel_drafting = options_.parallel_drafting;
  if (parallel_drafting && ttt_steps > 1 &&
      (!keep.defined() || keep.dim() != 3 || keep.size(0) != ttt_steps ||
       keep.size(1) != batch.aux_hidden.size(0) || keep.size(2) != batch.aux_hidden.size(1))) {
    return absl::InvalidArgumentError(
        "a P-EAGLE forward needs its COD plan: keep [K, B, T] over the batch's own rows");
  }
  proposal_cache_ = {};  // training may change the weights the cache was made with
  TttOutputs out;
  absl::Status status = CatchTorch("draft forward", [&] {
    const DraftShape& s = shape_;
    // t: this batch's own rows (the whole sequence without CP); te: rows of
    // the per-token inputs, t plus the halo.
    const int64_t b = batch.input_ids.size(0), t = batch.aux_hidden.size(1);
    const int64_t te = batch.input_ids.size(1);
    TORCH_CHECK(te >= t, "draft forward: per-token inputs have fewer rows than aux_hidden");
    const int64_t longest =
        b > 0 ? *std::max_element(batch.host_lengths.begin(), batch.host_lengths.end()) : 0;
    TORCH_CHECK(static_cast<int64_t>(batch.host_lengths.size()) == b,
                "draft forward: host_lengths has ", batch.host_lengths.size(), " entries for ", b,
                " samples");
    const int64_t A = s.num_attention_heads, B = s.num_key_value_heads, D = s.head_dim;
    const double eps = s.rms_norm_eps;
    auto P = [&](const char* name) { return parameter(name).to(cd); };
    torch::Tensor q_w = P("midlayer.self_attn.q_proj.weight");
    torch::Tensor k_w = P("midlayer.self_attn.k_proj.weight");
    torch::Tensor v_w = P("midlayer.self_attn.v_proj.weight");
    torch::Tensor o_w = P("midlayer.self_attn.o_proj.weight");
    torch::Tensor gate = P("midlayer.mlp.gate_proj.weight");
    torch::Tensor up = P("midlayer.mlp.up_proj.weight");
    torch::Tensor down = P("midlayer.mlp.down_proj.weight");
    torch::Tensor in_ln = P("midlayer.input_layernorm.weight");
    torch::Tensor hid_ln = P("midlayer.hidden_norm.weight");
    torch::Tensor post_ln = P("midlayer.post_attention_layernorm.weight");
    torch::Tensor norm = P("norm.weight");
    torch::Tensor head = P("lm_head.weight");

    // Teacher distribution over the draft vocab, fp32, no grad.
    torch::Tensor teacher_logp, teacher_argmax, in_vocab;
    {
      torch::NoGradGuard no_grad;
      // log_softmax in place: one [rows, draft_vocab] fp32 buffer.
      torch::Tensor logits = torch::linear(batch.last_hidden.to(torch::kFloat32), teacher_head_);
      teacher_argmax = logits.argmax(-1);
      teacher_logp = logits.sub_(logits.logsumexp(-1, /*keepdim=*/true));
      in_vocab = InDraftVocab(batch);
    }
    torch::Tensor h = FcInput(batch.aux_hidden, cd);
    auto [cos_all, sin_all] = rotary_->CosSin(
        torch::arange(batch.offset, batch.offset + t + ttt_steps, batch.lengths.options()), cd);
    torch::Tensor k0, v0;
    std::vector<torch::Tensor> diag_k, diag_v;
    TttAttentionOptions attention;
    attention.scale = 1.0 / std::sqrt(static_cast<double>(D));
    // Step k's loss weighs kTttLossDecay^k / max(1, global valid count at k)
    // (P-EAGLE: 1 / max(1, the count over every depth)), the division in
    // float64 on the device (no count is read back).
    const torch::Tensor denominators =
        parallel_drafting
            ? valid_denominators.sum().clamp_min(1).to(torch::kFloat64).expand({ttt_steps})
            : valid_denominators.clamp_min(1).to(torch::kFloat64);
    torch::Tensor mask_embed, mask_row, mask_hidden;
    if (parallel_drafting) {
      mask_embed = MaskEmbedding(cd).view({1, 1, -1}).expand({b, t, -1});
      mask_row = MaskHidden(cd);  // [1, H]
      mask_hidden = mask_row.view({1, 1, -1}).expand({b, t, -1});
    }
    torch::Tensor weighted = torch::zeros({}, h.options().dtype(torch::kFloat32));
    const torch::Tensor none = torch::zeros({}, valid_denominators.options());
    std::vector<torch::Tensor> loss_sums, corrects, valids;
    double decay = 1.0;

    for (int k = 0; k < ttt_steps; ++k) {
      torch::Tensor embeds;
      if (parallel_drafting && k > 0) {
        embeds = mask_embed;
        h = mask_hidden;
      } else {
        torch::Tensor ids = Ahead(batch.input_ids, k + 1, t);
        embeds = embed_.index_select(0, ids.reshape({-1})).view({b, t, -1}).to(cd);
      }
      torch::Tensor x =
          torch::cat({nn::RmsNorm(embeds, in_ln, eps), nn::RmsNorm(h, hid_ln, eps)}, -1);
      torch::Tensor q = torch::linear(x, q_w).view({b, t, A, D}).transpose(1, 2);
      torch::Tensor kk = torch::linear(x, k_w).view({b, t, B, D}).transpose(1, 2);
      torch::Tensor vv = torch::linear(x, v_w).view({b, t, B, D}).transpose(1, 2);
      torch::Tensor cos = cos_all.narrow(0, k, t), sin = sin_all.narrow(0, k, t);
      q = nn::ApplyRotary(q, cos, sin).contiguous();
      kk = nn::ApplyRotary(kk, cos, sin).contiguous();
      vv = vv.contiguous();
      // Ulysses: from here to the output projection each rank holds a slice
      // of the heads over its Ulysses group's chunk of the sequence.
      // One all-to-all carries q, k and v (each rank's slice of all three),
      // so every step issues the same collectives in the same order.
      if (parallel.ulysses != nullptr) {
        const int64_t u = parallel.ulysses->getSize();
        torch::Tensor qkv =
            torch::cat({q.reshape({b, u, A / u, t, D}), kk.reshape({b, u, B / u, t, D}),
                        vv.reshape({b, u, B / u, t, D})},
                       2);
        qkv = SequenceToHeads(qkv.reshape({b, -1, t, D}), *parallel.ulysses);
        q = qkv.narrow(1, 0, A / u).contiguous();
        kk = qkv.narrow(1, A / u, B / u).contiguous();
        vv = qkv.narrow(1, A / u + B / u, B / u).contiguous();
      }
      torch::Tensor kd, vd;
      if (k == 0) {
        k0 = kk;
        v0 = vv;
      } else {
        diag_k.push_back(kk);
        diag_v.push_back(vv);
        kd = torch::stack(diag_k);
        vd = torch::stack(diag_v);
      }
      torch::Tensor a;
      if (parallel.ring != nullptr) {
        RingAttentionOptions ring;
        ring.scale = attention.scale;
        ring.block_size = attention.block_size;
        a = RingTttAttention(q, k0, v0, kd, vd, *parallel.ring, ring);
      } else {
        a = TttAttention(q, k0, v0, kd, vd, attention);
      }
      if (parallel.ulysses != nullptr) a = HeadsToSequence(a, *parallel.ulysses);
      a = a.transpose(1, 2).reshape({b, t, A * D});
      // Adds step k's soft cross-entropy over rows whose post-norm hidden
      // states, teacher log-probs and argmax, and validity are given (any
      // leading shape).
      auto record = [&](const torch::Tensor& normed, const torch::Tensor& logp,
                        const torch::Tensor& argmax, const torch::Tensor& valid) {
        SoftCrossEntropyResult ce =
            FusedSoftCrossEntropy(normed, head, logp, argmax, valid.to(torch::kFloat32));
        const torch::Tensor scale =
            torch::full({}, parallel_drafting ? 1.0 : decay, denominators.options()) /
            denominators[k];
        weighted = weighted + ce.loss * scale.to(torch::kFloat32);
        corrects.push_back(ce.correct);
        valids.push_back(valid.sum());
        loss_sums.push_back(ce.loss.detach().to(torch::kFloat64));
      };
      auto record_none = [&](const torch::Tensor& output) {
        // Nothing to predict from these rows, but the step stays in the
        // graph: under CP every rank must run the same backward collectives.
        weighted = weighted + output.sum().to(torch::kFloat32) * 0.0;
        corrects.push_back(none);
        valids.push_back(none);
        loss_sums.push_back(none.to(torch::kFloat64));
      };
      // Row i (global position offset + i) predicts position offset+i+k+1:
      // only rows before longest-k-1 can be valid. The teacher rows needed,
      // up to rows+k+1, lie within the halo.
      const int64_t rows = std::clamp<int64_t>(longest - batch.offset - k - 1, 0, t);

      if (parallel_drafting && k > 0) {
        // P-EAGLE: no later depth reads this one's output, so only the rows
        // the plan keeps go on past the attention (their indices come from
        // the host plan: nothing is read back from the device).
        std::vector<int64_t> own, teacher;
        const torch::Tensor kept = keep[k].to(torch::kCPU).contiguous();
        const bool* kp = kept.data_ptr<bool>();
        for (int64_t bi = 0; bi < b; ++bi) {
          for (int64_t p = 0; p < rows; ++p) {
            if (!kp[bi * t + p]) continue;
            own.push_back(bi * t + p);
            teacher.push_back(bi * te + p + k + 1);
          }
        }
        if (own.empty()) {
          record_none(a);
          continue;
        }
        const auto index_options = batch.lengths.options().dtype(torch::kInt64);
        const torch::Tensor own_index =
            torch::tensor(own, torch::kInt64).to(index_options.device());
        const torch::Tensor teacher_index =
            torch::tensor(teacher, torch::kInt64).to(index_options.device());
        const int64_t n = static_cast<int64_t>(own.size());
        torch::Tensor h_rows =
            mask_row.expand({n, -1}) +
            torch::linear(a.reshape({b * t, A * D}).index_select(0, own_index), o_w);
        h_rows = h_rows + nn::SwiGluMlp(nn::RmsNorm(h_rows, post_ln, eps), gate, up, down);
        const int64_t v = teacher_logp.size(-1);
        record(nn::RmsNorm(h_rows, norm, eps).unsqueeze(0),
               teacher_logp.reshape({b * te, v}).index_select(0, teacher_index).unsqueeze(0),
               teacher_argmax.reshape({b * te}).index_select(0, teacher_index).unsqueeze(0),
               ValidMask(batch, in_vocab, k, keep)
                   .reshape({b * t})
                   .index_select(0, own_index)
                   .unsqueeze(0));
        continue;
      }

      torch::Tensor h_next = h + torch::linear(a, o_w);
      h_next = h_next + nn::SwiGluMlp(nn::RmsNorm(h_next, post_ln, eps), gate, up, down);
      if (rows > 0) {
        record(nn::RmsNorm(h_next, norm, eps).narrow(1, 0, rows),
               teacher_logp.narrow(1, k + 1, rows), teacher_argmax.narrow(1, k + 1, rows),
               ValidMask(batch, in_vocab, k, keep).narrow(1, 0, rows));
      } else {
        record_none(h_next);
      }
      decay *= kTttLossDecay;
      h = NextHidden(h_next, norm);
    }
    out.weighted_loss = weighted;
    out.loss_sum = torch::stack(loss_sums);
    out.correct = torch::stack(corrects);
    out.valid = torch::stack(valids);
  });
  if (!status.ok()) return status;
  return out;
}

int64_t Eagle3Draft::CachedProposalRows(const std::vector<int32_t>& ids,
                                        const torch::Tensor& aux) const {
  // Row j's step-0 key reads ids[j + 1] and aux[j] (no row reads ids[0]):
  // it still holds while both are what they were. The last row is always
  // run again: its hidden state starts the chain.
  const int64_t rows = static_cast<int64_t>(ids.size()) - 1;
  int64_t m = std::min<int64_t>(proposal_cache_.rows, rows - 1);
  for (int64_t j = 0; j < m; ++j) {
    if (proposal_cache_.ids[j + 1] != ids[j + 1]) {
      m = j;
      break;
    }
  }
  if (m > 0 && !torch::equal(proposal_cache_.aux.narrow(0, 0, m),
                             aux.narrow(0, 0, m).to(proposal_cache_.aux.device(), torch::kFloat32))) {
    return 0;
  }
  return m;
}

absl::Status Eagle3Draft::Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                                  int64_t max_tokens, spec::TokenChooser& chooser,
                                  std::vector<int32_t>* tokens) {
  RETURN_IF_ERROR(spec::CheckProposalInputs(ids, aux, "eagle3 propose"));
  const int64_t n = static_cast<int64_t>(ids.size());
  return CatchTorch("eagle3 propose", [&] {
    torch::NoGradGuard no_grad;
    const DraftShape& s = shape_;
    const int64_t A = s.num_attention_heads, KV = s.num_key_value_heads, D = s.head_dim;
    const int64_t rows = n - 1, r = rows - 1, group = A / KV;
    const double eps = s.rms_norm_eps;
    const auto f32 = torch::kFloat32;
    auto P = [&](const char* name) { return parameter(name).to(f32); };
    const torch::Tensor q_w = P("midlayer.self_attn.q_proj.weight");
    const torch::Tensor k_w = P("midlayer.self_attn.k_proj.weight");
    const torch::Tensor v_w = P("midlayer.self_attn.v_proj.weight");
    const torch::Tensor in_ln = P("midlayer.input_layernorm.weight");
    const torch::Tensor hid_ln = P("midlayer.hidden_norm.weight");
    const torch::Tensor norm = P("norm.weight");
    const torch::Tensor used =
        torch::tensor(vocab_map_.d2t, torch::kInt64).to(device()) +
        torch::arange(s.draft_vocab_size,
                      torch::TensorOptions().dtype(torch::kInt64).device(device()));
    const torch::Tensor pos = torch::arange(0, rows + max_tokens, used.options());
    auto [cos_all, sin_all] = rotary_->CosSin(pos, f32);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    // The layer's input of rows at positions [first, first + m): [m, 2H].
    auto layer_input = [&](const torch::Tensor& embeds, const torch::Tensor& hidden) {
      return torch::cat({nn::RmsNorm(embeds.to(f32), in_ln, eps), nn::RmsNorm(hidden, hid_ln, eps)},
                        -1);
    };
    auto heads = [&](const torch::Tensor& x, const torch::Tensor& w, int64_t count, int64_t first,
                     bool rotate) {
      const int64_t m = x.size(0);
      torch::Tensor y = torch::linear(x, w).view({m, count, D}).transpose(0, 1);
      return rotate ? nn::ApplyRotary(y, cos_all.narrow(0, first, m), sin_all.narrow(0, first, m))
                    : y;
    };
    // Attention outputs [m, A·D] -> the layer's outputs [m, H] and their
    // logits over the target vocab [m, V] (-inf outside the draft vocab).
    auto finish = [&](const torch::Tensor& attn, const torch::Tensor& h_prev,
                      torch::Tensor* h_next) {
      torch::Tensor h_out = h_prev + torch::linear(attn, P("midlayer.self_attn.o_proj.weight"));
      h_out = h_out +
              nn::SwiGluMlp(nn::RmsNorm(h_out, P("midlayer.post_attention_layernorm.weight"), eps),
                            P("midlayer.mlp.gate_proj.weight"), P("midlayer.mlp.up_proj.weight"),
                            P("midlayer.mlp.down_proj.weight"));
      *h_next = h_out;
      torch::Tensor draft_logits =
          torch::linear(nn::RmsNorm(h_out, norm, eps), P("lm_head.weight"));
      torch::Tensor logits =
          torch::full({h_out.size(0), s.target_vocab_size}, -std::numeric_limits<float>::infinity(),
                      draft_logits.options());
      logits.index_copy_(1, used, draft_logits);
      return logits;
    };

    // Step 0: every row's keys and values, the last row's query. Rows whose
    // ids and captures are unchanged since the last proposal (the committed
    // prefix of a decode) keep their keys from then: only the new rows run.
    const int64_t cached = CachedProposalRows(ids, aux);
    const int64_t fresh = rows - cached;
    std::vector<int64_t> next_ids(ids.begin() + 1 + cached, ids.end());
    const torch::Tensor aux_rows = aux.to(device(), f32);
    const torch::Tensor h = FcInput(aux_rows.narrow(0, cached, fresh), f32);  // [fresh, H]
    const torch::Tensor x0 =
        layer_input(embed_.index_select(0, torch::tensor(next_ids, used.options())), h);
    torch::Tensor kk = heads(x0, k_w, KV, cached, true);
    torch::Tensor vv = heads(x0, v_w, KV, cached, false);
    torch::Tensor keys = cached > 0 ? torch::cat({proposal_cache_.keys.narrow(1, 0, cached), kk}, 1)
                                    : kk;  // [KV, rows, D]
    torch::Tensor values =
        cached > 0 ? torch::cat({proposal_cache_.values.narrow(1, 0, cached), vv}, 1) : vv;
    proposal_cache_.ids = ids;
    proposal_cache_.aux = aux_rows;
    proposal_cache_.keys = keys;
    proposal_cache_.values = values;
    proposal_cache_.rows = rows;
    const torch::Tensor q0 = heads(x0.narrow(0, fresh - 1, 1), q_w, A, r, true);  // [A, 1, D]
    const torch::Tensor h0 = h.narrow(0, fresh - 1, 1);

    if (options_.parallel_drafting && max_tokens > 0) {
      // Depths 1..m at positions r+1..r+m, all from the mask token and
      // fc(mask_hidden); depth j attends to every row's step-0 keys and to
      // depths 1..j.
      const int64_t m = max_tokens - 1;
      torch::Tensor q = q0, h_prev = h0;
      if (m > 0) {
        const torch::Tensor mask_h = MaskHidden(f32).expand({m, -1});
        const torch::Tensor xm = layer_input(MaskEmbedding(f32).expand({m, -1}), mask_h);
        q = torch::cat({q0, heads(xm, q_w, A, r + 1, true)}, 1);
        keys = torch::cat({keys, heads(xm, k_w, KV, r + 1, true)}, 1);
        values = torch::cat({values, heads(xm, v_w, KV, r + 1, false)}, 1);
        h_prev = torch::cat({h0, mask_h}, 0);
      }
      // Query j (depth j) sees key rows + i (depth i + 1) only for i < j.
      const torch::Tensor depth = torch::arange(m + 1, used.options()).unsqueeze(1);
      const torch::Tensor key_depth =
          (torch::arange(rows + m, used.options()) - rows + 1).clamp_min(0).unsqueeze(0);
      const torch::Tensor hidden = key_depth.gt(depth);  // [m + 1, rows + m]
      torch::Tensor scores =
          torch::matmul(q.reshape({KV, group, m + 1, D}), keys.unsqueeze(1).transpose(2, 3))
              .mul_(scale)
              .masked_fill_(hidden, -std::numeric_limits<float>::infinity());
      torch::Tensor a = torch::matmul(torch::softmax(scores, -1), values.unsqueeze(1));
      a = a.permute({2, 0, 1, 3}).reshape({m + 1, A * D});  // [depths, A·D]
      torch::Tensor h_next;
      const torch::Tensor logits = finish(a, h_prev, &h_next).cpu();
      for (int64_t j = 0; j <= m; ++j) tokens->push_back(chooser.Choose(logits[j]));
      return;
    }

    torch::Tensor q = q0, h_row = h0;
    for (int64_t k = 0; k < max_tokens; ++k) {
      if (k > 0) {
        // Step k: the last row only, at position r + k.
        const torch::Tensor x = layer_input(
            embed_.index_select(
                0, torch::tensor({static_cast<int64_t>(tokens->back())}, used.options())),
            h_row);
        q = heads(x, q_w, A, r + k, true);
        keys = torch::cat({keys, heads(x, k_w, KV, r + k, true)}, 1);
        values = torch::cat({values, heads(x, v_w, KV, r + k, false)}, 1);
      }
      torch::Tensor scores =
          torch::matmul(q.reshape({KV, group, D}), keys.transpose(1, 2)).mul_(scale);
      torch::Tensor a = torch::matmul(torch::softmax(scores, -1), values);  // [KV, group, D]
      torch::Tensor h_next;
      const torch::Tensor logits = finish(a.reshape({1, A * D}), h_row, &h_next);
      tokens->push_back(chooser.Choose(logits[0].cpu()));
      h_row = NextHidden(h_next, norm);
    }
  });
}

}  // namespace specstream::student
