// Speculative decoding in process (docs/evaluation.md): a draft proposes
// tokens, the target checks all of them in one forward, and acceptance is
// lossless: at temperature 0 a drafted token is kept iff it is the target's
// argmax; at temperature T > 0 it is kept with probability min(1, p/q) and a
// rejection resamples from max(0, p - q) normalised (Leviathan et al.,
// Chen et al.), so every committed token is distributed as the target's own
// sample. p and q are softmax(logits / T) of the target and of the draft.
//
// The two sides are interfaces so that teacher/ (the target) and student/
// (the drafts) stay apart; services/eval wires them.
#ifndef SPECSTREAM_COMMON_TORCH_SPECULATIVE_H_
#define SPECSTREAM_COMMON_TORCH_SPECULATIVE_H_

#include <cstdint>
#include <random>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"

namespace specstream::spec {

// The target of one sequence at a time, incrementally: Extend runs the n
// `ids` after the positions kept so far and returns the full-vocab
// next-token logits of the last `logit_rows` of them (float32
// [logit_rows, V], on the host; 1 <= logit_rows <= n) and the captures of
// all n for the draft (aux_hidden [n, ·]). A prompt's prefill needs one row
// of logits, a verification all of them: the vocab-wide projection of the
// rest is waste (SmolLM2: 57 MFLOP a row against 214 for its layers).
// Truncate keeps the first `length` positions (the rest were rejected);
// Reset starts a new sequence.
class Target {
 public:
  struct Rows {
    torch::Tensor logits;
    torch::Tensor aux_hidden;
  };
  virtual ~Target() = default;
  virtual absl::StatusOr<Rows> Extend(const std::vector<int32_t>& ids, int64_t logit_rows) = 0;
  virtual void Truncate(int64_t length) = 0;
  virtual void Reset() = 0;
};

// Picks tokens from logits: the argmax at temperature 0, else a sample of
// softmax(logits / T) from its generator. Keeps the distribution of each
// pick (the draft's q) until Clear.
class TokenChooser {
 public:
  TokenChooser(double temperature, std::mt19937_64* rng) : temperature_(temperature), rng_(rng) {}
  // logits: float [V] over the target's vocabulary (-inf where the draft
  // cannot propose). Returns the token.
  int32_t Choose(const torch::Tensor& logits);
  // float64 [V] distributions of the picks so far (empty at temperature 0).
  const std::vector<torch::Tensor>& distributions() const { return distributions_; }
  void Clear() { distributions_.clear(); }
  double temperature() const { return temperature_; }

 private:
  double temperature_;
  std::mt19937_64* rng_;
  std::vector<torch::Tensor> distributions_;
};

// softmax(logits / T) in float64 on the host (T > 0).
torch::Tensor Distribution(const torch::Tensor& logits, double temperature);
// A token drawn from float64 probabilities [V] (need not be normalised).
int32_t SampleFrom(const torch::Tensor& probs, std::mt19937_64& rng);

// The draft. Propose reads the committed sequence `ids` (its last token not
// yet run by the target) and the target's captures of rows 0..n-2 (aux
// [n-1, ·]), and appends at most `max_tokens` proposed tokens, each picked
// by `chooser` from the draft's logits at that slot.
class Draft {
 public:
  virtual ~Draft() = default;
  virtual int64_t max_proposal() const = 0;
  virtual absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                               int64_t max_tokens, TokenChooser& chooser,
                               std::vector<int32_t>* tokens) = 0;
};

// InvalidArgument, naming `who`, unless Draft::Propose's inputs fit its
// contract: at least two ids and captures [ids - 1, features].
absl::Status CheckProposalInputs(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                                 const char* who);

struct DecodeOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // decoding ends after committing one of these
};

// Counts over one or more decodes (Add sums them).
struct DecodeStats {
  int64_t sequences = 0;
  int64_t new_tokens = 0;    // committed, up to and including a stop token
  int64_t forwards = 0;      // target forwards, the prefill of each prompt included
  int64_t rounds = 0;        // verifying forwards (a proposal of >= 1 token)
  int64_t round_tokens = 0;  // tokens those forwards committed, bonus included
  int64_t draft_tokens = 0;  // tokens proposed
  // reached[k]: rounds whose first k+1 proposed tokens were all accepted;
  // proposed[k]: rounds that proposed a (k+1)-th token.
  std::vector<int64_t> reached, proposed;
  double seconds = 0;        // the whole decode
  double draft_seconds = 0;  // of which proposing
  // The target's forwards (Extend, logits included) by kind: the prompts'
  // prefills; one-row steps (target-only decoding, or a round with no
  // proposal); verifications of a proposal (verify_rows: their rows, the
  // proposals plus the token before them).
  double prefill_seconds = 0, step_seconds = 0, verify_seconds = 0;
  int64_t steps = 0, verify_rows = 0;

  void Add(const DecodeStats& other);
  // Mean tokens committed per verifying forward (bonus included).
  double tau() const { return rounds > 0 ? static_cast<double>(round_tokens) / rounds : 0; }
  // Target-only decoding takes one forward per new token.
  int64_t forwards_saved() const { return new_tokens - forwards; }
};

struct DecodeResult {
  std::vector<int32_t> tokens;  // the new tokens
  DecodeStats stats;
  // τ of each round in order (for the spread of the mean).
  std::vector<int32_t> round_lengths;
};

// Decodes after `prompt` (non-empty): target-only when `draft` is null
// (one forward per token), else a proposal of up to max_proposal tokens per
// round verified in one forward. At temperature 0 both give the same tokens.
absl::StatusOr<DecodeResult> Decode(Target& target, Draft* draft,
                                    const std::vector<int32_t>& prompt,
                                    const DecodeOptions& options);

}  // namespace specstream::spec

#endif  // SPECSTREAM_COMMON_TORCH_SPECULATIVE_H_
