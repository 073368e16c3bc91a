// Block-parallel drafts, DFlash and DSpark (DESIGN.md §10): a whole block of
// tokens drafted in one forward, trained from the same teacher tensors as
// EAGLE-3 (input_ids, loss_mask, aux_hidden of the capture layers, and the
// post-norm last_hidden).
//
// Trainable parameters (fp32 masters; names are the SGLang export names):
//   fc.weight [H, n·H]        the captured layers -> H; hidden_norm.weight [H]
//   layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight [D]
//   layers.{i}.mlp.{gate,up,down}_proj.weight
//   layers.{i}.{input,post_attention}_layernorm.weight, norm.weight
//   DSpark: markov_head.markov_w1.weight [V, r] (an embedding),
//           markov_head.markov_w2.weight [V, r] (a Linear r -> V),
//           confidence_head.proj.{weight [1, H (+ r)], bias [1]} when enabled.
// Frozen, from the target checkpoint: embed_tokens [V, H] and the full-vocab
// lm_head [V, H] (embed_tokens when the target ties them).
//
// The forward (one step's batch, a fixed set of anchors):
//   context c = hidden_norm(fc(aux)) [B, S, H], positions 0..S-1;
//   a block at anchor a: slot 0 holds x[a], slots 1..bs-1 the mask token,
//   positions a..a+bs-1; each layer's keys/values are k/v_proj of the
//   context and of the block (KV injection), queries come from the block
//   only (BlockAttention: the context before a, the own block both ways);
//   q_norm/k_norm (Qwen3) before RoPE.
//   Labels and weights per type (§10):
//     DFlash: slot k predicts x[a+k]; weight keep·[a+k<len]·[k>0]·mask[a+k]·exp(-(k-1)/γ);
//             cross-entropy on the hard label.
//     DSpark: slot k predicts x[a+k+1]; eval_k = [a+k+1<len]·mask[a+k+1]·keep, cumulative
//             product over k; weight eval_k·exp(-k/γ). Logits lm_head(h_k) + W2(W1[prev_k]),
//             prev_k = x[a+k] (teacher forced); terms ce·CE + l1·‖softmax(draft) -
//             softmax(teacher)‖₁ (fp32, teacher = lm_head(last_hidden[a+k])) + conf·BCE(
//             proj([h_k; W1[prev_k]]), stopgrad(clamp(1 - L1/2, 0, 1))).
//   Loss = Σ weight·term / (the global Σ weight over all ranks), so N ranks
//   train like one rank with the whole batch.
//
// Memory is linear in the context and in the anchors: attention through
// BlockAttention, and the full-vocab objective a chunk of blocks at a time
// (each chunk's loss is differentiated at once into the final hidden state,
// whose gradient then flows back through the layers in the caller's
// backward), so no [N·bs, V] logits live beyond one chunk.
//
// Thread-safety: one training thread uses a draft at a time.
#ifndef SPECSTREAM_STUDENT_BLOCK_DRAFT_H_
#define SPECSTREAM_STUDENT_BLOCK_DRAFT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/torch/blocks.h"
#include "common/torch/compat.h"
#include "nlohmann/json.hpp"
#include "student/draft_model.h"

