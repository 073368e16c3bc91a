// The hf runtime as the target of in-process speculative decoding
// (common/torch/speculative.h): one sequence at a time on a KV cache, each
// forward returning the new rows' full-vocab logits and the captures the
// draft reads; and the target answering prompts on its own (TargetAnswers).
#ifndef SPECSTREAM_TEACHER_DECODE_TARGET_H_
#define SPECSTREAM_TEACHER_DECODE_TARGET_H_

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/capture_layers.h"
#include "common/torch/speculative.h"
#include "teacher/hf_runtime.h"

namespace specstream {
class Tokenizer;
}  // namespace specstream

namespace specstream::teacher {

class DecodeTarget final : public spec::Target {
 public:
  // `capture_layer_ids`: the layers the draft's fc reads, in its order
  // (empty: the runtime's described ones). The runtime must outlive this.
  DecodeTarget(HfRuntime& runtime, CaptureLayerIds capture_layer_ids)
      : runtime_(runtime), captures_(std::move(capture_layer_ids)) {}

  absl::StatusOr<Rows> Extend(const std::vector<int32_t>& ids, int64_t logit_rows) override;
  void Truncate(int64_t length) override { cache_.Truncate(length); }
  void Reset() override { cache_.Truncate(0); }

 private:
  HfRuntime& runtime_;
  CaptureLayerIds captures_;
  KvCache cache_;
};

// The ids that end an answer: the model's eos ids, and the tokenizer's
// end-of-turn tokens (<|im_end|>, <|eot_id|>, <|endoftext|>) where it has
// them (`tokenizer` may be null).
std::vector<int32_t> StopIds(const HfModelConfig& config, const Tokenizer* tokenizer);
// StopIds with the tokenizer in `tokenizer_dir`, else the one in `model_dir`
// where it has a tokenizer.json, else none: what `specstream-eval generate`,
// `dump --regenerate` and a serving teacher's answers stop at.
absl::StatusOr<std::vector<int32_t>> AnswerStopIds(const HfModelConfig& config,
                                                   const std::string& model_dir,
                                                   const std::string& tokenizer_dir = "");

// One answer being decoded, a token at a time: what spec::Decode does with
// no draft (the first token from the prompt's prefill, each next one from
// the step before; greedy at temperature 0, else sampled with an
// mt19937_64 seeded `options.seed`; ending after a stop id or
// max_new_tokens), in steps, so that a teacher can advance several answers
// in one batched forward (StepAnswers). A step's rows do not depend on the
// batch's other rows except through the GEMMs' blocking: answers decoded
// alone (a batch of one) equal spec::Decode's bit for bit.
class AnswerDecoder {
 public:
  explicit AnswerDecoder(spec::DecodeOptions options)
      : options_(std::move(options)), rng_(options_.seed) {}
  // Prefills `prompt` (non-empty) on this answer's cache and picks the
  // first token.
  absl::Status Start(HfRuntime& runtime, const std::vector<int32_t>& prompt);
  bool done() const { return done_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  friend absl::Status StepAnswers(HfRuntime& runtime, const std::vector<AnswerDecoder*>& answers);
  // Appends the pick from one row of next-token logits [V].
  void Pick(const torch::Tensor& logits);

  spec::DecodeOptions options_;
  std::mt19937_64 rng_;
  KvCache cache_;
  std::vector<int32_t> tokens_;
  bool done_ = false;
};

// Advances every answer not done by one token, in one HfRuntime::DecodeStep.
absl::Status StepAnswers(HfRuntime& runtime, const std::vector<AnswerDecoder*>& answers);

// The target answering prompts itself: target-only decoding on its KV cache
// (spec::Decode with no draft), at most `options.max_new_tokens` tokens,
// ending after a stop id. What `specstream-eval generate` writes and
// `specstream-teacher dump --regenerate` trains on. Deterministic: the
// answer to prompt `id` is sampled with seed `options.seed + id`, so asking
// again gives the same answer. The runtime must outlive this.
class TargetAnswers {
 public:
  TargetAnswers(HfRuntime& runtime, spec::DecodeOptions options)
      : runtime_(runtime), options_(std::move(options)) {}
  // The answer's tokens (and its time in stats.seconds).
  absl::StatusOr<spec::DecodeResult> Answer(const std::vector<int32_t>& prompt, int64_t id);
  const spec::DecodeOptions& options() const { return options_; }
  // The options of prompt `id`'s answer: the seed is options.seed + id.
  spec::DecodeOptions OptionsFor(int64_t id) const;
  // Answers prompts[i] (seeded by ids[i]), up to `batch` at a time in
  // batched steps, a finished answer's place going to the next prompt;
  // `done(i, tokens)` as each ends (its error stops the rest). At batch 1,
  // exactly Answer's tokens.
  using AnswerSink = std::function<absl::Status(size_t i, const std::vector<int32_t>& tokens)>;
  absl::Status AnswerAll(const std::vector<std::vector<int32_t>>& prompts,
                         const std::vector<int64_t>& ids, int64_t batch, const AnswerSink& done);

 private:
  HfRuntime& runtime_;
  spec::DecodeOptions options_;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_DECODE_TARGET_H_
