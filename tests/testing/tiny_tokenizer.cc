#include "tests/testing/tiny_tokenizer.h"

#include "nlohmann/json.hpp"

namespace specstream::testing {
namespace {

std::string Utf8(unsigned cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

}  // namespace

std::string ByteSymbol(unsigned char b) {
  // Printable Latin-1 bytes stand for themselves; the rest map to 256+n in
  // byte order (GPT-2's bytes_to_unicode).
  auto printable = [](unsigned c) {
    return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  if (printable(b)) return Utf8(b);
  unsigned n = 0;
  for (unsigned c = 0; c < b; ++c) {
    if (!printable(c)) ++n;
  }
  return Utf8(256 + n);
}

std::string TinyTokenizerJson(const std::vector<std::string>& special_tokens,
                              const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteSymbol(static_cast<unsigned char>(b))] = b;
  nlohmann::json merge_list = nlohmann::json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    merge_list.push_back(a + " " + b);
    vocab[a + b] = next++;
  }
  nlohmann::json added = nlohmann::json::array();
  for (const std::string& token : special_tokens) {
    added.push_back({{"id", next},
                     {"content", token},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    vocab[token] = next++;
  }
  nlohmann::json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", false},
        {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
  return doc.dump(2);
}

std::vector<std::string> ChatSpecialTokens() {
  return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
          "<|im_start|>",      "<|im_end|>",          "<|endoftext|>",     "<think>",
          "</think>"};
}

}  // namespace specstream::testing
