#include "teacher/model_weights.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/capture_layers.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "teacher/tp_runtime.h"

namespace specstream::teacher {
namespace {

// Reads checkpoint tensors, checking shapes against the config and slicing
// them for one rank.
class WeightLoader final {
 public:
  WeightLoader(const CheckpointTensors& checkpoint, torch::Dtype dtype, torch::Device device,
               int rank, int size)
      : checkpoint_(checkpoint), dtype_(dtype), device_(device), rank_(rank), size_(size) {}

  // Checks that the tensor exists with exactly `shape`, without reading it.
  absl::Status Check(const std::string& name, const std::vector<int64_t>& shape) {
    return View(name, shape).status();
  }

  // The full tensor, which must have exactly `shape`.
  absl::StatusOr<torch::Tensor> Full(const std::string& name, std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(TensorView view, View(name, shape));
    return TensorFromView(view, dtype_, device_);
  }

  // This TP rank's slice along `dim` (the tensor must have `shape`).
  absl::StatusOr<torch::Tensor> Shard(const std::string& name, std::vector<int64_t> shape,
                                      int dim) {
    return ShardOf(name, std::move(shape), dim, rank_, size_);
  }

  // Slice `rank` of `size` along `dim`.
  absl::StatusOr<torch::Tensor> ShardOf(const std::string& name, std::vector<int64_t> shape,
                                        int dim, int rank, int size) {
    ASSIGN_OR_RETURN(TensorView view, View(name, shape));
    const int64_t part = shape[dim] / size;
    torch::Tensor out;
    RETURN_IF_ERROR(CatchTorch(name, [&] {
      // One copy from the mapped file to the device; a strided shard lands
      // contiguous (the copy's layout follows the destination).
      torch::Tensor slice = BorrowView(view).narrow(dim, rank * part, part);
      out = torch::empty(slice.sizes(), torch::TensorOptions().dtype(dtype_).device(device_));
      out.copy_(slice);
    }));
    return out;
  }

  const std::set<std::string>& used() const { return used_; }

 private:
  // The tensor's view, which must have exactly `shape`; marks it used.
  absl::StatusOr<TensorView> View(const std::string& name, const std::vector<int64_t>& shape) {
    ASSIGN_OR_RETURN(TensorView view, checkpoint_.Get(name));
    if (view.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(view.shape, ", "),
                       "] but the config implies [", absl::StrJoin(shape, ", "), "]"));
    }
    used_.insert(name);
    return view;
  }

  const CheckpointTensors& checkpoint_;
  torch::Dtype dtype_;
  torch::Device device_;
  int rank_, size_;
  std::set<std::string> used_;
};

// Sparse layer `layer`'s router and experts (names: MoeTensorNames).
absl::StatusOr<MoeLayerWeights> LoadMoeLayer(WeightLoader& w, int64_t layer, const HfModelConfig& c,
                                             const ParallelLayout& layout) {
  const ExpertTensorNames names = MoeTensorNames(c, layer);
  const std::string& prefix = names.block;
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.expert_intermediate_size();
  const int64_t local = E / layout.ep_size;
  MoeLayerWeights moe;
  moe.first_expert = layout.ep_rank() * local;
  ASSIGN_OR_RETURN(moe.router, w.Full(prefix + "gate.weight", {E, H}));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = absl::StrCat(prefix, "experts.", e, ".");
    if (e < moe.first_expert || e >= moe.first_expert + local) {
      RETURN_IF_ERROR(w.Check(p + names.gate, {I, H}));  // another EP rank's
      RETURN_IF_ERROR(w.Check(p + names.up, {I, H}));
      RETURN_IF_ERROR(w.Check(p + names.down, {H, I}));
      continue;
    }
    const int rank = layout.moe_tp_rank(), size = layout.moe_tp_size();
    ASSIGN_OR_RETURN(moe.gate.emplace_back(), w.ShardOf(p + names.gate, {I, H}, 0, rank, size));
    ASSIGN_OR_RETURN(moe.up.emplace_back(), w.ShardOf(p + names.up, {I, H}, 0, rank, size));
    ASSIGN_OR_RETURN(moe.down.emplace_back(), w.ShardOf(p + names.down, {H, I}, 1, rank, size));
  }
  if (c.shared_expert_intermediate_size) {
    const int64_t S = *c.shared_expert_intermediate_size;
    ASSIGN_OR_RETURN(moe.shared_gate,
                     w.Shard(prefix + "shared_expert.gate_proj.weight", {S, H}, 0));
    ASSIGN_OR_RETURN(moe.shared_up, w.Shard(prefix + "shared_expert.up_proj.weight", {S, H}, 0));
    ASSIGN_OR_RETURN(moe.shared_down,
                     w.Shard(prefix + "shared_expert.down_proj.weight", {H, S}, 1));
    ASSIGN_OR_RETURN(moe.shared_expert_gate, w.Full(prefix + "shared_expert_gate.weight", {1, H}));
  }
  return moe;
}

}  // namespace

