// Hugging Face `tokenizer.json` byte-level BPE, as used by Llama-3 and
// Qwen2/Qwen3 (and GPT-2 style tokenizers).
//
// Pipeline for Encode(text), matching HF `tokenizers` with
// add_special_tokens=false:
//   1. Added tokens (special or not) are matched in the raw text first,
//      leftmost-longest; they become their own ids and are never split.
//   2. Each remaining stretch is normalized (NFC when the tokenizer says so),
//   3. split by the pre-tokenizer regex (the GPT-4/Llama-3, Qwen2 and GPT-2
//      patterns, implemented as a hand-written matcher over Unicode
//      categories; a Digits stage, as SmolLM2 has, splits numbers first),
//   4. mapped byte -> unicode (GPT-2 byte-level alphabet), and
//   5. merged by BPE rank (`ignore_merges` honoured).
// Decode maps ids back to bytes and returns the UTF-8 text.
//
// Thread-safety: a Tokenizer is immutable after creation; all const methods
// may be called concurrently.
#ifndef SPECSTREAM_COMMON_TOKENIZER_H_
#define SPECSTREAM_COMMON_TOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace specstream {

// Result of Encode: ids plus, for each id, the [begin, end) byte range of the
// input text it came from (used to build assistant-only loss masks).
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<std::pair<size_t, size_t>> offsets;
};

class Tokenizer final {
 public:
  // Parses a tokenizer.json document. Refuses, naming the field, anything
  // this implementation does not reproduce exactly (a non-BPE model, an
  // unknown pre-tokenizer pattern or normalizer).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view json);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // `dir`/tokenizer.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // No special tokens are added; special tokens written in the text are
  // matched. InvalidArgument when `text` is not valid UTF-8.
  absl::StatusOr<Encoding> Encode(absl::string_view text) const;
  absl::StatusOr<std::vector<int32_t>> EncodeIds(absl::string_view text) const;

  // InvalidArgument on an id outside the vocabulary. Bytes that do not form
  // valid UTF-8 are replaced with U+FFFD, as HF does.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;

  // One past the largest id, added tokens included.
  int32_t vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TOKENIZER_H_
