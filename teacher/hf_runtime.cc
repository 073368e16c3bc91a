#include "teacher/hf_runtime.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"
#include "teacher/model_weights.h"

namespace specstream::teacher {

HfRuntime::~HfRuntime() = default;

absl::StatusOr<std::unique_ptr<HfRuntime>> HfRuntime::Create(HfRuntimeOptions options) {
  TuneAllocatorForTensors();
  std::unique_ptr<HfRuntime> runtime(new HfRuntime());
  runtime->options_ = std::move(options);
  RETURN_IF_ERROR(runtime->Load());
  return runtime;
}

absl::Status HfRuntime::Load() {
  ASSIGN_OR_RETURN(LoadedModel model, LoadTargetModel(options_, "hf", /*allow_moe=*/false));
  config_ = std::move(model.config);
  description_ = std::move(model.description);
  dtype_ = description_.dtype;
  device_ = model.device;
  weights_ = std::make_unique<ModelWeights>(std::move(model.weights));
  const HfModelConfig& c = config_;
  ASSIGN_OR_RETURN(auto rotary, nn::Rotary::Create(c.head_dim, c.rope_theta, c.rope_scaling,
                                                   c.max_position_embeddings));
  rotary_.emplace(std::move(rotary));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SequenceCapture>> HfRuntime::Compute(
    const torch::Tensor& ids, const std::vector<int64_t>& lengths, bool want_target_ids,
    const CaptureLayerIds& capture_ids) {
  const int64_t batch = static_cast<int64_t>(lengths.size());
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  torch::Tensor padded = torch::zeros({batch, longest}, torch::kInt64);
  int64_t offset = 0;
  for (int64_t b = 0; b < batch; ++b) {
    padded[b].narrow(0, 0, lengths[b]).copy_(ids.narrow(0, offset, lengths[b]));
    offset += lengths[b];
  }
  return ComputePadded(padded.to(device_), lengths, want_target_ids, capture_ids, nullptr);
}

absl::StatusOr<std::vector<torch::Tensor>> HfRuntime::HiddenStates(
    const std::vector<int32_t>& ids) {
  ForwardRequest request;
  request.sequences = {ids};
  RETURN_IF_ERROR(ValidateForwardRequest(request, config_));
  torch::Tensor input =
      torch::tensor(std::vector<int64_t>(ids.begin(), ids.end())).unsqueeze(0).to(device_);
  std::vector<torch::Tensor> hidden;
  auto result = ComputePadded(input, {static_cast<int64_t>(ids.size())}, false,
                              description_.capture_layer_ids, &hidden);
  if (!result.ok()) return result.status();
  return hidden;
}

torch::Tensor HfRuntime::Layer(int64_t i, const torch::Tensor& h_in, const torch::Tensor& cos,
                               const torch::Tensor& sin, const AttendFn& attend) {
  const HfModelConfig& c = config_;
  const LayerWeights& l = weights_->layers[i];
  const int64_t batch = h_in.size(0), t = h_in.size(1), d = c.head_dim;
  const int64_t q_heads = c.num_attention_heads / options_.tp_size;
  const int64_t kv_heads = c.num_key_value_heads / options_.tp_size;
  const double eps = c.rms_norm_eps;
  auto reduce = [&](torch::Tensor& x) {
    if (options_.tp_size > 1) {
      absl::Status s = AllReduceSum(ActivationGroup(), x);
      ThrowIfError(s);
    }
  };
  torch::Tensor x = nn::RmsNorm(h_in, l.input_norm, eps);
  torch::Tensor q = nn::Linear(x, l.q, l.q_bias).view({batch, t, q_heads, d});
  torch::Tensor k = nn::Linear(x, l.k, l.k_bias).view({batch, t, kv_heads, d});
  torch::Tensor v = nn::Linear(x, l.v, l.v_bias).view({batch, t, kv_heads, d});
  if (l.q_norm.defined()) {
    q = nn::RmsNorm(q, l.q_norm, eps);
    k = nn::RmsNorm(k, l.k_norm, eps);
  }
  q = nn::ApplyRotary(q.transpose(1, 2), cos, sin);
  k = nn::ApplyRotary(k.transpose(1, 2), cos, sin);
  torch::Tensor a = attend(i, q, k, v.transpose(1, 2));
  a = torch::linear(a.transpose(1, 2).reshape({batch, t, q_heads * d}), l.o);
  reduce(a);
  if (l.o_bias.defined()) a = a + l.o_bias;
  torch::Tensor h = h_in + a;

  x = nn::RmsNorm(h, l.post_norm, eps);
  torch::Tensor m;
  if (l.gate_bias.defined()) {
    m = torch::linear(
        torch::silu(torch::linear(x, l.gate, l.gate_bias)) * torch::linear(x, l.up, l.up_bias),
        l.down);
  } else {
    m = nn::SwiGluMlp(x, l.gate, l.up, l.down);
  }
  reduce(m);
  if (l.down_bias.defined()) m = m + l.down_bias;
  return h + m;
}

absl::StatusOr<std::vector<SequenceCapture>> HfRuntime::ComputePadded(
    const torch::Tensor& ids, const std::vector<int64_t>& lengths, bool want_target_ids,
    const CaptureLayerIds& capture_ids, std::vector<torch::Tensor>* all_hidden) {
  std::vector<SequenceCapture> out;
  absl::Status status = CatchTorch("hf forward", [&] {
    torch::NoGradGuard no_grad;
    const HfModelConfig& c = config_;
    const int64_t batch = ids.size(0), t = ids.size(1), d = c.head_dim;

    torch::Tensor h = weights_->embed.index_select(0, ids.reshape({-1})).view({batch, t, -1});
    auto [cos, sin] = rotary_->CosSin(torch::arange(t, ids.options()), dtype_);
    // Captures in the order of the ids (which may repeat or be unsorted).
    std::vector<torch::Tensor> ordered(capture_ids.size());
    if (all_hidden) all_hidden->push_back(h[0].clone());
    nn::AttentionOptions attention;
    attention.scale = 1.0 / std::sqrt(static_cast<double>(d));
    attention.max_score_elements = options_.max_score_elements;
    // With padding, attention runs per sequence at its own length: both
    // kernels order their reductions by the key count (the fused one on 2.x,
    // the blockwise one's probabilities x values matmul on 1.13), so over
    // padded keys a row would round differently from the same sequence alone
    // (or packed, as sglang runs it). So a sequence's captures never depend
    // on what it was batched with.
    const bool any_padding =
        std::any_of(lengths.begin(), lengths.end(), [t](int64_t n) { return n < t; });
    const AttendFn attend = [&](int64_t i, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v) {
      attention.sliding_window = weights_->layers[i].sliding_window;
      if (!any_padding) return nn::CausalAttention(q, k, v, attention);
      torch::Tensor a = torch::zeros_like(q);
      for (int64_t b = 0; b < batch; ++b) {
        auto valid = [&](const torch::Tensor& x) {
          return x.narrow(0, b, 1).narrow(2, 0, lengths[b]);
        };
        valid(a).copy_(nn::CausalAttention(valid(q), valid(k), valid(v), attention));
      }
      return a;
    };

    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      h = Layer(i, h, cos, sin, attend);
      if (all_hidden) all_hidden->push_back(h[0].clone());
      for (size_t j = 0; j < capture_ids.size(); ++j) {
        if (capture_ids[j] == i) ordered[j] = h;
      }
    }
    torch::Tensor aux = torch::cat(ordered, -1);
    torch::Tensor last = nn::RmsNorm(h, weights_->norm, c.rms_norm_eps);
    for (int64_t b = 0; b < batch; ++b) {
      SequenceCapture capture;
      capture.aux_hidden = aux[b].narrow(0, 0, lengths[b]).contiguous();
      capture.last_hidden = last[b].narrow(0, 0, lengths[b]).contiguous();
      if (want_target_ids && options_.tp_rank == 0) {
        capture.target_ids = FullVocabArgmax(capture.last_hidden, weights_->lm_head);
      }
      out.push_back(std::move(capture));
    }
  });
  if (!status.ok()) return status;
  return out;
}

void KvCache::Truncate(int64_t new_length) { length = std::clamp<int64_t>(new_length, 0, length); }

void HfRuntime::GrowCache(KvCache& cache, int64_t total) const {
  const HfModelConfig& c = config_;
  const int64_t capacity = cache.keys.empty() ? 0 : cache.keys[0].size(2);
  if (capacity >= total) return;
  // Doubling, so that a sequence decoded a token at a time copies O(T).
  const int64_t grown = std::max<int64_t>(total, std::max<int64_t>(64, 2 * capacity));
  cache.keys.resize(c.num_hidden_layers);
  cache.values.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    for (torch::Tensor* buffer : {&cache.keys[i], &cache.values[i]}) {
      torch::Tensor fresh = torch::zeros({1, c.num_key_value_heads, grown, c.head_dim},
                                         torch::TensorOptions().dtype(dtype_).device(device_));
      if (buffer->defined() && cache.length > 0) {
        fresh.narrow(2, 0, cache.length).copy_(buffer->narrow(2, 0, cache.length));
      }
      *buffer = fresh;
    }
  }
}

