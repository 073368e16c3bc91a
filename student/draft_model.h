// The EAGLE-3 draft (`LlamaForCausalLMEagle3`, shared/DESIGN.md §3) and its
// training-time-test (TTT) unroll.
//
// Trainable parameters (fp32 master copies; names are the export names):
//   fc.weight [H, C·Ht]                      aux features (C captured layers) -> H
//   midlayer.self_attn.{q,k,v}_proj.weight   input 2H = cat(input_layernorm(embed), hidden_norm(h))
//   midlayer.self_attn.o_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight
//   midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight
//   norm.weight, lm_head.weight [draft_vocab, H]
// EAGLE 3.1 (Eagle3Options, all off by default, which is EAGLE-3 exactly):
//   fc_norm.{i}.weight [Ht]  fc_norm: one RMSNorm per captured layer before fc
//                            (vLLM loads it as model.fc_norm.{i}.weight)
//   input_norm.weight [C·Ht] norm_before_fc: one RMSNorm over the
//                            concatenated captures before fc
// Frozen (from the target checkpoint): embed_tokens [V, Ht] and the target
// lm_head rows selected by t2d [draft_vocab, Ht] (the teacher distribution),
// plus the full target lm_head when the data carries no target_ids.
//
// Thread-safety: one training thread uses a model at a time.
#ifndef SPECSTREAM_STUDENT_DRAFT_MODEL_H_
#define SPECSTREAM_STUDENT_DRAFT_MODEL_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/hf_config.h"
#include "common/torch/blocks.h"
#include "common/torch/compat.h"
#include "common/torch/speculative.h"
#include "common/vocab_map.h"

