#include "teacher/hf_runtime.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"

namespace specstream::teacher {

// One decoder layer's weights, already sliced to this TP rank.
struct HfRuntime::Layer {
  torch::Tensor input_norm, post_norm;
  torch::Tensor q, k, v, o;                     // q/k/v column shards, o row shard
  torch::Tensor q_bias, k_bias, v_bias;         // qwen2 (and llama attention_bias)
  torch::Tensor o_bias;                         // llama attention_bias (added once, after reduce)
  torch::Tensor q_norm, k_norm;                 // qwen3, over head_dim
  torch::Tensor gate, up, down;                 // gate/up column shards, down row shard
  torch::Tensor gate_bias, up_bias, down_bias;  // llama mlp_bias
  std::optional<int64_t> sliding_window;
};

namespace {

// Reads checkpoint tensors, checking shapes against the config and slicing
// them for this TP rank.
class WeightLoader final {
 public:
  WeightLoader(const CheckpointTensors& checkpoint, torch::Dtype dtype, int rank, int size)
      : checkpoint_(checkpoint), dtype_(dtype), rank_(rank), size_(size) {}

  // The full tensor, which must have exactly `shape`.
  absl::StatusOr<torch::Tensor> Full(const std::string& name, std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(TensorView view, checkpoint_.Get(name));
    if (view.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(view.shape, ", "),
                       "] but the config implies [", absl::StrJoin(shape, ", "), "]"));
    }
    used_.insert(name);
    return TensorFromView(view, dtype_);
  }

  // This rank's slice along `dim` (the tensor must have `shape`).
  absl::StatusOr<torch::Tensor> Shard(const std::string& name, std::vector<int64_t> shape,
                                      int dim) {
    ASSIGN_OR_RETURN(TensorView view, checkpoint_.Get(name));
    if (view.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(view.shape, ", "),
                       "] but the config implies [", absl::StrJoin(shape, ", "), "]"));
    }
    used_.insert(name);
    const int64_t part = shape[dim] / size_;
    torch::Tensor out;
    RETURN_IF_ERROR(CatchTorch(name, [&] {
      out = BorrowView(view).narrow(dim, rank_ * part, part).to(dtype_, false, true).contiguous();
    }));
    return out;
  }

  bool Has(const std::string& name) const { return checkpoint_.Contains(name); }
  const std::set<std::string>& used() const { return used_; }

 private:
  const CheckpointTensors& checkpoint_;
  torch::Dtype dtype_;
  int rank_, size_;
  std::set<std::string> used_;
};

absl::StatusOr<torch::Dtype> ResolveDtype(const std::string& requested, const HfModelConfig& c) {
  std::string name = requested == "auto" ? c.torch_dtype : requested;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float32" || name == "" || name == "float16") return torch::kFloat32;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype \"", requested, "\" (expected auto, float32 or bfloat16)"));
}

bool IsDense(const std::string& model_type) {
  return model_type == "llama" || model_type == "qwen2" || model_type == "qwen3" ||
         model_type == "mistral";
}

}  // namespace

HfRuntime::~HfRuntime() = default;

absl::StatusOr<std::unique_ptr<HfRuntime>> HfRuntime::Create(HfRuntimeOptions options) {
  TuneAllocatorForTensors();
  std::unique_ptr<HfRuntime> runtime(new HfRuntime());
  runtime->options_ = std::move(options);
  RETURN_IF_ERROR(runtime->Load());
  return runtime;
}