torch::Tensor HfRuntime::AttendCached(KvCache& cache, int64_t layer, const torch::Tensor& q,
                                      const torch::Tensor& k, const torch::Tensor& v) const {
  const HfModelConfig& c = config_;
  const int64_t d = c.head_dim, kv_heads = c.num_key_value_heads;
  const int64_t group = c.num_attention_heads / kv_heads;
  const int64_t past = cache.length, n = q.size(2), total = past + n;
  const auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(device_);
  cache.keys[layer].narrow(2, past, n).copy_(k);
  cache.values[layer].narrow(2, past, n).copy_(v);
  torch::Tensor keys = cache.keys[layer].narrow(2, 0, total);
  torch::Tensor values = cache.values[layer].narrow(2, 0, total);
  // New row r (position past + r) sees key j iff j <= past + r and, with a
  // sliding window w, past + r - j < w.
  const torch::Tensor query_pos = torch::arange(past, total, index_options).unsqueeze(1);
  const torch::Tensor key_pos = torch::arange(0, total, index_options).unsqueeze(0);
  torch::Tensor visible = key_pos <= query_pos;
  if (const auto& window = weights_->layers[layer].sliding_window) {
    visible = visible & (query_pos - key_pos < *window);
  }
  // GQA: the query heads of one key/value head as rows [kv, group·n, D].
  torch::Tensor qg = q.reshape({kv_heads, group * n, d});
  torch::Tensor scores =
      torch::matmul(qg, keys[0].transpose(1, 2)).view({kv_heads, group, n, total});
  scores = scores.to(torch::kFloat32)
               .mul_(1.0 / std::sqrt(static_cast<double>(d)))
               .masked_fill_(visible.logical_not(), -std::numeric_limits<float>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1).to(dtype_).view({kv_heads, group * n, total});
  return torch::matmul(probs, values[0]).view({1, kv_heads * group, n, d});
}

