// The DFlash / DSpark draft export that SGLang loads (`--speculative-algorithm
// DFLASH` / `DSPARK --speculative-draft-model-path <dir>`) and z-lab's
// transformers DFlashDraftModel reads, shared/DESIGN.md §10. The directory
// holds exactly config.json and model.safetensors, written by
// WriteDraftDirectory (student/export.h): atomically, an old export replaced
// only when complete.
//
// config.json: a Qwen3 config of the draft (model_type "qwen3",
// num_hidden_layers = draft layers, the draft's sizes, the target's vocab,
// rope, positions and bos/eos, hidden_act silu, tie_word_embeddings false,
// layer_types all "full_attention"), plus
//   DFlash  architectures ["DFlashDraftModel"], dflash_config {target_layer_ids,
//           mask_token_id, block_size}, and top-level block_size and
//           num_target_layers (z-lab's DFlashDraftModel reads both at the top
//           level; SGLang's parse_dflash_draft_config reads the nested key
//           first, then the top level, and without num_target_layers bounds
//           the ids by the draft's own layer count).
//   DSpark  architectures ["Qwen3DSparkModel"], top-level block_size,
//           mask_token_id, target_layer_ids, num_target_layers, markov_rank,
//           markov_head_type "vanilla", enable_confidence_head,
//           confidence_head_with_markov.
// model.safetensors (H hidden, A/B query/KV heads, D head_dim, I
// intermediate, C = len(target_layer_ids), V target vocab, r markov_rank):
//   fc.weight [H, C·H], hidden_norm.weight [H]
//   layers.{i}.self_attn.{q [A·D, H], k, v [B·D, H]}_proj.weight,
//   layers.{i}.self_attn.o_proj.weight [H, A·D],
//   layers.{i}.self_attn.{q,k}_norm.weight [D],
//   layers.{i}.mlp.{gate,up}_proj.weight [I, H], layers.{i}.mlp.down_proj.weight [H, I],
//   layers.{i}.{input,post_attention}_layernorm.weight [H], norm.weight [H]
//   DSpark: markov_head.markov_w1.weight [V, r], markov_head.markov_w2.weight [V, r],
//           and with the confidence head confidence_head.proj.weight [1, H (+ r
//           with markov)], confidence_head.proj.bias [1].
// No embed_tokens and no lm_head: the servers use the target's. Weights are
// bfloat16 unless torch_dtype says float16 or float32.
//
// Thread-safety: pure functions; concurrent exports to the same directory are
// not supported.
#ifndef SPECSTREAM_STUDENT_BLOCK_EXPORT_H_
#define SPECSTREAM_STUDENT_BLOCK_EXPORT_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/hf_config.h"
#include "nlohmann/json.hpp"
#include "student/block_draft.h"
#include "student/draft_model.h"

namespace specstream::student {

inline constexpr char kDFlashArchitecture[] = "DFlashDraftModel";
inline constexpr char kDSparkArchitecture[] = "Qwen3DSparkModel";

// config.json's object of the training-only options an evaluation of the
// export needs (the servers ignore it): {"num_anchors", "loss_decay_gamma",
// and for DSpark "loss_weights": {"ce", "l1", "conf"}}.
inline constexpr char kBlockTrainingKey[] = "specstream_training";

// Everything a block-draft export holds.
struct BlockExport {
  // kind, num_layers, block_size, mask_token_id, target_layer_ids and (DSpark)
  // markov_rank, confidence_head, confidence_with_markov are the servers'
  // fields; num_anchors, loss_decay_gamma and the loss weights travel under
  // kBlockTrainingKey, so that evaluating an export equals evaluating its
  // checkpoint.
  BlockDraftOptions options;
  // Whether config.json carried kBlockTrainingKey (ReadBlockExport; an
  // export from another tool does not, and then the training-only options
  // keep their defaults).
  bool has_training_options = true;
  // The draft's sizes and the target's rope / positions / vocab
  // (target_vocab_size). num_captures must equal target_layer_ids.size() and
  // hidden_size target_hidden_size; draft_vocab_size is not exported
  // (ReadBlockExport sets it to the target vocab, as BlockDraft does).
  DraftShape shape;
  int64_t num_target_layers = 0;  // the target's decoder layers
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // Empty: not written.
  bool eos_token_id_is_list = false;
  // "bfloat16" (default), "float16" or "float32": the stored weight dtype.
  std::string torch_dtype = "bfloat16";
  // Tensors by export name, any float dtype, any device.
  std::map<std::string, torch::Tensor> tensors;
};

// The export's tensor names and shapes for these options and shape, in
// file-comment order.
std::vector<std::pair<std::string, std::vector<int64_t>>> BlockExportTensorShapes(
    const BlockDraftOptions& options, const DraftShape& shape);

// The export of a trained draft against its target's config: the draft's
// options, shape and parameters (copied to the host), the target's layer
// count and bos/eos. Does not validate.
absl::StatusOr<BlockExport> BlockExportFromDraft(const BlockDraft& draft,
                                                 const HfModelConfig& target,
                                                 const std::string& torch_dtype = "bfloat16");

// Checks an export without writing: config fields, then the exact tensor set,
// shapes, floating dtypes and finite values. InvalidArgument naming the field
// ("config.markov_rank: ...") or the tensor ("tensor layers.1.mlp.up_proj.weight:
// shape [..], expected [..]"; "tensor lm_head.weight: not part of a dspark
// export").
absl::Status ValidateBlockExport(const BlockExport& in);

// The config.json object WriteBlockExport writes (keys sorted).
absl::StatusOr<nlohmann::json> BlockExportConfigJson(const BlockExport& in);

// Validates, converts the weights to torch_dtype in memory, then writes the
// directory through WriteDraftDirectory. A refused export writes nothing.
absl::Status WriteBlockExport(const BlockExport& in, const std::string& out_dir);

// BlockExportFromDraft + WriteBlockExport.
absl::Status ExportBlockDraft(const BlockDraft& draft, const HfModelConfig& target,
                              const std::string& out_dir,
                              const std::string& torch_dtype = "bfloat16");

// Reads an export directory back for evaluation: the config into options and
// shape (architectures picks the kind; DFlash ids from dflash_config, else
// the top level) and every tensor as a CPU tensor in its stored dtype; then
// runs ValidateBlockExport, so a directory that is not a well-formed
// block-draft export is refused naming what is wrong.
absl::StatusOr<BlockExport> ReadBlockExport(const std::string& dir);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_BLOCK_EXPORT_H_
