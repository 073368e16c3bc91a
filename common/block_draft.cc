#include "common/block_draft.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/file.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "nlohmann/json.hpp"

namespace specstream {
namespace {

constexpr char kMaskField[] = "model.draft.mask_token_id";

absl::Status MaskError(absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(kMaskField, ": ", reason));
}

// `mask_token` of tokenizer_config.json: nullopt when the file or the key is
// absent or null. transformers writes a string, or (AddedToken) an object
// whose "content" is the token.
absl::StatusOr<std::optional<std::string>> ConfiguredMaskToken(const std::string& target_dir) {
  const std::string path = target_dir + "/tokenizer_config.json";
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (absl::IsNotFound(text.status())) return std::optional<std::string>();
  if (!text.ok()) return Annotate(text.status(), kMaskField);
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return MaskError(absl::StrCat(path, " is not a JSON object"));
  }
  const auto it = config.find("mask_token");
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return MaskError(absl::StrCat(
      path, ": mask_token is neither a string nor an object with a \"content\" string"));
}

}  // namespace

absl::StatusOr<int64_t> ResolveMaskTokenId(std::optional<int64_t> field,
                                           const std::string& target_dir, int64_t embedding_rows) {
  if (embedding_rows < 1) {
    return MaskError(absl::StrCat("the target's embedding table has ", embedding_rows, " rows"));
  }
  if (field.has_value()) {
    if (*field < 0 || *field >= embedding_rows) {
      return MaskError(absl::StrCat(*field, " is not a row of the target's embedding table [0, ",
                                    embedding_rows, ")"));
    }
    return *field;
  }

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(target_dir);
  if (!tokenizer.ok()) {
    return Annotate(tokenizer.status(),
                    absl::StrCat(kMaskField,
                                 ": unset, and the target's tokenizer (which says "
                                 "where a mask token or a spare row is) cannot be "
                                 "read; set the field"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> configured, ConfiguredMaskToken(target_dir));
  std::optional<int32_t> mask_id;
  std::string source;
  if (configured.has_value()) {
    mask_id = (*tokenizer)->TokenToId(*configured);
    if (!mask_id.has_value()) {
      return MaskError(absl::StrCat("tokenizer_config.json's mask_token \"", *configured,
                                    "\" is not a token of tokenizer.json; set the field"));
    }
    source = absl::StrCat("tokenizer_config.json's mask_token \"", *configured, "\"");
  } else if ((mask_id = (*tokenizer)->TokenToId(kSglangDflashMaskToken)).has_value()) {
    source = absl::StrCat("the token \"", kSglangDflashMaskToken, "\"");
  }
  if (mask_id.has_value()) {
    if (*mask_id >= embedding_rows) {
      return MaskError(absl::StrCat(source, " has id ", *mask_id,
                                    ", not a row of the target's embedding table [0, ",
                                    embedding_rows, "); set the field"));
    }
    return int64_t{*mask_id};
  }

  const int64_t vocab = (*tokenizer)->vocab_size();
  if (embedding_rows > vocab) return vocab;
  return MaskError(absl::StrCat(
      "unset, and the target has no mask token (no mask_token in "
      "tokenizer_config.json, no \"",
      kSglangDflashMaskToken, "\" token) and no spare embedding row (", vocab, " tokens, ",
      embedding_rows, " rows); set it to a token id the draft may use as the mask"));
}

}  // namespace specstream