absl::StatusOr<SequenceCapture> HfRuntime::Extend(KvCache& cache, const std::vector<int32_t>& ids,
                                                  const CaptureLayerIds& capture_ids) {
  if (options_.tp_size != 1) {
    return absl::FailedPreconditionError("incremental decoding runs on one rank (tp_size 1)");
  }
  const HfModelConfig& c = config_;
  ForwardRequest request;
  request.sequences = {ids};
  request.capture_layer_ids = capture_ids;
  RETURN_IF_ERROR(ValidateForwardRequest(request, c));
  const int64_t n = static_cast<int64_t>(ids.size()), past = cache.length, total = past + n;
  if (c.max_position_embeddings > 0 && total > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("incremental decoding: ", total,
                                                   " positions exceed max_position_embeddings ",
                                                   c.max_position_embeddings));
  }
  const CaptureLayerIds& captures =
      capture_ids.empty() ? description_.capture_layer_ids : capture_ids;
  SequenceCapture out;
  absl::Status status = CatchTorch("hf incremental forward", [&] {
    torch::NoGradGuard no_grad;
    const auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(device_);
    GrowCache(cache, total);
    torch::Tensor input =
        torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), index_options);
    torch::Tensor h = weights_->embed.index_select(0, input).unsqueeze(0);
    auto [cos, sin] = rotary_->CosSin(torch::arange(past, total, index_options), dtype_);
    const AttendFn attend = [&](int64_t i, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v) { return AttendCached(cache, i, q, k, v); };
    std::vector<torch::Tensor> ordered(captures.size());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      h = Layer(i, h, cos, sin, attend);
      for (size_t j = 0; j < captures.size(); ++j) {
        if (captures[j] == i) ordered[j] = h[0];
      }
    }
    out.aux_hidden = torch::cat(ordered, -1).contiguous();
    out.last_hidden = nn::RmsNorm(h[0], weights_->norm, c.rms_norm_eps).contiguous();
  });
  if (!status.ok()) return status;
  cache.length = total;
  return out;
}

