// Byte-level BPE from a Hugging Face tokenizer.json.
//
// Parity target: HF `tokenizers` as reproduced by transformers.js
// (@lenml/tokenizers), which is what tests/testing/tokenizer_reference.mjs
// runs. Where the two could differ we follow transformers.js and say so:
//   * \s in the split patterns is the ECMAScript set (no U+0085 NEL, but
//     U+FEFF), not Unicode White_Space as in Rust's regex.
//   * `(?i:'s|...)` is ASCII-case-insensitive only, as transformers.js
//     rewrites it (Rust's regex would also fold e.g. U+017F to 's').
//   * Added tokens with normalized=true are matched in the raw text like all
//     others (transformers.js ignores the flag; Llama-3/Qwen never set it).
//
// Offsets: each id gets the [begin, end) byte span of the original text.
// Tokens that split one character's bytes (byte-level BPE does this for rare
// characters and emoji) all get that character's whole span, as HF does; all
// tokens produced from one NFC chunk that normalization changed get the
// whole chunk. Begins and ends are non-decreasing. ByteLevel trim_offsets is
// a post-processing option and is not applied.
#include "common/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unicode.h"
#include "nlohmann/json.hpp"

namespace specstream {
namespace {

using json = nlohmann::json;

// The split patterns we reproduce, recognised by their exact source text.
enum class SplitPattern {
  kLlama3,
  kQwen2,
  kGpt2,
  kDigits,     // the Digits pre-tokenizer, individual_digits: each \p{N} alone
  kDigitRuns,  // the Digits pre-tokenizer: runs of \p{N}
};

constexpr absl::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// GPT-2's reversible byte -> code point table: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order.
std::array<char32_t, 256> BytesToUnicode() {
  std::array<char32_t, 256> table{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

bool IsCrLf(char32_t c) { return c == '\r' || c == '\n'; }

// Returns the end of the match at cps[p] of `pattern`, or p when no
// alternative matches there. Each branch reproduces the backtracking regex's
// first-alternative-that-matches semantics; see the comments per branch.
size_t MatchAt(SplitPattern pattern, const std::vector<char32_t>& cps, size_t p) {
  using unicode::IsJsWhitespace;
  using unicode::IsLetter;
  using unicode::IsNumber;
  const size_t n = cps.size();
  const auto is_other = [](char32_t c) {  // [^\s\p{L}\p{N}]
    return !IsJsWhitespace(c) && !IsLetter(c) && !IsNumber(c);
  };
  const auto run = [&](size_t q, auto pred) {
    while (q < n && pred(cps[q])) ++q;
    return q;
  };
  if (pattern == SplitPattern::kDigits) return IsNumber(cps[p]) ? p + 1 : p;
  if (pattern == SplitPattern::kDigitRuns) return run(p, IsNumber);
  const char32_t c0 = cps[p];
  const char32_t c1 = p + 1 < n ? cps[p + 1] : 0;
  const char32_t c2 = p + 2 < n ? cps[p + 2] : 0;
  const bool gpt2 = pattern == SplitPattern::kGpt2;

  // Contractions. Llama-3/Qwen2: `(?i:...)`, which transformers.js rewrites
  // to ASCII [sS]-style classes; GPT-2: case-sensitive.
  if (c0 == '\'' && p + 1 < n) {
    const auto fold = [gpt2](char32_t c) -> char32_t {
      return (!gpt2 && c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
    };
    const char32_t a = fold(c1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if (p + 2 < n) {
      const char32_t b = fold(c2);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return p + 3;
      }
    }
  }

  if (gpt2) {
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the optional space is
    // kept only when the class follows it.
    if (c0 == ' ' && p + 1 < n && IsLetter(c1)) return run(p + 1, IsLetter);
    if (IsLetter(c0)) return run(p, IsLetter);
    if (c0 == ' ' && p + 1 < n && IsNumber(c1)) return run(p + 1, IsNumber);
    if (IsNumber(c0)) return run(p, IsNumber);
    if (c0 == ' ' && p + 1 < n && is_other(c1)) return run(p + 1, is_other);
    if (is_other(c0)) return run(p, is_other);
  } else {
    // `[^\r\n\p{L}\p{N}]?\p{L}+`: one leading non-letter/digit/newline char
    // is taken only when a letter follows it.
    if (!IsCrLf(c0) && !IsLetter(c0) && !IsNumber(c0) && p + 1 < n && IsLetter(c1)) {
      return run(p + 1, IsLetter);
    }
    if (IsLetter(c0)) return run(p, IsLetter);
    // `\p{N}{1,3}` (Llama-3) or `\p{N}` (Qwen2).
    if (IsNumber(c0)) {
      const size_t limit = pattern == SplitPattern::kLlama3 ? 3 : 1;
      size_t q = p + 1;
      while (q < n && q - p < limit && IsNumber(cps[q])) ++q;
      return q;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`.
    if (c0 == ' ' && p + 1 < n && is_other(c1)) return run(run(p + 1, is_other), IsCrLf);
    if (is_other(c0)) return run(run(p, is_other), IsCrLf);
  }

  const size_t ws_end = run(p, IsJsWhitespace);
  if (ws_end == p) return p;
  if (!gpt2) {
    // `\s*[\r\n]+`: \s* gives back characters until a CR/LF follows, so the
    // match ends right after the last CR/LF of the whitespace run.
    for (size_t q = ws_end; q > p; --q) {
      if (IsCrLf(cps[q - 1])) return q;
    }
  }
  // `\s+(?!\S)`: the whole run at the end of the text, otherwise the run
  // minus its last character (which then precedes the non-space).
  if (ws_end == n) return ws_end;
  if (ws_end - p >= 2) return ws_end - 1;
  // `\s+`.
  return ws_end;
}

// Splits text[begin, end) (valid UTF-8) into pieces, keeping both matches and
// the text between them (behavior "Isolated"), appending byte ranges.
void SplitRange(SplitPattern pattern, absl::string_view text, size_t begin, size_t end,
                std::vector<std::pair<size_t, size_t>>* out) {
  std::vector<char32_t> cps;
  std::vector<size_t> pos;  // byte offset of cps[i]; pos[n] == end
  size_t at = begin;
  const absl::string_view view = text.substr(0, end);
  while (at < end) {
    pos.push_back(at);
    cps.push_back(unicode::DecodeUtf8At(view, &at));
  }
  pos.push_back(end);
  size_t gap_begin = 0;
  size_t p = 0;
  while (p < cps.size()) {
    const size_t q = MatchAt(pattern, cps, p);
    if (q == p) {
      ++p;
      continue;
    }
    if (gap_begin < p) out->emplace_back(pos[gap_begin], pos[p]);
    out->emplace_back(pos[p], pos[q]);
    p = q;
    gap_begin = q;
  }
  if (gap_begin < cps.size()) out->emplace_back(pos[gap_begin], pos[cps.size()]);
}

struct MergeInfo {
  int32_t rank;
  int32_t result;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

absl::Status FieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", field, ": ", why));
}

// Reads an optional boolean field (absent or null -> `fallback`).
absl::StatusOr<bool> OptionalBool(const json& object, const char* key, bool fallback,
                                  absl::string_view field) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return FieldError(absl::StrCat(field, ".", key), "must be a boolean");
  return it->get<bool>();
}

absl::StatusOr<std::string> RequiredString(const json& object, const char* key,
                                           absl::string_view field) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return FieldError(absl::StrCat(field, ".", key), "missing or not a string");
  }
  return it->get<std::string>();
}

}  // namespace

struct Tokenizer::Impl {
  // Model vocabulary, keyed by byte-level strings.
  absl::flat_hash_map<std::string, int32_t> vocab;
  absl::flat_hash_map<uint64_t, MergeInfo> merges;
  bool ignore_merges = false;
  bool nfc = false;
  // Applied in order; each stage re-splits the pieces of the previous one.
  std::vector<SplitPattern> splits;

  std::vector<AddedToken> added;
  // Added-token indices by first byte, longest content first.
  std::array<std::vector<size_t>, 256> added_by_first_byte;
  absl::flat_hash_map<std::string, int32_t> added_by_content;

  // Indexed by id; `token` is the vocab string or added content.
  struct IdEntry {
    std::string token;
    int32_t added_index = -1;  // into `added`, or -1 for model tokens
    bool present = false;
  };
  std::vector<IdEntry> ids;

  std::array<int32_t, 256> byte_id{};
  std::array<std::string, 256> byte_symbol;  // UTF-8 of the mapped code point
  absl::flat_hash_map<char32_t, uint8_t> symbol_byte;

  absl::Status ParseModel(const json& model);
  absl::Status ParseAddedTokens(const json& root);
  absl::Status ParseNormalizer(const json& root);
  absl::Status ParsePreTokenizer(const json& root);
  absl::Status ParseDecoder(const json& root);

  // Byte-level BPE of normalized bytes [begin, end); appends ids and their
  // [begin, end) byte ranges in the normalized text.
  void Bpe(absl::string_view text, size_t begin, size_t end, std::vector<int32_t>* out_ids,
           std::vector<std::pair<size_t, size_t>>* out_ranges) const;
  // Encodes one stretch of text that holds no added token.
  absl::Status EncodeSection(absl::string_view text, size_t begin, size_t end, Encoding* out) const;
};

absl::Status Tokenizer::Impl::ParseModel(const json& model) {
  if (!model.is_object()) return FieldError("model", "missing or not an object");
  if (auto it = model.find("type"); it != model.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "BPE") {
      return FieldError("model.type",
                        absl::StrCat("unsupported model ", it->dump(), " (only BPE)"));
    }
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return FieldError("model.dropout", "BPE dropout is not supported");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>().empty())) {
      return FieldError(absl::StrCat("model.", key), "must be null or empty");
    }
  }
  ASSIGN_OR_RETURN(const bool byte_fallback, OptionalBool(model, "byte_fallback", false, "model"));
  if (byte_fallback) return FieldError("model.byte_fallback", "must be false for byte-level BPE");
  ASSIGN_OR_RETURN(ignore_merges, OptionalBool(model, "ignore_merges", false, "model"));

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    return FieldError("model.vocab", "missing or not an object");
  }
  vocab.reserve(vocab_it->size());
  for (auto& [token, value] : vocab_it->items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > (int64_t{1} << 30)) {
      return FieldError("model.vocab",
                        absl::StrCat("id of \"", token, "\" is not a valid id: ", value.dump()));
    }
    const int32_t id = value.get<int32_t>();
    if (static_cast<size_t>(id) >= ids.size()) ids.resize(static_cast<size_t>(id) + 1);
    if (ids[id].present) {
      return FieldError("model.vocab", absl::StrCat("id ", id, " is used by both \"", ids[id].token,
                                                    "\" and \"", token, "\""));
    }
    ids[id].token = token;
    ids[id].present = true;
    vocab.emplace(token, id);
  }

  const std::array<char32_t, 256> table = BytesToUnicode();
  int byte_symbols = 0;
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    unicode::AppendUtf8(table[b], &symbol);
    // A byte without its symbol (SmolLM2 has no control bytes) is dropped
    // from the text, as HF tokenizers' BPE drops an unknown character when
    // the model has no unk_token.
    auto it = vocab.find(symbol);
    byte_id[b] = it == vocab.end() ? -1 : it->second;
    if (byte_id[b] >= 0) ++byte_symbols;
    byte_symbol[b] = std::move(symbol);
    symbol_byte[table[b]] = static_cast<uint8_t>(b);
  }

  if (byte_symbols == 0) {
    return FieldError("model.vocab", "holds no byte-level symbol; not a byte-level BPE vocabulary");
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) {
    return FieldError("model.merges", "missing or not an array");
  }
  merges.reserve(merges_it->size());
  int32_t rank = 0;
  for (const json& merge : *merges_it) {
    const std::string field = absl::StrCat("model.merges[", rank, "]");
    std::string left;
    std::string right;
    if (merge.is_string()) {
      // "a b": byte-level symbols never contain a space, so exactly one.
      const auto& s = merge.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return FieldError(field, absl::StrCat(merge.dump(), " is not \"left right\""));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return FieldError(field, "must be a \"left right\" string or a [left, right] pair");
    }
    auto l = vocab.find(left);
    auto r = vocab.find(right);
    auto m = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || m == vocab.end()) {
      return FieldError(field, absl::StrCat("\"", left, "\" + \"", right,
                                            "\" has a part or result outside model.vocab"));
    }
    // A repeated pair keeps its last rank, as both HF and transformers.js do.
    merges[PairKey(l->second, r->second)] = MergeInfo{rank, m->second};
    ++rank;
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseAddedTokens(const json& root) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return FieldError("added_tokens", "not an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& entry = (*it)[i];
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    if (!entry.is_object()) return FieldError(field, "not an object");
    AddedToken token;
    ASSIGN_OR_RETURN(token.content, RequiredString(entry, "content", field));
    if (token.content.empty()) return FieldError(field + ".content", "is empty");
    if (!unicode::IsValidUtf8(token.content)) {
      return FieldError(field + ".content", "is not valid UTF-8");
    }
    auto id_it = entry.find("id");
    if (id_it == entry.end() || !id_it->is_number_integer() || id_it->get<int64_t>() < 0 ||
        id_it->get<int64_t>() > (int64_t{1} << 30)) {
      return FieldError(field + ".id", "missing or not a valid id");
    }
    token.id = id_it->get<int32_t>();
    ASSIGN_OR_RETURN(token.special, OptionalBool(entry, "special", false, field));
    ASSIGN_OR_RETURN(token.lstrip, OptionalBool(entry, "lstrip", false, field));
    ASSIGN_OR_RETURN(token.rstrip, OptionalBool(entry, "rstrip", false, field));
    ASSIGN_OR_RETURN(token.single_word, OptionalBool(entry, "single_word", false, field));
    ASSIGN_OR_RETURN(bool normalized, OptionalBool(entry, "normalized", false, field));
    (void)normalized;  // Matched in raw text either way; see the file comment.
    if (added_by_content.contains(token.content)) {
      return FieldError(field + ".content",
                        absl::StrCat("\"", token.content, "\" is listed twice"));
    }
    const size_t index = added.size();
    if (static_cast<size_t>(token.id) >= ids.size()) ids.resize(static_cast<size_t>(token.id) + 1);
    IdEntry& slot = ids[token.id];
    if (slot.added_index >= 0) {
      return FieldError(field + ".id", absl::StrCat("id ", token.id, " is used by both \"",
                                                    slot.token, "\" and \"", token.content, "\""));
    }
    // An added token overrides a model token with the same id, as in HF.
    slot.token = token.content;
    slot.added_index = static_cast<int32_t>(index);
    slot.present = true;
    added_by_content.emplace(token.content, token.id);
    added_by_first_byte[static_cast<uint8_t>(token.content[0])].push_back(index);
    added.push_back(std::move(token));
  }
  for (auto& bucket : added_by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
      return added[a].content.size() > added[b].content.size();
    });
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseNormalizer(const json& root) {
  auto it = root.find("normalizer");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  const auto parse_one = [&](const json& n, const std::string& field) -> absl::Status {
    if (!n.is_object()) return FieldError(field, "not an object");
    ASSIGN_OR_RETURN(std::string type, RequiredString(n, "type", field));
    if (type == "NFC") {
      nfc = true;
      return absl::OkStatus();
    }
    return FieldError(field + ".type", absl::StrCat("unsupported normalizer \"", type,
                                                    "\" (supported: null, NFC, Sequence of NFC)"));
  };
  if (it->is_object() && it->value("type", "") == "Sequence") {
    auto list = it->find("normalizers");
    if (list == it->end() || !list->is_array()) {
      return FieldError("normalizer.normalizers", "missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(parse_one((*list)[i], absl::StrCat("normalizer.normalizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  return parse_one(*it, "normalizer");
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const json& root) {
  auto it = root.find("pre_tokenizer");
  if (it == root.end() || it->is_null()) {
    return FieldError("pre_tokenizer", "missing; a ByteLevel pre-tokenizer is required");
  }
  std::vector<std::pair<const json*, std::string>> stages;
  if (it->is_object() && it->value("type", "") == "Sequence") {
    auto list = it->find("pretokenizers");
    if (list == it->end() || !list->is_array()) {
      return FieldError("pre_tokenizer.pretokenizers", "missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      stages.emplace_back(&(*list)[i], absl::StrCat("pre_tokenizer.pretokenizers[", i, "]"));
    }
  } else {
    stages.emplace_back(&*it, "pre_tokenizer");
  }
  bool byte_level_seen = false;
  for (const auto& [stage, field] : stages) {
    if (!stage->is_object()) return FieldError(field, "not an object");
    ASSIGN_OR_RETURN(std::string type, RequiredString(*stage, "type", field));
    if (byte_level_seen) {
      return FieldError(field, "nothing may follow the ByteLevel pre-tokenizer");
    }
    if (type == "Split") {
      auto pattern = stage->find("pattern");
      if (pattern == stage->end() || !pattern->is_object() || !pattern->contains("Regex") ||
          !(*pattern)["Regex"].is_string()) {
        return FieldError(field + ".pattern", "must be {\"Regex\": ...}");
      }
      const std::string regex = (*pattern)["Regex"].get<std::string>();
      if (regex == kLlama3Pattern) {
        splits.push_back(SplitPattern::kLlama3);
      } else if (regex == kQwen2Pattern) {
        splits.push_back(SplitPattern::kQwen2);
      } else if (regex == kGpt2Pattern) {
        splits.push_back(SplitPattern::kGpt2);
      } else {
        return FieldError(field + ".pattern.Regex",
                          absl::StrCat("unsupported split pattern \"", regex,
                                       "\" (supported: the Llama-3, Qwen2 and GPT-2 patterns)"));
      }
      const std::string behavior = stage->value("behavior", "");
      if (behavior != "Isolated") {
        return FieldError(field + ".behavior",
                          absl::StrCat("unsupported \"", behavior, "\" (only Isolated)"));
      }
      ASSIGN_OR_RETURN(bool invert, OptionalBool(*stage, "invert", false, field));
      if (invert) return FieldError(field + ".invert", "must be false");
    } else if (type == "Digits") {
      ASSIGN_OR_RETURN(bool individual, OptionalBool(*stage, "individual_digits", false, field));
      splits.push_back(individual ? SplitPattern::kDigits : SplitPattern::kDigitRuns);
    } else if (type == "ByteLevel") {
      byte_level_seen = true;
      ASSIGN_OR_RETURN(bool prefix, OptionalBool(*stage, "add_prefix_space", false, field));
      if (prefix) return FieldError(field + ".add_prefix_space", "must be false");
      ASSIGN_OR_RETURN(bool use_regex, OptionalBool(*stage, "use_regex", true, field));
      if (use_regex) splits.push_back(SplitPattern::kGpt2);
    } else {
      return FieldError(field + ".type", absl::StrCat("unsupported pre-tokenizer \"", type,
                                                      "\" (supported: Split, Digits, ByteLevel)"));
    }
  }
  if (!byte_level_seen) {
    return FieldError("pre_tokenizer", "a ByteLevel pre-tokenizer is required");
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseDecoder(const json& root) {
  auto it = root.find("decoder");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object() || it->value("type", "") != "ByteLevel") {
    return FieldError("decoder.type", absl::StrCat("unsupported decoder ",
                                                   it->is_object() ? it->value("type", "?") : "?",
                                                   " (only ByteLevel)"));
  }
  return absl::OkStatus();
}

void Tokenizer::Impl::Bpe(absl::string_view text, size_t begin, size_t end,
                          std::vector<int32_t>* out_ids,
                          std::vector<std::pair<size_t, size_t>>* out_ranges) const {
  const size_t n = end - begin;
  if (n == 0) return;
  const auto byte_at = [&](size_t i) { return static_cast<uint8_t>(text[begin + i]); };
  if (n == 1) {
    if (byte_id[byte_at(0)] < 0) return;
    out_ids->push_back(byte_id[byte_at(0)]);
    out_ranges->emplace_back(begin, end);
    return;
  }
  if (ignore_merges) {
    std::string word;
    word.reserve(n * 2);
    for (size_t i = 0; i < n; ++i) word += byte_symbol[byte_at(i)];
    if (auto it = vocab.find(word); it != vocab.end()) {
      out_ids->push_back(it->second);
      out_ranges->emplace_back(begin, end);
      return;
    }
  }
  // Symbols in a doubly linked list; a min-heap of candidate merges ordered
  // by (rank, position of the left symbol), which is exactly "lowest rank
  // first, leftmost on ties". Stale entries are skipped when popped.
  // Bytes without a symbol are left out; their neighbours then meet.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;    // 0: merged into its left neighbour
    uint32_t start;  // the bytes [start, end) of the piece it covers
    uint32_t end;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (byte_id[byte_at(i)] < 0) continue;
    const int32_t at = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{byte_id[byte_at(i)], at - 1, -1, 1, static_cast<uint32_t>(i),
                             static_cast<uint32_t>(i + 1)});
    if (at > 0) symbols[at - 1].next = at;
  }
  if (symbols.empty()) return;
  using Candidate = std::tuple<int32_t, int32_t, int32_t, int32_t>;  // rank, pos, l, r
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges.end()) heap.emplace(it->second.rank, pos, symbols[pos].id, symbols[next].id);
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const auto [rank, pos, left, right] = heap.top();
    heap.pop();
    Symbol& sym = symbols[pos];
    if (sym.len == 0 || sym.id != left || sym.next < 0) continue;
    Symbol& nxt = symbols[sym.next];
    if (nxt.id != right) continue;
    sym.id = merges.find(PairKey(left, right))->second.result;
    sym.len += nxt.len;
    sym.end = nxt.end;
    nxt.len = 0;
    sym.next = nxt.next;
    if (sym.next >= 0) symbols[sym.next].prev = pos;
    consider(sym.prev);
    consider(pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    out_ids->push_back(symbols[i].id);
    out_ranges->emplace_back(begin + symbols[i].start, begin + symbols[i].end);
  }
}

absl::Status Tokenizer::Impl::EncodeSection(absl::string_view text, size_t begin, size_t end,
                                            Encoding* out) const {
  unicode::NormalizedText normalized;
  absl::string_view work = text.substr(begin, end - begin);
  if (nfc) {
    ASSIGN_OR_RETURN(normalized, unicode::NormalizeNfcWithOffsets(work));
    work = normalized.text;
  }
  // Pre-tokenize: each stage re-splits every piece of the previous stage.
  std::vector<std::pair<size_t, size_t>> pieces = {{0, work.size()}};
  for (SplitPattern pattern : splits) {
    std::vector<std::pair<size_t, size_t>> next;
    for (const auto& [b, e] : pieces) SplitRange(pattern, work, b, e, &next);
    pieces = std::move(next);
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [b, e] : pieces) Bpe(work, b, e, &out->ids, &ranges);
  // Map normalized byte ranges back to whole characters of the input.
  const auto is_continuation = [&](size_t i) {
    return (static_cast<uint8_t>(work[i]) & 0xC0) == 0x80;
  };
  for (const auto& [b, e] : ranges) {
    if (nfc) {
      out->offsets.emplace_back(begin + normalized.source_begin[b],
                                begin + normalized.source_end[e - 1]);
    } else {
      size_t first = b;
      while (first > 0 && is_continuation(first)) --first;
      size_t last = e;
      while (last < work.size() && is_continuation(last)) ++last;
      out->offsets.emplace_back(begin + first, begin + last);
    }
  }
  return absl::OkStatus();
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(absl::string_view text) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("tokenizer.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json: not a JSON object");
  auto impl = std::make_unique<Impl>();
  try {
    auto model = root.find("model");
    if (model == root.end()) return FieldError("model", "missing");
    RETURN_IF_ERROR(impl->ParseModel(*model));
    RETURN_IF_ERROR(impl->ParseAddedTokens(root));
    RETURN_IF_ERROR(impl->ParseNormalizer(root));
    RETURN_IF_ERROR(impl->ParsePreTokenizer(root));
    RETURN_IF_ERROR(impl->ParseDecoder(root));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  auto tokenizer = FromJson(buffer.str());
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), path);
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  return FromFile(dir + "/tokenizer.json");
}

absl::StatusOr<Encoding> Tokenizer::Encode(absl::string_view text) const {
  const size_t bad = unicode::FindInvalidUtf8(text);
  if (bad != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Encode: text is not valid UTF-8 (at byte ", bad, ")"));
  }
  const Impl& impl = *impl_;
  Encoding out;
  size_t section_begin = 0;  // start of text not yet encoded
  size_t i = 0;
  const auto is_word_char = [](char32_t c) {
    return c == '_' || unicode::IsLetter(c) || unicode::IsNumber(c);
  };
  while (i < text.size()) {
    const std::vector<size_t>& candidates = impl.added_by_first_byte[static_cast<uint8_t>(text[i])];
    const AddedToken* match = nullptr;
    for (size_t index : candidates) {
      const AddedToken& token = impl.added[index];
      if (text.size() - i < token.content.size() ||
          std::memcmp(text.data() + i, token.content.data(), token.content.size()) != 0) {
        continue;
      }
      if (token.single_word) {
        // Not glued to a word character on either side (HF's rule).
        size_t before = i;
        while (before > 0 && (static_cast<uint8_t>(text[before - 1]) & 0xC0) == 0x80) --before;
        if (before > 0) {
          --before;
          while (before > 0 && (static_cast<uint8_t>(text[before]) & 0xC0) == 0x80) --before;
          if (is_word_char(unicode::DecodeUtf8At(text, &before))) continue;
        }
        size_t after = i + token.content.size();
        if (after < text.size() && is_word_char(unicode::DecodeUtf8At(text, &after))) continue;
      }
      match = &token;
      break;
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    size_t match_begin = i;
    size_t match_end = i + match->content.size();
    // lstrip/rstrip: the token swallows neighbouring whitespace (ASCII-range
    // and Unicode spaces alike, the ECMAScript trim set).
    const auto whitespace_before = [&](size_t pos) -> size_t {
      size_t start = pos;
      while (start > section_begin && (static_cast<uint8_t>(text[start - 1]) & 0xC0) == 0x80) {
        --start;
      }
      if (start == section_begin) return pos;
      --start;
      size_t probe = start;
      return unicode::IsJsWhitespace(unicode::DecodeUtf8At(text, &probe)) ? start : pos;
    };
    if (match->lstrip) {
      for (size_t prev = whitespace_before(match_begin); prev != match_begin;
           prev = whitespace_before(match_begin)) {
        match_begin = prev;
      }
    }
    if (match->rstrip) {
      while (match_end < text.size()) {
        size_t probe = match_end;
        if (!unicode::IsJsWhitespace(unicode::DecodeUtf8At(text, &probe))) break;
        match_end = probe;
      }
    }
    if (section_begin < match_begin) {
      RETURN_IF_ERROR(impl.EncodeSection(text, section_begin, match_begin, &out));
    }
    out.ids.push_back(match->id);
    out.offsets.emplace_back(match_begin, match_end);
    i = match_end;
    section_begin = match_end;
  }
  if (section_begin < text.size()) {
    RETURN_IF_ERROR(impl.EncodeSection(text, section_begin, text.size(), &out));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeIds(absl::string_view text) const {
  ASSIGN_OR_RETURN(Encoding encoding, Encode(text));
  return std::move(encoding.ids);
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::string out;
  std::string bytes;  // byte-level tokens not yet turned into text
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl.ids.size() || !impl.ids[id].present) {
      return absl::InvalidArgumentError(
          absl::StrCat("Decode: id ", id, " is not in the vocabulary (size ", vocab_size(), ")"));
    }
    const Impl::IdEntry& entry = impl.ids[id];
    if (entry.added_index >= 0) {
      if (skip_special_tokens && impl.added[entry.added_index].special) continue;
      out += unicode::ToValidUtf8Lossy(bytes);
      bytes.clear();
      out += entry.token;  // added tokens are written verbatim
      continue;
    }
    // A token with a character outside the byte-level alphabet contributes
    // its own UTF-8 bytes, as HF's ByteLevel decoder does.
    const size_t mark = bytes.size();
    bool byte_level = true;
    for (size_t pos = 0; pos < entry.token.size();) {
      auto it = impl.symbol_byte.find(unicode::DecodeUtf8At(entry.token, &pos));
      if (it == impl.symbol_byte.end()) {
        byte_level = false;
        break;
      }
      bytes.push_back(static_cast<char>(it->second));
    }
    if (!byte_level) {
      bytes.resize(mark);
      bytes += entry.token;
    }
  }
  out += unicode::ToValidUtf8Lossy(bytes);
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) {
    return it->second;
  }
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->ids.size() || !impl_->ids[id].present) {
    return std::nullopt;
  }
  return impl_->ids[id].token;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->ids.size()) return false;
  const int32_t index = impl_->ids[id].added_index;
  return index >= 0 && impl_->added[index].special;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->ids.size()); }

}  // namespace specstream
