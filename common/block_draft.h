// Block-parallel drafts (DFlash, DSpark; DESIGN §10): the two values a job
// spec may leave unset (model.draft.target_layer_ids, model.draft.mask_token_id)
// and that the student resolves at start, once it knows the target. The
// default target layers are a capture-layer rule (common/capture_layers.h,
// DefaultBlockTargetLayerIds).
//
// Contract:
//   * ResolveMaskTokenId picks the token id a block's masked slots hold, in
//     this order: the spec's field; the tokenizer's mask token; the first
//     embedding row past the tokenizer's vocabulary (SpecForge's "unused
//     embedding slot"). Nothing is resized: the id is always a row of the
//     target's embedding table as it is.
//
// LibTorch-free. Pure functions (ResolveMaskTokenId reads the target's
// tokenizer files); thread-safe.
#ifndef SPECSTREAM_COMMON_BLOCK_DRAFT_H_
#define SPECSTREAM_COMMON_BLOCK_DRAFT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specstream {

// SGLang's default DFlash mask token (`DEFAULT_DFLASH_MASK_TOKEN`).
inline constexpr char kSglangDflashMaskToken[] = "<|MASK|>";

// The mask token id for a block draft over the target in `target_dir`
// whose embedding table has `embedding_rows` rows (its config.json
// vocab_size). In order:
//   1. `field` (model.draft.mask_token_id) when set: it must be in
//      [0, embedding_rows). The tokenizer is not read.
//   2. The tokenizer's mask token: `mask_token` of
//      `target_dir`/tokenizer_config.json (a string, or an object with
//      "content", as transformers writes it), else a token spelled
//      kSglangDflashMaskToken in tokenizer.json. Its id must be a row of
//      the table. A mask_token that tokenizer.json lacks is an error.
//   3. tokenizer.json's vocabulary size (added tokens included: one past the
//      largest id), when embedding_rows is larger: the first row no token
//      uses (Qwen3: 151669 of 151936 rows).
// Otherwise InvalidArgument naming model.draft.mask_token_id: no mask token
// and no spare row (Llama-3: 128256 tokens, 128256 rows), so the field must
// be set. tokenizer.json is read with specstream::Tokenizer; its errors
// (missing file, a tokenizer it refuses) are returned naming the field.
// tokenizer_config.json may be absent.
absl::StatusOr<int64_t> ResolveMaskTokenId(std::optional<int64_t> field,
                                           const std::string& target_dir, int64_t embedding_rows);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_BLOCK_DRAFT_H_