absl::StatusOr<torch::Tensor> HfRuntime::DecodeStep(const std::vector<KvCache*>& caches,
                                                    const std::vector<int32_t>& ids) {
  if (options_.tp_size != 1) {
    return absl::FailedPreconditionError("incremental decoding runs on one rank (tp_size 1)");
  }
  const HfModelConfig& c = config_;
  const int64_t batch = static_cast<int64_t>(ids.size());
  if (batch == 0 || caches.size() != ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeStep: ", ids.size(), " ids for ",
                                                   caches.size(), " caches (one each, >= 1)"));
  }
  std::vector<int64_t> positions(batch);
  for (int64_t b = 0; b < batch; ++b) {
    if (ids[b] < 0 || ids[b] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DecodeStep: id ", ids[b], " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
    positions[b] = caches[b]->length;
    if (c.max_position_embeddings > 0 && positions[b] + 1 > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("incremental decoding: ", positions[b] + 1,
                                                     " positions exceed max_position_embeddings ",
                                                     c.max_position_embeddings));
    }
  }
  torch::Tensor last;
  absl::Status status = CatchTorch("hf batched decoding step", [&] {
    torch::NoGradGuard no_grad;
    const auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(device_);
    for (int64_t b = 0; b < batch; ++b) GrowCache(*caches[b], positions[b] + 1);
    torch::Tensor input =
        torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), index_options);
    torch::Tensor h = weights_->embed.index_select(0, input).unsqueeze(1);  // [B, 1, H]
    // Each sequence at its own position: cos/sin [B, 1, 1, D] broadcast over
    // the heads of q/k [B, heads, 1, D].
    auto [cos, sin] = rotary_->CosSin(torch::tensor(positions, index_options), dtype_);
    cos = cos.view({batch, 1, 1, -1});
    sin = sin.view({batch, 1, 1, -1});
    // The projections and the MLP run on the batch; attention per sequence,
    // on its own cache.
    const AttendFn attend = [&](int64_t i, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v) {
      std::vector<torch::Tensor> rows(batch);
      for (int64_t b = 0; b < batch; ++b) {
        rows[b] =
            AttendCached(*caches[b], i, q.narrow(0, b, 1), k.narrow(0, b, 1), v.narrow(0, b, 1));
      }
      return torch::cat(rows, 0);
    };
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) h = Layer(i, h, cos, sin, attend);
    last = nn::RmsNorm(h.squeeze(1), weights_->norm, c.rms_norm_eps).contiguous();
  });
  if (!status.ok()) return status;
  for (KvCache* cache : caches) ++cache->length;
  return last;
}

torch::Tensor HfRuntime::Logits(const torch::Tensor& last_hidden) const {
  torch::NoGradGuard no_grad;
  return torch::linear(last_hidden.to(torch::kFloat32), weights_->lm_head.to(torch::kFloat32));
}

}  // namespace specstream::teacher