absl::Status HfRuntime::Load() {
  const HfRuntimeOptions& o = options_;
  if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("tp rank ", o.tp_rank, " of ", o.tp_size));
  }
  ASSIGN_OR_RETURN(config_, LoadHfConfig(o.model_dir));
  const HfModelConfig& c = config_;
  if (!IsDense(c.model_type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_type \"", c.model_type,
        "\" is a mixture-of-experts model; the hf runtime serves dense llama, qwen2, qwen3 "
        "and mistral models (use --runtime sglang for MoE)"));
  }
  const int tp = o.tp_size;
  auto refuse = [&](const char* field, int64_t value) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", value, " is not divisible by the tensor-parallel size ", tp));
  };
  if (c.num_attention_heads % tp != 0) return refuse("num_attention_heads", c.num_attention_heads);
  if (c.num_key_value_heads % tp != 0) return refuse("num_key_value_heads", c.num_key_value_heads);
  if (c.intermediate_size % tp != 0) return refuse("intermediate_size", c.intermediate_size);
  ASSIGN_OR_RETURN(dtype_, ResolveDtype(o.dtype, c));

  std::vector<int> capture = o.capture_layer_ids;
  if (capture.empty()) {
    ASSIGN_OR_RETURN(capture, DefaultEagle3CaptureLayers(static_cast<int>(c.num_hidden_layers)));
  }
  for (int id : capture) {
    if (id < 0 || id >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("capture layer id ", id, " is outside [0, ", c.num_hidden_layers, ")"));
    }
  }

  ASSIGN_OR_RETURN(auto checkpoint, CheckpointTensors::Open(o.model_dir));
  WeightLoader w(*checkpoint, dtype_, o.tp_rank, tp);
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size, I = c.intermediate_size;
  const int64_t QA = c.num_attention_heads * D, KA = c.num_key_value_heads * D;
  ASSIGN_OR_RETURN(embed_, w.Full("model.embed_tokens.weight", {V, H}));
  ASSIGN_OR_RETURN(norm_, w.Full("model.norm.weight", {H}));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, w.Full("lm_head.weight", {V, H}));
  }
  const bool qkv_bias = c.model_type == "qwen2" || c.attention_bias;
  const bool o_bias = c.model_type != "qwen2" && c.attention_bias;
  layers_.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer& l = layers_[i];
    ASSIGN_OR_RETURN(l.input_norm, w.Full(p + "input_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(l.post_norm, w.Full(p + "post_attention_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(l.q, w.Shard(p + "self_attn.q_proj.weight", {QA, H}, 0));
    ASSIGN_OR_RETURN(l.k, w.Shard(p + "self_attn.k_proj.weight", {KA, H}, 0));
    ASSIGN_OR_RETURN(l.v, w.Shard(p + "self_attn.v_proj.weight", {KA, H}, 0));
    ASSIGN_OR_RETURN(l.o, w.Shard(p + "self_attn.o_proj.weight", {H, QA}, 1));
    if (qkv_bias) {
      ASSIGN_OR_RETURN(l.q_bias, w.Shard(p + "self_attn.q_proj.bias", {QA}, 0));
      ASSIGN_OR_RETURN(l.k_bias, w.Shard(p + "self_attn.k_proj.bias", {KA}, 0));
      ASSIGN_OR_RETURN(l.v_bias, w.Shard(p + "self_attn.v_proj.bias", {KA}, 0));
    }
    if (o_bias) {
      ASSIGN_OR_RETURN(l.o_bias, w.Full(p + "self_attn.o_proj.bias", {H}));
    }
    if (c.model_type == "qwen3") {
      ASSIGN_OR_RETURN(l.q_norm, w.Full(p + "self_attn.q_norm.weight", {D}));
      ASSIGN_OR_RETURN(l.k_norm, w.Full(p + "self_attn.k_norm.weight", {D}));
    }
    ASSIGN_OR_RETURN(l.gate, w.Shard(p + "mlp.gate_proj.weight", {I, H}, 0));
    ASSIGN_OR_RETURN(l.up, w.Shard(p + "mlp.up_proj.weight", {I, H}, 0));
    ASSIGN_OR_RETURN(l.down, w.Shard(p + "mlp.down_proj.weight", {H, I}, 1));
    if (c.mlp_bias) {
      ASSIGN_OR_RETURN(l.gate_bias, w.Shard(p + "mlp.gate_proj.bias", {I}, 0));
      ASSIGN_OR_RETURN(l.up_bias, w.Shard(p + "mlp.up_proj.bias", {I}, 0));
      ASSIGN_OR_RETURN(l.down_bias, w.Full(p + "mlp.down_proj.bias", {H}));
    }
    // Qwen2/Qwen3 apply the window only from max_window_layers on; Mistral
    // everywhere.
    if (c.sliding_window &&
        (!c.max_window_layers || c.model_type == "mistral" || i >= *c.max_window_layers)) {
      l.sliding_window = c.sliding_window;
    }
  }
  size_t unused = checkpoint->names().size() - w.used().size();
  if (unused > 0) {
    for (const std::string& name : checkpoint->names()) {
      if (!w.used().count(name)) {
        SS_LOG_WARN("checkpoint tensor {} is not used by the {} runtime", name, c.model_type);
        break;
      }
    }
  }
  ASSIGN_OR_RETURN(auto rotary,
                   nn::Rotary::Create(D, c.rope_theta, c.rope_scaling, c.max_position_embeddings));
  rotary_.emplace(std::move(rotary));

  description_.model_type = c.model_type;
  description_.runtime = "hf";
  description_.hidden_size = H;
  description_.vocab_size = V;
  description_.num_layers = c.num_hidden_layers;
  description_.max_position_embeddings = c.max_position_embeddings;
  description_.capture_layer_ids = capture;
  description_.dtype = dtype_;
  description_.tp_size = tp;
  SS_LOG_INFO("hf runtime: {} with {} layers, hidden {}, vocab {}, {} on TP rank {}/{}, capture {}",
              c.model_type, c.num_hidden_layers, H, V, c10::toString(dtype_), o.tp_rank, tp,
              absl::StrJoin(capture, ","));
  return absl::OkStatus();
}

