#include "teacher/dense_weights.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "teacher/tp_runtime.h"

namespace specstream::teacher {
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

  const std::set<std::string>& used() const { return used_; }

 private:
  const CheckpointTensors& checkpoint_;
  torch::Dtype dtype_;
  int rank_, size_;
  std::set<std::string> used_;
};

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

absl::StatusOr<std::vector<int>> ResolveCaptureLayers(const std::vector<int>& requested,
                                                      const HfModelConfig& c) {
  std::vector<int> capture = requested;
  if (capture.empty()) {
    ASSIGN_OR_RETURN(capture, DefaultEagle3CaptureLayers(static_cast<int>(c.num_hidden_layers)));
  }
  for (int id : capture) {
    if (id < 0 || id >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("capture layer id ", id, " is outside [0, ", c.num_hidden_layers, ")"));
    }
  }
  return capture;
}

absl::Status CheckTensorParallelLayout(const HfModelConfig& c, int tp_rank, int tp_size) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("tp rank ", tp_rank, " of ", tp_size));
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
  if (c.intermediate_size % tp_size != 0) return refuse("intermediate_size", c.intermediate_size);
  return absl::OkStatus();
}

absl::StatusOr<DenseModelWeights> LoadDenseWeights(const std::string& model_dir,
                                                   const HfModelConfig& c, torch::Dtype dtype,
                                                   int tp_rank, int tp_size) {
  ASSIGN_OR_RETURN(auto checkpoint, CheckpointTensors::Open(model_dir));
  WeightLoader w(*checkpoint, dtype, tp_rank, tp_size);
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size, I = c.intermediate_size;
  const int64_t QA = c.num_attention_heads * D, KA = c.num_key_value_heads * D;
  DenseModelWeights out;
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
    DenseLayerWeights& l = out.layers[i];
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
  constexpr int64_t kRows = 256;
  const int64_t t = last_hidden.size(0);
  torch::Tensor target = torch::empty({t}, torch::kInt32);
  for (int64_t r = 0; r < t; r += kRows) {
    const int64_t rows = std::min(kRows, t - r);
    torch::Tensor logits = torch::linear(last_hidden.narrow(0, r, rows), lm_head);
    target.narrow(0, r, rows).copy_(logits.argmax(-1).to(torch::kInt32));
  }
  return target;
}

absl::StatusOr<LoadedDenseModel> LoadDenseModel(const TargetRuntimeOptions& options,
                                                const std::string& runtime_name) {
  LoadedDenseModel out;
  ASSIGN_OR_RETURN(out.config, LoadHfConfig(options.model_dir));
  const HfModelConfig& c = out.config;
  if (!IsDenseModelType(c.model_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_type \"", c.model_type, "\" is not served by the ", runtime_name,
                     " runtime yet: it serves dense llama, qwen2, qwen3 and mistral models "
                     "(mixture-of-experts families are not implemented)"));
  }
  RETURN_IF_ERROR(CheckTensorParallelLayout(c, options.tp_rank, options.tp_size));
  ModelDescription& d = out.description;
  ASSIGN_OR_RETURN(d.dtype, ResolveComputeDtype(options.dtype, c));
  ASSIGN_OR_RETURN(d.capture_layer_ids, ResolveCaptureLayers(options.capture_layer_ids, c));
  ASSIGN_OR_RETURN(out.weights, LoadDenseWeights(options.model_dir, c, d.dtype, options.tp_rank,
                                                 options.tp_size));
  d.model_type = c.model_type;
  d.runtime = runtime_name;
  d.hidden_size = c.hidden_size;
  d.vocab_size = c.vocab_size;
  d.num_layers = c.num_hidden_layers;
  d.max_position_embeddings = c.max_position_embeddings;
  d.tp_size = options.tp_size;
  SS_LOG_INFO("{} runtime: {} with {} layers, hidden {}, vocab {}, {} on TP rank {}/{}, capture {}",
              runtime_name, c.model_type, c.num_hidden_layers, c.hidden_size, c.vocab_size,
              c10::toString(d.dtype), options.tp_rank, options.tp_size,
              absl::StrJoin(d.capture_layer_ids, ","));
  return out;
}

}  // namespace specstream::teacher