bool IsDenseModelType(const std::string& model_type) {
  return model_type == "llama" || model_type == "qwen2" || model_type == "qwen3" ||
         model_type == "mistral";
}

absl::StatusOr<torch::Dtype> ResolveComputeDtype(const std::string& requested,
                                                 const HfModelConfig& c) {
  std::string name = requested == "auto" ? c.torch_dtype : requested;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float32" || name == "" || name == "float16") return torch::kFloat32;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype \"", requested, "\" (expected auto, float32 or bfloat16)"));
}

absl::StatusOr<CaptureLayerIds> ResolveCaptureLayers(const CaptureLayerIds& requested,
                                                     const HfModelConfig& c) {
  CaptureLayerIds capture = requested;
  if (capture.empty()) {
    ASSIGN_OR_RETURN(capture, DefaultEagle3CaptureLayers(c.num_hidden_layers));
  }
  for (int id : capture) {
    if (id < 0 || id >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("capture layer id ", id, " is outside [0, ", c.num_hidden_layers, ")"));
    }
  }
  return capture;
}

absl::Status CheckExpertParallelSize(int ep_size, int tp_size) {
  if (ep_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--ep ", ep_size, " must be at least 1"));
  }
  if (tp_size % ep_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ep ", ep_size, " does not divide the tensor-parallel size ", tp_size,
                     ": expert parallelism runs within the tensor-parallel group"));
  }
  return absl::OkStatus();
}

