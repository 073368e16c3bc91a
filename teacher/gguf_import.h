// Converts a GGUF file (llama.cpp) of a Llama-architecture model into a
// Hugging Face checkpoint directory the teacher loads:
//   config.json             from the llama.* metadata
//   model.safetensors       every tensor dequantised exactly to fp32
//                           (common/gguf.h), under its HF name, with
//                           llama.cpp's Q/K row permutation undone
//   tokenizer.json          rebuilt from tokenizer.ggml.* (byte-level BPE:
//                           tokenizer.ggml.model "gpt2")
//   tokenizer_config.json   the chat template, bos/eos and special tokens
//
// Refused, naming the metadata key or tensor: another architecture, a
// SentencePiece ("llama") tokenizer, RoPE scaling, a tensor type that is not
// F32, F16, BF16, Q8_0, Q4_0 or Q4_1, a missing or mis-shaped tensor, and
// a tensor the mapping does not know. The output directory is written
// file by file, each atomically.
#ifndef SPECSTREAM_TEACHER_GGUF_IMPORT_H_
#define SPECSTREAM_TEACHER_GGUF_IMPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/hf_config.h"
#include "nlohmann/json.hpp"

namespace specstream::teacher {

struct GgufImportOptions {
  std::string gguf;  // input file
  std::string out;   // output directory (created)
};

absl::Status ImportGguf(const GgufImportOptions& options);

// The parts, for tests.
// config.json's fields from GGUF metadata; `tied`: no output.weight.
absl::StatusOr<HfModelConfig> GgufLlamaConfig(const nlohmann::json& metadata, bool tied);
// The HF tensor name of a GGUF tensor ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); NotFound when unknown.
absl::StatusOr<std::string> GgufToHfName(const std::string& gguf_name);
// Undoes llama.cpp's Q/K permutation of a [heads·head_dim, cols] matrix in
// place: its rows per head go (i, 2) -> (2, i), the inverse of
// convert_hf_to_gguf's reshape(heads, 2, d/2, cols).swapaxes(1, 2).
void UnpermuteQk(std::vector<float>* rows, int64_t heads, int64_t head_dim, int64_t cols);
// tokenizer.json and tokenizer_config.json from tokenizer.ggml.* and
// tokenizer.chat_template.
absl::StatusOr<nlohmann::json> GgufTokenizerJson(const nlohmann::json& metadata);
absl::StatusOr<nlohmann::json> GgufTokenizerConfig(const nlohmann::json& metadata);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_GGUF_IMPORT_H_
