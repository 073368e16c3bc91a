// `specstream-teacher dump`: run the target over a dataset and write the
// offline store (shared/DESIGN.md §7) that students train from with no
// teacher running.
//
// Records are read in file order; record i (0-based, blank lines skipped) is
// sample i. Consecutive records are batched up to `batch_tokens` padded
// tokens. Re-running with the same inputs resumes: samples already in
// finished shards are skipped, a partial shard is rewritten, and the store
// ends byte-identical to an uninterrupted run (with --regenerate too: an
// answer is a function of its prompt, seed and options).
#ifndef SPECSTREAM_TEACHER_DUMP_H_
#define SPECSTREAM_TEACHER_DUMP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/offline_store.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {

class TargetAnswers;

struct DumpOptions {
  std::string data;             // JSON lines: conversations or pre-tokenized
  std::string tokenizer_dir;    // needed for conversation records
  std::string template_name;    // needed for conversation records
  std::string out;              // store directory
  int64_t batch_tokens = 8192;  // padded tokens per forward
  int64_t max_length = 0;       // truncate; 0: the model's max positions
  bool keep_target_ids = false;
  std::string store_dtype = "bfloat16";  // aux/last hidden: bfloat16 | float32 | float16
  StoreWriterOptions store;
  int progress_terminal = -1;  // see ProgressOptions::terminal
  // Regeneration (--regenerate) when set: each record is a prompt
  // (PromptFromRecord: {"prompt": text} or {"input_ids": prompt ids}), the
  // target writes its answer (TargetAnswers, seeded by the record's "id",
  // else by its index), and the sample is the prompt (not trained) then the
  // answer (trained), cut at max_length. Greedy, it is what `specstream-eval
  // generate` writes for the same prompt, token for token.
  TargetAnswers* answers = nullptr;
};

struct DumpSummary {
  int64_t samples_written = 0;
  int64_t samples_skipped = 0;  // already in the store (resume)
  int64_t tokens_written = 0;
  double seconds = 0;
};

absl::StatusOr<DumpSummary> RunDump(TargetRuntime& runtime, const DumpOptions& options);

// The store contract for a runtime: {"model": {"model_type", "runtime",
// "hidden_size", "vocab_size", "num_layers", "capture_layer_ids"}, "tensors":
// ...}. "runtime" names the runtime that computed the features ("hf" or
// "sglang"); since a resumed dump must present the same contract, a store is
// never part one runtime, part the other. Stores dumped before the field
// existed lack it, and readers must not require it.
nlohmann::json DumpContract(const ModelDescription& model, bool keep_target_ids, DType store_dtype);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_DUMP_H_