absl::Status CheckParallelLayout(const HfModelConfig& c, const ParallelLayout& layout) {
  const int tp_size = layout.tp_size, ep_size = layout.ep_size;
  if (tp_size < 1 || layout.tp_rank < 0 || layout.tp_rank >= tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("tp rank ", layout.tp_rank, " of ", tp_size));
  }
  RETURN_IF_ERROR(CheckExpertParallelSize(ep_size, tp_size));
  if (ep_size > 1 && !c.is_moe()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ep ", ep_size, ": model_type \"", c.model_type,
                     "\" has no experts (expert parallelism is for qwen3_moe and mixtral)"));
  }
  auto refuse = [&](const char* field, int64_t value) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", value, " is not divisible by the tensor-parallel size ", tp_size));
  };
  if (c.num_attention_heads % tp_size != 0) {
    return refuse("num_attention_heads", c.num_attention_heads);
  }
  if (c.num_key_value_heads % tp_size != 0) {
    return refuse("num_key_value_heads", c.num_key_value_heads);
  }
  bool dense_layers = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) dense_layers |= !c.IsMoeLayer(i);
  if (dense_layers && c.intermediate_size % tp_size != 0) {
    return refuse("intermediate_size", c.intermediate_size);
  }
  if (!c.is_moe()) return absl::OkStatus();
  const char* experts_field = c.model_type == "mixtral" ? "num_local_experts" : "num_experts";
  if (c.num_experts % ep_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(experts_field, " ", c.num_experts,
                                                   " is not divisible by the expert-parallel "
                                                   "size --ep ",
                                                   ep_size));
  }
  const int64_t expert_inter = c.expert_intermediate_size();
  if (expert_inter % layout.moe_tp_size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.expert_intermediate_field(), " ", expert_inter,
                     " is not divisible by the expert tensor-parallel size ", layout.moe_tp_size(),
                     " (--tp ", tp_size, " / --ep ", ep_size, ")"));
  }
  if (c.shared_expert_intermediate_size && *c.shared_expert_intermediate_size % tp_size != 0) {
    return refuse("shared_expert_intermediate_size", *c.shared_expert_intermediate_size);
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelWeights> LoadTargetWeights(const std::string& model_dir, const HfModelConfig& c,
                                               torch::Dtype dtype, const ParallelLayout& layout,
                                               torch::Device device) {
  ASSIGN_OR_RETURN(auto checkpoint, CheckpointTensors::Open(model_dir));
  WeightLoader w(*checkpoint, dtype, device, layout.tp_rank, layout.tp_size);
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size, I = c.intermediate_size;
  const int64_t QA = c.num_attention_heads * D, KA = c.num_key_value_heads * D;
  ModelWeights out;
  ASSIGN_OR_RETURN(out.embed, w.Full("model.embed_tokens.weight", {V, H}));
  ASSIGN_OR_RETURN(out.norm, w.Full("model.norm.weight", {H}));
  if (c.tie_word_embeddings) {
    out.lm_head = out.embed;
  } else {
    ASSIGN_OR_RETURN(out.lm_head, w.Full("lm_head.weight", {V, H}));
  }
  const bool qkv_bias = c.model_type == "qwen2" || c.attention_bias;
  const bool o_bias = c.model_type != "qwen2" && c.attention_bias;
  out.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights& l = out.layers[i];
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
    if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
      ASSIGN_OR_RETURN(l.q_norm, w.Full(p + "self_attn.q_norm.weight", {D}));
      ASSIGN_OR_RETURN(l.k_norm, w.Full(p + "self_attn.k_norm.weight", {D}));
    }
    if (c.IsMoeLayer(i)) {
      ASSIGN_OR_RETURN(l.moe, LoadMoeLayer(w, i, c, layout));
    } else {
      ASSIGN_OR_RETURN(l.gate, w.Shard(p + "mlp.gate_proj.weight", {I, H}, 0));
      ASSIGN_OR_RETURN(l.up, w.Shard(p + "mlp.up_proj.weight", {I, H}, 0));
      ASSIGN_OR_RETURN(l.down, w.Shard(p + "mlp.down_proj.weight", {H, I}, 1));
    }
    if (c.mlp_bias) {
      ASSIGN_OR_RETURN(l.gate_bias, w.Shard(p + "mlp.gate_proj.bias", {I}, 0));
      ASSIGN_OR_RETURN(l.up_bias, w.Shard(p + "mlp.up_proj.bias", {I}, 0));
      ASSIGN_OR_RETURN(l.down_bias, w.Full(p + "mlp.down_proj.bias", {H}));
    }
    // The qwen families apply the window only from max_window_layers on;
    // Mistral and Mixtral everywhere.
    const bool window_everywhere = c.model_type == "mistral" || c.model_type == "mixtral";
    if (c.sliding_window &&
        (!c.max_window_layers || window_everywhere || i >= *c.max_window_layers)) {
      l.sliding_window = c.sliding_window;
    }
  }
  if (checkpoint->names().size() > w.used().size()) {
    for (const std::string& name : checkpoint->names()) {
      if (!w.used().count(name)) {
        SS_LOG_WARN("checkpoint tensor {} is not used by the {} runtime", name, c.model_type);
        break;
      }
    }
  }
  return out;
}