namespace specstream::student {

enum class BlockDraftKind { kDFlash, kDSpark };

// "dflash" / "dspark".
const char* BlockDraftKindName(BlockDraftKind kind);

struct BlockDraftOptions {
  BlockDraftKind kind = BlockDraftKind::kDFlash;
  int64_t num_layers = 1;
  int64_t block_size = 16;
  int64_t num_anchors = 512;
  int64_t mask_token_id = 0;
  CaptureLayerIds target_layer_ids;  // the captures fc reads, in order
  double loss_decay_gamma = 7;
  // DSpark only.
  int64_t markov_rank = 256;
  bool confidence_head = true;
  bool confidence_with_markov = true;
  double ce_weight = 0.1;
  double l1_weight = 0.9;
  double conf_weight = 1.0;
  // Rows (block slots) of full-vocab logits held at once; 0: about 2^21
  // logits a chunk.
  int64_t loss_chunk_rows = 0;
};

// The options as checkpoints' state.json records them ("block_draft") and
// back; the JSON names are the job spec's (model.draft.*). FromJson refuses
// a missing or ill-typed key, naming it.
nlohmann::json BlockDraftOptionsJson(const BlockDraftOptions& options);
absl::StatusOr<BlockDraftOptions> BlockDraftOptionsFromJson(const nlohmann::json& json);
// "dflash" / "dspark" -> the kind; InvalidArgument naming model.draft.type otherwise.
absl::StatusOr<BlockDraftKind> BlockDraftKindFromName(const std::string& name);

// One step's anchors for a batch, on the host: anchors[b, j] is block j's
// anchor position in sample b (ascending over the kept blocks); rows with
// fewer candidates than the batch width end in dummy blocks (keep 0,
// anchor 0).
struct BlockAnchors {
  torch::Tensor anchors;  // [B, N] int64, CPU
  torch::Tensor keep;     // [B, N] bool, CPU
};

// Draws the anchors of one step (DESIGN.md §10): candidates are positions i
// with loss_mask[i] and loss_mask[i+1] (i+1 < length); each sample takes a
// uniform subset of min(num_anchors, candidates) without replacement,
// sorted; the width is N = max over samples (at least 1: a batch without a
// candidate is all dummies). The draw for a sample depends only on (seed,
// step, sample_keys[b]) — a counter-based stream, so it is the same on
// every rank, for any batch composition, and after a resume.
// `batch` is on the host; sample_keys[b] identifies sample b (its index in
// the data set).
BlockAnchors SampleBlockAnchors(const DraftBatch& batch, const std::vector<int64_t>& sample_keys,
                                uint64_t seed, int64_t step, int64_t num_anchors);

// Context parallelism: rank `rank` of `size`'s share of a step's blocks.
// Block j of each row goes to rank j % size (round robin over the ascending
// anchors, which spreads both the count and the context length evenly),
// padded with dummies to ceil(N / size) columns (at least 1). Over the ranks
// the kept blocks are exactly `all`'s, so the loss, the weights and the
// metrics are those of one rank with the whole sequence.
BlockAnchors DealBlocks(const BlockAnchors& all, int64_t size, int64_t rank);

// Per-rank sums of a step, on the batch's device; the trainer all-reduces
// them before reading them back.
struct BlockOutputs {
  // float32 scalar: Σ weight·term / global Σ weight; its backward carries
  // the gradient through the layers (the heads' gradients are already
  // accumulated by Forward).
  torch::Tensor weighted_loss;
  torch::Tensor loss_sum;    // float64 scalar Σ weight·term (before normalisation)
  torch::Tensor weight_sum;  // float64 scalar Σ weight on this rank
  torch::Tensor correct;     // int64 [bs]: weighted slots whose argmax is the label
  torch::Tensor counted;     // int64 [bs]: weighted slots
  torch::Tensor accepted;    // float64 scalar: Σ over kept blocks of 1 + Σ_k Π_{i≤k} correct_i
  torch::Tensor blocks;      // int64 scalar: kept blocks
  // DSpark with a confidence head: [kCalibrationBins, 3] float64 per bin of
  // predicted confidence: count, Σ predicted, Σ target (1 - L1/2).
  torch::Tensor calibration;
};

inline constexpr int64_t kCalibrationBins = 10;

// Σ|x| over the last dimension, accumulated in float64 and returned in x's
// dtype: DSpark's L1 term over the whole vocabulary (its confidence target
// 1 − L1/2 inherits any error).
torch::Tensor RowAbsSum(const torch::Tensor& x);

// Expected calibration error from summed bins: Σ_bin |Σ pred - Σ target| /
// total count.
double CalibrationError(const double* bins, int64_t num_bins);

class BlockDraft final {
 public:
  // Random init (seeded, on the host), frozen embed_tokens and lm_head from
  // the target checkpoint; everything then lives on `device`.
  // shape.num_captures must equal options.target_layer_ids.size();
  // shape.draft_vocab_size is ignored (the target's vocab is the draft's).
  static absl::StatusOr<std::unique_ptr<BlockDraft>> Create(const DraftShape& shape,
                                                            const BlockDraftOptions& options,
                                                            const std::string& target_dir,
                                                            uint64_t seed,
                                                            torch::Device device = torch::kCPU);