namespace specstream::student {

struct DraftShape {
  int64_t hidden_size = 0;         // H (= the target's hidden size)
  int64_t target_hidden_size = 0;  // Ht
  int64_t num_captures = 3;        // C
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t draft_vocab_size = 0;
  int64_t target_vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
};

// A draft of the target's own sizes reading `captures` captured layers:
// hidden sizes, heads, head_dim, intermediate size, vocab (the draft vocab
// too, until an EAGLE-3 vocab map narrows it), norm epsilon, RoPE and
// positions, all from the target's config.json.
DraftShape TargetDraftShape(const HfModelConfig& target, int64_t captures);

// EAGLE 3.1's opt-in changes to the EAGLE-3 draft (docs/eagle3.md). All
// false is EAGLE-3, bit for bit.
//   fc_norm: fc(cat(Norm_0(h_a), Norm_1(h_b), Norm_2(h_c))), a separate
//     RMSNorm (weight fc_norm.{i}.weight [Ht]) over each captured layer.
//   norm_before_fc: fc(Norm(cat(h_a, h_b, h_c))), one RMSNorm over the
//     concatenation (weight input_norm.weight [C·Ht]); NVIDIA's gpt-oss
//     drafts. Exclusive with fc_norm.
//   norm_output: the next TTT step takes the post-norm hidden state
//     norm(h) as its hidden input (and residual) instead of the raw layer
//     output h; the lm_head reads norm(h) either way. No new parameters.
//
// P-EAGLE (parallel drafting, docs/peagle.md) on top of either: TTT steps
// ("depths") k >= 1 read the mask token's embedding and fc(mask_hidden), a
// learnable [1, 1, C·Ht] stand-in for the captures, instead of the next
// token and the previous step's hidden state. Every depth's input is then
// known up front, so one forward proposes all K tokens. Training keeps, at
// depth k >= 1, only the rows a COD plan draws (student/cod_sampling.h),
// and the loss is the soft cross-entropy summed over every trained
// (row, depth) divided by their count (no per-step decay).
struct Eagle3Options {
  bool fc_norm = false;
  bool norm_output = false;
  bool norm_before_fc = false;
  bool parallel_drafting = false;
  int64_t mask_token_id = 0;  // a row of the target's embedding table
  // EAGLE 3.1's flags (P-EAGLE is its own draft type).
  bool any() const { return fc_norm || norm_output || norm_before_fc; }
};

// InvalidArgument naming both model.draft fields when fc_norm and
// norm_before_fc are both set.
absl::Status ValidateEagle3Options(const Eagle3Options& options);

// A batch of samples right-padded to a common length, or (context
// parallelism) one rank's shard of such a batch: T rows of global positions
// [offset, offset + T), plus `halo` rows after them in the per-token inputs
// (the TTT unroll at step k reads ids, loss mask and teacher targets k+1
// positions ahead, which may lie in the next shard). Without CP, offset = 0
// and halo = 0. Rows past a sample's length are zero.
// Every tensor is on one device (the trainer's); `host_lengths` repeats
// `lengths` on the host, so that shapes and token counts never wait for the
// device.
struct DraftBatch {
  torch::Tensor input_ids;            // [B, T + halo] int64
  torch::Tensor loss_mask;            // [B, T + halo] uint8 (0 on padding)
  torch::Tensor aux_hidden;           // [B, T, C·Ht]: the shard's own rows only
  torch::Tensor last_hidden;          // [B, T + halo, Ht]
  torch::Tensor target_ids;           // [B, T + halo] int64 full-vocab argmax, or undefined
  torch::Tensor lengths;              // [B] int64: each sample's whole (global) length
  std::vector<int64_t> host_lengths;  // the same B lengths
  int64_t offset = 0;                 // global position of row 0
  // Under CP, for a draft that plans on whole samples
  // (TrainableDraft::plans_on_whole_loss_mask): [B, cp·T] uint8 on the
  // host, each sample's whole loss mask. Undefined otherwise.
  torch::Tensor whole_loss_mask;
};

// Context parallelism for Forward (student/context_parallel.h): the groups
// this rank's attention exchanges over, null where the degree is 1. The batch
// must then be this rank's shard (same T on every rank of the CP group) and
// every rank of the groups must call Forward and backward together.
struct DraftParallel {
  CommGroup* ulysses = nullptr;
  CommGroup* ring = nullptr;
};

// Per-step sums over this rank's valid positions, on the batch's device
// (nothing is read back to the host); the trainer all-reduces them before
// normalising.
struct TttOutputs {
  torch::Tensor weighted_loss;  // float32 scalar: Σ_k kTttLossDecay^k · Σ_valid CE_k / denominators
  torch::Tensor loss_sum;       // float64 [K]: Σ_valid CE per step (before normalisation)
  torch::Tensor correct;        // int64 [K]: draft argmax == teacher argmax
  torch::Tensor valid;          // int64 [K]: valid positions on this rank
};

// The target checkpoint's frozen embed_tokens and lm_head, each [vocab,
// hidden] float32 on `device` (the head is embed_tokens when the target ties
// them). InvalidArgument when a tensor is missing or of another shape.
absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> LoadTargetEmbeddings(
    const std::string& target_dir, int64_t vocab, int64_t hidden, torch::Device device);

// HF's init of a draft's linear weights: N(0, 0.02) float32 of `shape`,
// drawn from `gen` (on the host, so every device starts from the same
// weights). Both draft families start from it.
torch::Tensor HfInitNormal(at::Generator& gen, const std::vector<int64_t>& shape);

class Eagle3Draft final {
 public:
  // Random init (seeded, on the host, so every device starts from the same
  // weights), frozen tensors from the target checkpoint; everything then
  // lives on `device`.
  static absl::StatusOr<std::unique_ptr<Eagle3Draft>> Create(const DraftShape& shape,
                                                             const std::string& target_dir,
                                                             const VocabMap& vocab_map,
                                                             uint64_t seed, bool need_full_lm_head,
                                                             torch::Device device = torch::kCPU,
                                                             const Eagle3Options& options = {});

  // The TTT unroll over `ttt_steps` steps, on the device of the draft (the
  // batch must be there too). `valid_denominators` (int64 [K], same device)
  // holds the global (all ranks) count of valid positions at each step k, so
  // that the loss is normalised exactly as on one rank. `compute_dtype` is
  // float32 or bfloat16 (parameters are cast; masters stay fp32). Under
  // context parallelism `batch` is this rank's shard with a halo of >=
  // ttt_steps rows and `parallel` names the groups; outputs cover the
  // shard's own rows. Reads nothing back from the device.
  // P-EAGLE: `keep` (bool [K, B, T] over the batch's own rows, on the
  // host: the COD plan) says which rows train at each depth k >= 1 (row
  // k = 0 is not read); only those rows go on past the attention at that
  // depth. valid_denominators then holds the global count of trained rows
  // per depth, and the loss divides by their sum.
  absl::StatusOr<TttOutputs> Forward(const DraftBatch& batch, int ttt_steps,
                                     const torch::Tensor& valid_denominators,
                                     torch::Dtype compute_dtype, const DraftParallel& parallel = {},
                                     const torch::Tensor& keep = {});