absl::Status ValidateForwardRequest(const ForwardRequest& request, const HfModelConfig& config) {
  if (request.sequences.empty()) return absl::InvalidArgumentError("request has no sequences");
  for (int id : request.capture_layer_ids) {
    if (id < 0 || id >= config.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("capture layer id ", id, " is outside [0, ", config.num_hidden_layers, ")"));
    }
  }
  for (size_t s = 0; s < request.sequences.size(); ++s) {
    const auto& seq = request.sequences[s];
    if (seq.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " is empty"));
    if (config.max_position_embeddings > 0 &&
        static_cast<int64_t>(seq.size()) > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has ", seq.size(),
                                                     " tokens, over max_position_embeddings ",
                                                     config.max_position_embeddings));
    }
    for (size_t t = 0; t < seq.size(); ++t) {
      if (seq[t] < 0 || seq[t] >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " token ", t, " id ", seq[t],
                                                       " is outside the vocab [0, ",
                                                       config.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

torch::Tensor FullVocabArgmax(const torch::Tensor& last_hidden, const torch::Tensor& lm_head) {
  // Row chunks as large as the logits budget allows (a GEMM of few rows
  // runs below one of many); 1024 tokens of a 32k vocab are one GEMM.
  constexpr int64_t kLogitsBytes = int64_t{256} << 20;
  const int64_t t = last_hidden.size(0);
  const int64_t row_bytes = std::max<int64_t>(1, lm_head.size(0) * lm_head.element_size());
  const int64_t chunk = std::max<int64_t>(1, kLogitsBytes / row_bytes);
  torch::Tensor target = torch::empty({t}, last_hidden.options().dtype(torch::kInt32));
  for (int64_t r = 0; r < t; r += chunk) {
    const int64_t rows = std::min(chunk, t - r);
    torch::Tensor logits = torch::linear(last_hidden.narrow(0, r, rows), lm_head);
    target.narrow(0, r, rows).copy_(logits.argmax(-1).to(torch::kInt32));
  }
  return target;
}

absl::Status CheckRuntimeServes(const HfModelConfig& c, const std::string& runtime_name,
                                bool allow_moe, const ParallelLayout& layout) {
  if (!IsDenseModelType(c.model_type) && !(allow_moe && c.is_moe())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_type \"", c.model_type, "\" is not served by the ", runtime_name,
                     " runtime: it serves dense llama, qwen2, qwen3 and mistral models",
                     c.is_moe() ? "; mixture-of-experts models run with --runtime sglang" : ""));
  }
  return CheckParallelLayout(c, layout);
}

absl::StatusOr<LoadedModel> LoadTargetModel(const TargetRuntimeOptions& options,
                                            const std::string& runtime_name, bool allow_moe) {
  LoadedModel out;
  ASSIGN_OR_RETURN(out.config, LoadHfConfig(options.model_dir));
  const HfModelConfig& c = out.config;
  const ParallelLayout layout{options.tp_rank, options.tp_size, options.ep_size};
  RETURN_IF_ERROR(CheckRuntimeServes(c, runtime_name, allow_moe, layout));
  ModelDescription& d = out.description;
  ASSIGN_OR_RETURN(d.dtype, ResolveComputeDtype(options.dtype, c));
  ASSIGN_OR_RETURN(d.capture_layer_ids, ResolveCaptureLayers(options.capture_layer_ids, c));
  ASSIGN_OR_RETURN(out.device, ParseDevice(options.device, "device"));
  ASSIGN_OR_RETURN(out.weights,
                   LoadTargetWeights(options.model_dir, c, d.dtype, layout, out.device));
  d.model_type = c.model_type;
  d.runtime = runtime_name;
  d.hidden_size = c.hidden_size;
  d.vocab_size = c.vocab_size;
  d.num_layers = c.num_hidden_layers;
  d.max_position_embeddings = c.max_position_embeddings;
  d.tp_size = options.tp_size;
  SS_LOG_INFO(
      "{} runtime: {} with {} layers, hidden {}, vocab {}{}, {} on {}, TP rank {}/{}{}, capture {}",
      runtime_name, c.model_type, c.num_hidden_layers, c.hidden_size, c.vocab_size,
      c.is_moe() ? absl::StrCat(", ", c.num_experts, " experts top-", c.num_experts_per_tok)
                 : std::string(),
      c10::toString(d.dtype), out.device.str(), options.tp_rank, options.tp_size,
      options.ep_size > 1 ? absl::StrCat(" (EP rank ", layout.ep_rank(), "/", options.ep_size, ")")
                          : std::string(),
      absl::StrJoin(d.capture_layer_ids, ","));
  return out;
}

}  // namespace specstream::teacher
