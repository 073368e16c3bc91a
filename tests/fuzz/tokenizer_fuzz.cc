// libFuzzer target for specstream::Tokenizer.
//
// Loads one tokenizer for the whole run: the file named by
// $SPECSTREAM_FUZZ_TOKENIZER (a tokenizer.json, e.g. a parity fixture), or a
// small embedded one (full byte alphabet, a few merges, two added tokens,
// the Llama-3 split pattern, no normalizer). Each input is encoded and the
// invariants below are checked; a violation aborts.
//   * Invalid UTF-8 is refused with InvalidArgument, valid UTF-8 is accepted.
//   * One offset per id; each offset is inside the input, begins and ends are
//     non-decreasing.
//   * Every id decodes; without a normalizer Decode(Encode(x)) == x.
//   * Decoding the input's bytes as arbitrary ids in range never fails and
//     always yields valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/tokenizer.h"
#include "common/unicode.h"
#include "nlohmann/json.hpp"

namespace {

using specstream::Tokenizer;

[[noreturn]] void Die(const char* what, absl::string_view input) {
  std::fprintf(stderr, "tokenizer_fuzz: invariant violated: %s (input of %zu bytes)\n", what,
               input.size());
  std::abort();
}

std::string ByteSymbol(int b) {
  const auto printable = [](int c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
  };
  int cp = b;
  if (!printable(b)) {
    cp = 0x100;
    for (int c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
  }
  std::string out;
  specstream::unicode::AppendUtf8(static_cast<char32_t>(cp), &out);
  return out;
}

std::string EmbeddedTokenizerJson() {
  using json = nlohmann::json;
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[ByteSymbol(b)] = id++;
  json merges = json::array();
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"t", "h"},
      {"th", "e"},
      {ByteSymbol(' '), "the"},
      {"e", "r"},
      {"i", "n"},
      {"l", "l"},
      {"\xC3\x83", "\xC2\xA9"} /* é */,
      {ByteSymbol('\n'), ByteSymbol('\n')}};
  for (const auto& [a, b] : pairs) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    merges.push_back(a + " " + b);
  }
  json added = json::array({{{"id", id}, {"content", "<|endoftext|>"}, {"special", true}},
                            {{"id", id + 1}, {"content", "<think>"}, {"special", false}}});
  json doc = {
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merges}}}};
  return doc.dump();
}

struct Loaded {
  std::unique_ptr<Tokenizer> tokenizer;
  bool round_trips = true;  // false when the loaded file has a normalizer
};

const Loaded& GetTokenizer() {
  static const Loaded* loaded = [] {
    auto* result = new Loaded;
    const char* path = std::getenv("SPECSTREAM_FUZZ_TOKENIZER");
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        (path != nullptr && *path != '\0') ? Tokenizer::FromFile(path)
                                           : Tokenizer::FromJson(EmbeddedTokenizerJson());
    if (!tokenizer.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: cannot load tokenizer: %s\n",
                   std::string(tokenizer.status().message()).c_str());
      std::abort();
    }
    result->tokenizer = std::move(*tokenizer);
    if (path != nullptr && *path != '\0') {
      // A file with a normalizer changes the text, so skip the round trip.
      // Encode's own check is cheap: NFC leaves ASCII alone, so probe with a
      // decomposed letter.
      auto ids = result->tokenizer->EncodeIds("e\xCC\x81");
      auto text = ids.ok() ? result->tokenizer->Decode(*ids) : absl::StatusOr<std::string>("");
      result->round_trips = text.ok() && *text == "e\xCC\x81";
    }
    return result;
  }();
  return *loaded;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Loaded& loaded = GetTokenizer();
  const Tokenizer& tokenizer = *loaded.tokenizer;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);

  auto encoding = tokenizer.Encode(input);
  if (!specstream::unicode::IsValidUtf8(input)) {
    if (encoding.ok() || encoding.status().code() != absl::StatusCode::kInvalidArgument) {
      Die("invalid UTF-8 was not refused with InvalidArgument", input);
    }
  } else {
    if (!encoding.ok()) Die("valid UTF-8 was refused", input);
    if (encoding->offsets.size() != encoding->ids.size())
      Die("offsets.size() != ids.size()", input);
    size_t last_begin = 0;
    size_t last_end = 0;
    for (const auto& [begin, end] : encoding->offsets) {
      if (begin > end || end > size) Die("offset outside the input", input);
      if (begin < last_begin || end < last_end) Die("offsets decrease", input);
      last_begin = begin;
      last_end = end;
    }
    auto decoded = tokenizer.Decode(encoding->ids);
    if (!decoded.ok()) Die("Decode of Encode's ids failed", input);
    if (loaded.round_trips && *decoded != input) Die("Decode(Encode(x)) != x", input);
    if (!specstream::unicode::IsValidUtf8(*decoded)) Die("Decode produced invalid UTF-8", input);
  }

  // Arbitrary ids (two bytes each) decode to valid UTF-8, with or without
  // special tokens.
  std::vector<int32_t> ids;
  const int32_t vocab = tokenizer.vocab_size();
  for (size_t i = 0; i + 1 < size && vocab > 0; i += 2) {
    const int32_t id = ((data[i] << 8) | data[i + 1]) % vocab;
    if (tokenizer.IdToToken(id).has_value()) ids.push_back(id);
  }
  for (bool skip : {false, true}) {
    auto text = tokenizer.Decode(ids, skip);
    if (!text.ok()) Die("Decode of in-range ids failed", input);
    if (!specstream::unicode::IsValidUtf8(*text)) Die("Decode produced invalid UTF-8", input);
  }
  return 0;
}
