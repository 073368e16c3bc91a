// `specstream data ...`: offline data preparation, LibTorch-free.
//
// Each command reads a JSON-lines file and writes JSON lines (or a
// safetensors map). Outputs are all-or-nothing: with --out the file appears
// only when every line succeeded; without it, nothing reaches stdout unless
// every line succeeded. The first malformed line stops the command with
// "FILE:LINE: reason" (InvalidArgument -> exit code 2).
#ifndef SPECSTREAM_SERVICES_CLI_DATA_COMMANDS_H_
#define SPECSTREAM_SERVICES_CLI_DATA_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specstream::services {

struct TokenizeOptions {
  std::string tokenizer_dir;  // holds tokenizer.json
  std::string input;          // {"text": "..."} per line
  std::string output;         // empty: stdout
};
// One {"ids":[...]} line per input line; no special tokens are added.
absl::Status RunTokenize(const TokenizeOptions& options, std::ostream& stdout_stream);

struct RenderOptions {
  std::string tokenizer_dir;
  std::string template_name;
  std::string input;   // conversation or pre-tokenized records
  std::string output;  // empty: stdout
  int64_t max_length = 0;
};
// One {"input_ids":[...],"loss_mask":[...]} line per record.
absl::Status RunRender(const RenderOptions& options, std::ostream& stdout_stream);

struct VocabMapOptions {
  std::string input;  // lines with "input_ids" (+ "loss_mask") or "ids"
  int64_t draft_vocab = 0;
  int64_t target_vocab = 0;  // 0: from --model's config.json, else max id + 1
  std::string model_dir;     // optional: target checkpoint for vocab_size
  std::string output;        // map.safetensors
};
struct VocabMapSummary {
  int64_t records = 0;
  int64_t counted_tokens = 0;
  int64_t target_vocab = 0;
  int64_t draft_vocab = 0;
  double coverage = 0.0;
};
absl::StatusOr<VocabMapSummary> RunVocabMap(const VocabMapOptions& options);

}  // namespace specstream::services

#endif  // SPECSTREAM_SERVICES_CLI_DATA_COMMANDS_H_