  // Valid-position counts per step over the batch's own rows (the
  // denominators before the all-reduce), int64 [K] on the batch's device:
  // global position p is valid at step k iff p+k+1 < len, loss_mask[p+k] = 1
  // and the full-vocab argmax at p+k+1 is in the draft vocab (and, for
  // P-EAGLE at k >= 1, `keep` holds it).
  torch::Tensor CountValid(const DraftBatch& batch, int ttt_steps,
                           const torch::Tensor& keep = {}) const;

  // Inference (speculative decoding): the chain of up to `max_tokens`
  // tokens after the committed `ids` (n >= 2 tokens, the last not yet run by
  // the target), from the target's captures of rows 0..n-2 (aux [n-1, C·Ht]).
  // The TTT unroll at the last row with the draft's own tokens: step 0 reads
  // embed(ids[n-1]) and fc(aux[n-2]) and attends to every row's step-0 keys;
  // step k reads its own previous hidden state and token. Each token is
  // picked by `chooser` from the draft's logits over the target vocab (-inf
  // outside the draft vocab). float32 math, no gradient. Step 0's keys and
  // values of the rows a call shares with the previous one (same ids, same
  // captures: a decode's committed prefix) are kept between calls, so a
  // round runs the draft on its new rows only; Forward drops them.
  // P-EAGLE: the steps after 0 read the mask token and fc(mask_hidden) at
  // positions r+1, r+2, ... and attend to step 0's keys and to each other
  // (earlier-or-equal depths), so one forward gives every step's logits;
  // `chooser` then picks the tokens in order.
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, spec::TokenChooser& chooser,
                       std::vector<int32_t>* tokens);

  torch::Device device() const { return embed_.device(); }

  // Trainable parameters by export name, in a fixed order.
  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return params_; }
  torch::Tensor& parameter(const std::string& name);
  const DraftShape& shape() const { return shape_; }
  const VocabMap& vocab_map() const { return vocab_map_; }
  const Eagle3Options& options() const { return options_; }

 private:
  Eagle3Draft() = default;
  torch::Tensor& Add(const std::string& name, torch::Tensor value);
  // Full-vocab argmax of the teacher at every position (from target_ids when
  // present, else from last_hidden and the full target lm_head).
  torch::Tensor TeacherArgmax(const DraftBatch& batch) const;
  // [B, T + halo] bool: position's teacher argmax lies in the draft vocab.
  torch::Tensor InDraftVocab(const DraftBatch& batch) const;
  // Step 0's hidden input fc(aux), with the options' norms before fc; aux
  // [..., C·Ht] in any float dtype, computed in `cd`.
  torch::Tensor FcInput(const torch::Tensor& aux, torch::Dtype cd);
  // The hidden input of the step after one whose layer output is `h`
  // (norm(h) under norm_output, else h itself).
  torch::Tensor NextHidden(const torch::Tensor& h, const torch::Tensor& norm) const;
  // How many leading rows of the last proposal's step-0 keys still hold for
  // these ids and captures.
  int64_t CachedProposalRows(const std::vector<int32_t>& ids, const torch::Tensor& aux) const;
  // valid[k] over the batch's own rows as a [B, T] bool mask (ANDed with
  // keep[k] for a P-EAGLE depth k >= 1).
  torch::Tensor ValidMask(const DraftBatch& batch, const torch::Tensor& in_vocab, int k,
                          const torch::Tensor& keep) const;
  // P-EAGLE's inputs at depths >= 1: the mask token's embedding [1, Ht]
  // and fc(mask_hidden) [1, H], in `cd`.
  torch::Tensor MaskEmbedding(torch::Dtype cd) const;
  torch::Tensor MaskHidden(torch::Dtype cd);

  DraftShape shape_;
  Eagle3Options options_;
  VocabMap vocab_map_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::map<std::string, size_t> index_;
  torch::Tensor embed_;         // frozen [V, Ht]
  torch::Tensor teacher_head_;  // frozen [draft_vocab, Ht]
  torch::Tensor full_lm_head_;  // frozen [V, Ht], only when needed
  torch::Tensor t2d_;           // [V] bool
  std::optional<nn::Rotary> rotary_;
  // Propose's step-0 keys and values of `rows` rows, made from `ids` and
  // `aux` (float32, on the draft's device).
  struct ProposalCache {
    std::vector<int32_t> ids;
    torch::Tensor aux, keys, values;
    int64_t rows = 0;
  };
  ProposalCache proposal_cache_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_DRAFT_MODEL_H_