  // Σ weight over this rank's batch for these anchors (float64 scalar on
  // the batch's device); the denominator before the all-reduce.
  torch::Tensor WeightSum(const DraftBatch& batch, const BlockAnchors& anchors) const;

  // The step's forward and, when grad mode is on, the heads' backward (see
  // the file comment). `global_weight_sum` is a float64 scalar on the
  // draft's device; `compute_dtype` float32, bfloat16 or float64 (tests).
  // The batch is on the draft's device.
  //
  // Without context parallelism (`cp_group` null) the batch holds whole
  // samples. Under CP it holds this rank's shard of the hidden states,
  // aux_hidden and last_hidden [B, Tpad, ·] from global position
  // batch.offset (student/context_parallel.h's ShardRange), and the WHOLE
  // token ids and loss mask [B, cp·Tpad] (they are small); the anchors
  // may lie anywhere in the sequence (DealBlocks). The context stays
  // sharded: each layer projects its keys and values on the rank's shard,
  // and RingBlockAttention passes the shards round `cp_group` (their
  // gradients return to the owners in backward), so the context's memory
  // per rank is 1/cp of it. DSpark's last_hidden rows at the slots are
  // exchanged (no gradient; O(slots·H), the positions all-gathered), which
  // needs the same number of blocks on every rank (DealBlocks pads).
  // Collective: every rank of the group calls Forward and backward together.
  absl::StatusOr<BlockOutputs> Forward(const DraftBatch& batch, const BlockAnchors& anchors,
                                       const torch::Tensor& global_weight_sum,
                                       torch::Dtype compute_dtype, CommGroup* cp_group = nullptr);

  // Labels [B, N, bs] int64 and weights [B, N, bs] float64 of these anchors
  // (on the batch's device), as the file comment defines them per type.
  std::pair<torch::Tensor, torch::Tensor> LabelsAndWeights(const DraftBatch& batch,
                                                           const torch::Tensor& anchors,
                                                           const torch::Tensor& keep) const;

  // Inference (speculative decoding): one block after the committed `ids`
  // (n >= 2 tokens, the last not yet run by the target) from the target's
  // captures of rows 0..n-2 (aux [n-1, n_capt·H]): the anchor is the last
  // token, the context every row before it. DFlash proposes slots 1..bs-1,
  // DSpark slots 0..bs-1 with the Markov head reading the token picked for
  // the slot before (the anchor's for slot 0). At most `max_tokens`, each
  // picked by `chooser` from the slot's full-vocab logits. float32, no
  // gradient.
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, spec::TokenChooser& chooser,
                       std::vector<int32_t>* tokens);
  // Tokens one block proposes: bs - 1 (DFlash) or bs (DSpark).
  int64_t proposal_length() const;

  torch::Device device() const { return embed_.device(); }
  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return params_; }
  torch::Tensor& parameter(const std::string& name);
  const DraftShape& shape() const { return shape_; }
  const BlockDraftOptions& options() const { return options_; }
  const torch::Tensor& embed_tokens() const { return embed_; }
  const torch::Tensor& lm_head() const { return lm_head_; }

 private:
  BlockDraft() = default;
  torch::Tensor& Add(const std::string& name, torch::Tensor value);
  // The layers over the blocks at `anchors` (slot positions `positions`
  // [B, N·bs] on the device): the final-normed hidden state [B, N·bs, H].
  torch::Tensor Backbone(const DraftBatch& batch, const BlockAnchors& anchors,
                         const torch::Tensor& positions, torch::Dtype cd, CommGroup* cp_group);

  DraftShape shape_;
  BlockDraftOptions options_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::map<std::string, size_t> index_;
  torch::Tensor embed_;    // frozen [V, H]
  torch::Tensor lm_head_;  // frozen [V, H]
  std::optional<nn::Rotary> rotary_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_BLOCK_DRAFT_H_
