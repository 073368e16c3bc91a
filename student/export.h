// The EAGLE-3 draft export that SGLang and vLLM load
// (`--speculative-algorithm EAGLE3 --speculative-draft-model-path <dir>` /
// `speculative_config={"method": "eagle3", "model": <dir>}`), shared/DESIGN.md
// §3. The directory holds exactly:
//
//   config.json         LlamaForCausalLMEagle3, num_hidden_layers 1, the
//                       draft's sizes, the target's vocab / rope / positions,
//                       draft_vocab_size, eagle_config (see below)
//   model.safetensors   fc.weight [H, 3*TH]
//                       midlayer.self_attn.q_proj.weight [A*D, 2H]
//                       midlayer.self_attn.{k,v}_proj.weight [B*D, 2H]
//                       midlayer.self_attn.o_proj.weight [H, A*D]
//                       midlayer.mlp.{gate,up}_proj.weight [I, H]
//                       midlayer.mlp.down_proj.weight [H, I]
//                       midlayer.{input_layernorm,hidden_norm,
//                                 post_attention_layernorm}.weight [H]
//                       norm.weight [H], lm_head.weight [draft_vocab, H]
//                       d2t I64 [draft_vocab], t2d BOOL [vocab]
//                       (no embed_tokens: both servers share the target's)
//   H = hidden_size, TH = target_hidden_size (H unless set), A/B = query/KV
//   heads, D = head_dim, I = intermediate_size.
//
// Aux-layer ids. SpecStream's capture ids follow SGLang: id k is the residual
// stream at the *output* of decoder layer k (0-indexed). The two servers read
// different keys with different conventions, so the export writes both:
//   * "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}: SGLang reads
//     this nested key (ModelRunner -> set_eagle3_layers_to_capture(ids)) and
//     captures at the *input* of layer id+1 (`layers_to_capture = [val + 1
//     for val in layer_ids]`, "for the ith layer, it takes the output of the
//     (i-1)th layer"), i.e. the output of layer id. SpecForge writes and reads
//     the same nested key with the same meaning.
//   * top-level "eagle_aux_hidden_state_layer_ids": ids + 1: vLLM reads this
//     top-level key (GPUModelRunner._get_eagle3_aux_layers_from_config ->
//     set_aux_hidden_state_layers) and captures `hidden_states + residual`
//     *before* running layer idx (`if idx in self.aux_hidden_state_layers:`
//     precedes `layer(...)`), i.e. the output of layer idx-1. vLLM's default
//     (2, L//2, L-3) equals SGLang's default [2, L//2, L-3] layers_to_capture,
//     which is our default capture [1, L//2-1, L-4] plus one.
// vLLM forks that fall back to the nested key only do so when the top-level
// key is absent, so writing both keeps every reader on the same layers.
//
// Thread-safety: pure functions; concurrent exports to the same directory are
// not supported.
#ifndef SPECSTREAM_STUDENT_EXPORT_H_
#define SPECSTREAM_STUDENT_EXPORT_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/env.h"
#include "common/hf_config.h"
#include "nlohmann/json.hpp"

