// `specstream-eval`'s commands as a library (the binary is their flags;
// docs/evaluation.md):
//   Generate   the target's own answers to prompts (greedy or sampled), as
//              pre-tokenized JSON lines the teacher's dump reads
//   Speculate  speculative decoding of prompts with trained drafts against
//              target-only decoding: τ, acceptance per position, forwards
//              saved, the verifying forward's cost, the wall-clock ratio,
//              the T = 0 losslessness check and the teacher-forced estimates
//
// Prompts are JSON lines {"id": N, "prompt": "..."}; prompt N is held out
// for evaluation iff N % 10 == 9 (split train | holdout | all). Both print
// their summary to stdout. They live in services/ because they wire the
// teacher's target runtime to the student's drafts.
#ifndef SPECSTREAM_SERVICES_EVAL_EVAL_COMMANDS_H_
#define SPECSTREAM_SERVICES_EVAL_EVAL_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specstream::services {

struct GenerateOptions {
  std::string target, prompts, out, split = "train", chat_template = "chatml", dtype = "float32";
  int64_t max_new = 128, limit = 0;
  // Answers decoded together in batched steps (1: one at a time, bit for
  // bit spec::Decode's; more is faster and may round differently).
  int64_t batch = 1;
  double temperature = 0;
  uint64_t seed = 0;
};

// Writes one JSON line per prompt of the split to `out`: id, temperature,
// prompt, answer, input_ids (prompt and answer) and loss_mask (the answer).
absl::Status Generate(const GenerateOptions& options);

struct SpeculateOptions {
  std::string target, prompts, split = "holdout", chat_template = "chatml", dtype = "float32";
  std::string temperatures = "0,1", json;
  std::vector<std::string> drafts, untrained_drafts;
  int64_t max_new = 64, limit = 0, chain = 7;
  uint64_t seed = 0;
};

// Decodes every prompt of the split with each draft (and target-only, the
// baseline) at each temperature; prints a summary per draft and
// temperature and, with `json`, writes one JSON line each.
absl::Status Speculate(const SpeculateOptions& options);

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_EVAL_EVAL_COMMANDS_H_