absl::Status HfRuntime::Validate(const ForwardRequest& request) const {
  if (request.sequences.empty()) return absl::InvalidArgumentError("request has no sequences");
  for (size_t s = 0; s < request.sequences.size(); ++s) {
    const auto& seq = request.sequences[s];
    if (seq.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " is empty"));
    if (config_.max_position_embeddings > 0 &&
        static_cast<int64_t>(seq.size()) > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has ", seq.size(),
                                                     " tokens, over max_position_embeddings ",
                                                     config_.max_position_embeddings));
    }
    for (size_t t = 0; t < seq.size(); ++t) {
      if (seq[t] < 0 || seq[t] >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " token ", t, " id ", seq[t],
                                                       " is outside the vocab [0, ",
                                                       config_.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SequenceCapture>> HfRuntime::Forward(const ForwardRequest& request) {
  if (options_.tp_rank != 0) {
    return absl::FailedPreconditionError("Forward is called on TP rank 0; followers RunFollower()");
  }
  RETURN_IF_ERROR(Validate(request));
  if (options_.tp_size > 1 && !options_.group) {
    return absl::FailedPreconditionError("tensor parallelism needs a process group");
  }
  const int64_t batch = static_cast<int64_t>(request.sequences.size());
  int64_t max_len = 0;
  std::vector<int64_t> lengths;
  for (const auto& seq : request.sequences) {
    lengths.push_back(static_cast<int64_t>(seq.size()));
    max_len = std::max<int64_t>(max_len, static_cast<int64_t>(seq.size()));
  }
  // Right padding with id 0: causal attention keeps padding out of every real
  // position, so captures of real tokens are exact.
  torch::Tensor ids = torch::zeros({batch, max_len}, torch::kInt64);
  auto acc = ids.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < lengths[b]; ++t) acc[b][t] = request.sequences[b][t];
  }
  if (options_.tp_size > 1) {
    torch::Tensor header =
        torch::tensor({batch, max_len, int64_t{request.want_target_ids}}, torch::kInt64);
    // Once a collective has failed the followers are out of step with us;
    // StopFollowers then refuses to broadcast (the caller stops the workers).
    absl::Status sent = Broadcast(*options_.group, header, 0);
    torch::Tensor lens = torch::tensor(lengths, torch::kInt64);
    if (sent.ok()) sent = Broadcast(*options_.group, lens, 0);
    if (sent.ok()) sent = Broadcast(*options_.group, ids, 0);
    if (!sent.ok()) {
      group_broken_ = true;
      return sent;
    }
  }
  auto result = Compute(ids, lengths, request.want_target_ids, nullptr);
  if (!result.ok() && options_.tp_size > 1) group_broken_ = true;
  return result;
}

absl::Status HfRuntime::RunFollower() {
  if (options_.tp_rank == 0) return absl::FailedPreconditionError("rank 0 is the leader");
  if (!options_.group) return absl::FailedPreconditionError("no process group attached");
  while (true) {
    torch::Tensor header = torch::zeros({3}, torch::kInt64);
    RETURN_IF_ERROR(Broadcast(*options_.group, header, 0));
    const int64_t batch = header[0].item<int64_t>();
    if (batch == 0) return absl::OkStatus();
    const int64_t max_len = header[1].item<int64_t>();
    torch::Tensor lens = torch::zeros({batch}, torch::kInt64);
    RETURN_IF_ERROR(Broadcast(*options_.group, lens, 0));
    torch::Tensor ids = torch::zeros({batch, max_len}, torch::kInt64);
    RETURN_IF_ERROR(Broadcast(*options_.group, ids, 0));
    std::vector<int64_t> lengths(lens.data_ptr<int64_t>(), lens.data_ptr<int64_t>() + batch);
    auto result = Compute(ids, lengths, header[2].item<int64_t>() != 0, nullptr);
    if (!result.ok()) return result.status();
  }
}

absl::Status HfRuntime::StopFollowers() {
  if (options_.tp_size == 1 || followers_stopped_) return absl::OkStatus();
  followers_stopped_ = true;
  if (group_broken_) {
    return absl::AbortedError("the TP group is out of step after a failed forward");
  }
  torch::Tensor header = torch::zeros({3}, torch::kInt64);
  return Broadcast(*options_.group, header, 0);
}