namespace specstream::student {

inline constexpr char kEagle3Architecture[] = "LlamaForCausalLMEagle3";

// EAGLE 3.1's norm tensors, named as the draft's parameters and the
// export's tensors. Like every other name here they carry no "model."
// prefix: vLLM's Eagle3 loader prepends it to all but lm_head (so these
// load as model.fc_norm.{i} and model.input_norm), as speculators and
// SpecForge write them.
std::string FcNormTensorName(int64_t capture);  // "fc_norm.{capture}.weight" [TH]
inline constexpr char kNormBeforeFcTensor[] = "input_norm.weight";  // [3*TH]
// P-EAGLE's learnable stand-in for the captures at depths >= 1 (vLLM
// loads it as model.mask_hidden).
inline constexpr char kMaskHiddenTensor[] = "mask_hidden";  // [1, 1, 3*TH]

struct ExportConfig {
  // The draft layer.
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  // The target's positions and vocabulary.
  double rope_theta = 10000.0;
  nlohmann::json rope_scaling = nullptr;  // null, or the target's rope_scaling object.
  int64_t max_position_embeddings = 0;
  int64_t vocab_size = 0;  // target vocab (t2d's length)
  int64_t draft_vocab_size = 0;
  int64_t target_hidden_size = 0;  // 0: equal to hidden_size (then not written).
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // Empty: not written.
  bool eos_token_id_is_list = false;
  // Capture ids, SGLang convention (id k = output of decoder layer k); exactly
  // three, distinct, ascending.
  CaptureLayerIds aux_layer_ids;
  // When > 0, ids must be < target_num_hidden_layers - 1 (the output of the
  // last layer has no next layer to be captured at). Not written.
  int64_t target_num_hidden_layers = 0;
  // EAGLE 3.1 (student/draft_model.h Eagle3Options; docs/eagle3.md): each
  // is written to config.json when set, and fc_norm / norm_before_fc add
  // their norm tensors (kFcNormTensorFormat, kNormBeforeFcTensor). fc_norm
  // with norm_before_fc is refused.
  bool fc_norm = false;
  bool norm_output = false;
  bool norm_before_fc = false;
  // P-EAGLE (docs/peagle.md): parallel_drafting adds the mask_hidden tensor
  // [1, 1, 3·TH] and writes, for vLLM's parallel drafting, parallel_drafting,
  // mask_token_id (and its other names pard_token and ptd_token_id), and
  // what training used: num_depths (K) and the COD shares.
  bool parallel_drafting = false;
  int64_t mask_token_id = 0;
  int64_t num_depths = 0;
  double down_sample_ratio = 0.7;
  double down_sample_ratio_min = 0.2;
  // dtype of the exported float weights: "bfloat16" (default), "float16" or
  // "float32". d2t stays I64 and t2d BOOL.
  std::string torch_dtype = "bfloat16";
};

struct ExportInput {
  // Draft tensors by export name (see the file comment), any float dtype for
  // weights, an integer dtype for d2t, bool or 0/1 uint8 for t2d; any device.
  std::map<std::string, torch::Tensor> tensors;
  ExportConfig config;
};

// The target-derived part of an ExportConfig: draft sizes equal to the
// target's (as DraftSpec's defaults), rope, positions, vocab, bos/eos, layer
// count and the default capture ids (left empty below 8 layers). The caller
// sets draft_vocab_size and overrides what the job changed.
absl::StatusOr<ExportConfig> ExportConfigFromTarget(const HfModelConfig& target);

// The dtype of an export's float weights from its torch_dtype name
// ("bfloat16", "float16", "float32"); InvalidArgument naming
// config.torch_dtype otherwise.
absl::StatusOr<torch::Dtype> ExportWeightDtype(const std::string& torch_dtype);

// Checks an export without writing: config consistency, the exact tensor set,
// shapes and dtype kinds, finite weights, d2t/t2d agreement. InvalidArgument
// naming the field ("config.draft_vocab_size: ...") or the tensor
// ("tensor midlayer.mlp.up_proj.weight: shape [..], expected [..]").
absl::Status ValidateExport(const ExportInput& in);

// The config.json object ExportDraft writes (keys sorted).
nlohmann::json ExportConfigJson(const ExportConfig& config);

// Validates, then writes config.json and model.safetensors into
// `<out_dir>.tmp-XXXXXX` and renames it to `out_dir` (parents created). An
// existing `out_dir` is replaced only after the new one is complete, and only
// when it holds nothing but a previous export's files (else
// FailedPrecondition). On any error nothing is left behind. `env` (null:
// Env::Default()) takes the filesystem steps.
absl::Status ExportDraft(const ExportInput& in, const std::string& out_dir, Env* env = nullptr);

// The directory write every draft export shares (this one and
// student/block_export.h): writes `config_text` as config.json and
// `model_bytes` as model.safetensors in place of `out_dir` (trailing slashes
// ignored, parents created) with ReplaceDirectory (common/env.h): staged in
// `<out_dir>.tmp-XXXXXX`, an old export moved aside to `<out_dir>.old-XXXXXX`
// and put back when the new one cannot move in. An existing `out_dir` is
// replaced only when it holds nothing but those two files (else
// FailedPrecondition, checked before anything is written). On any error
// nothing new is left behind. Callers validate and serialize first, so a
// refused export never touches the disk.
absl::Status WriteDraftDirectory(const std::string& out_dir, const std::string& config_text,
                                 const std::string& model_bytes, Env* env = nullptr);

// Reads an export directory back: config.json into ExportConfig (aux ids from
// eagle_config, checked against the top-level vLLM key when present) and
// every tensor of model.safetensors as a CPU tensor in its stored dtype. Does
// not run ValidateExport.
absl::StatusOr<ExportInput> ReadExport(const std::string& dir);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_EXPORT_H_