absl::StatusOr<std::vector<torch::Tensor>> HfRuntime::HiddenStates(
    const std::vector<int32_t>& ids) {
  ForwardRequest request;
  request.sequences = {ids};
  RETURN_IF_ERROR(Validate(request));
  torch::Tensor input = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end())).unsqueeze(0);
  std::vector<torch::Tensor> hidden;
  auto result = Compute(input, {static_cast<int64_t>(ids.size())}, false, &hidden);
  if (!result.ok()) return result.status();
  return hidden;
}

absl::StatusOr<std::vector<SequenceCapture>> HfRuntime::Compute(
    const torch::Tensor& ids, const std::vector<int64_t>& lengths, bool want_target_ids,
    std::vector<torch::Tensor>* all_hidden) {
  std::vector<SequenceCapture> out;
  absl::Status status = CatchTorch("hf forward", [&] {
    torch::NoGradGuard no_grad;
    const HfModelConfig& c = config_;
    const int64_t batch = ids.size(0), t = ids.size(1), d = c.head_dim;
    const int64_t q_heads = c.num_attention_heads / options_.tp_size;
    const int64_t kv_heads = c.num_key_value_heads / options_.tp_size;
    const double eps = c.rms_norm_eps;
    auto reduce = [&](torch::Tensor& x) {
      if (options_.tp_size > 1) {
        absl::Status s = AllReduceSum(*options_.group, x);
        if (!s.ok()) throw std::runtime_error(std::string(s.message()));
      }
    };

    torch::Tensor h = embed_.index_select(0, ids.reshape({-1})).view({batch, t, -1});
    auto [cos, sin] = rotary_->CosSin(torch::arange(t, torch::kInt64), dtype_);
    // Captures in the order of the ids (which may repeat or be unsorted).
    const auto& capture_ids = description_.capture_layer_ids;
    std::vector<torch::Tensor> ordered(capture_ids.size());
    if (all_hidden) all_hidden->push_back(h[0].clone());
    nn::AttentionOptions attention;
    attention.scale = 1.0 / std::sqrt(static_cast<double>(d));
    attention.max_score_elements = options_.max_score_elements;

    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const Layer& l = layers_[i];
      torch::Tensor x = nn::RmsNorm(h, l.input_norm, eps);
      torch::Tensor q = nn::Linear(x, l.q, l.q_bias).view({batch, t, q_heads, d});
      torch::Tensor k = nn::Linear(x, l.k, l.k_bias).view({batch, t, kv_heads, d});
      torch::Tensor v = nn::Linear(x, l.v, l.v_bias).view({batch, t, kv_heads, d});
      if (l.q_norm.defined()) {
        q = nn::RmsNorm(q, l.q_norm, eps);
        k = nn::RmsNorm(k, l.k_norm, eps);
      }
      q = nn::ApplyRotary(q.transpose(1, 2), cos, sin);
      k = nn::ApplyRotary(k.transpose(1, 2), cos, sin);
      v = v.transpose(1, 2);
      attention.sliding_window = l.sliding_window;
      torch::Tensor a = nn::CausalAttention(q, k, v, attention);
      a = torch::linear(a.transpose(1, 2).reshape({batch, t, q_heads * d}), l.o);
      reduce(a);
      if (l.o_bias.defined()) a = a + l.o_bias;
      h = h + a;

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
      h = h + m;
      if (all_hidden) all_hidden->push_back(h[0].clone());
      for (size_t j = 0; j < capture_ids.size(); ++j) {
        if (capture_ids[j] == i) ordered[j] = h;
      }
    }
    torch::Tensor aux = torch::cat(ordered, -1);
    torch::Tensor last = nn::RmsNorm(h, norm_, eps);
    for (int64_t b = 0; b < batch; ++b) {
      SequenceCapture capture;
      capture.aux_hidden = aux[b].narrow(0, 0, lengths[b]).contiguous();
      capture.last_hidden = last[b].narrow(0, 0, lengths[b]).contiguous();
      if (want_target_ids && options_.tp_rank == 0) {
        // Argmax over the full vocab in row chunks: never T × V logits at once.
        constexpr int64_t kRows = 256;
        torch::Tensor target = torch::empty({lengths[b]}, torch::kInt32);
        for (int64_t r = 0; r < lengths[b]; r += kRows) {
          int64_t rows = std::min(kRows, lengths[b] - r);
          torch::Tensor logits = torch::linear(capture.last_hidden.narrow(0, r, rows), lm_head_);
          target.narrow(0, r, rows).copy_(logits.argmax(-1).to(torch::kInt32));
        }
        capture.target_ids = target;
      }
      out.push_back(std::move(capture));
    }
  });
  if (!status.ok()) return status;
  return out;
}

}  // namespace specstream::teacher
