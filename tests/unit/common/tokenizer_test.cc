// Unit tests for specstream::Tokenizer on small tokenizer.json documents
// built in the test: added tokens, BPE merge order, ignore_merges, the
// pre-tokenizer split patterns, NFC, offsets, decoding and errors.
#include "common/tokenizer.h"

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's byte -> code point table, written independently of the library.
std::string ByteLevel(const std::string& raw) {
  std::string out;
  for (unsigned char b : raw) {
    unsigned cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))) {
      unsigned n = 0;
      for (unsigned c = 0; c < b; ++c) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) ++n;
      }
      cp = 0x100 + n;
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

struct Spec {
  std::vector<std::string> words;                           // raw text
  std::vector<std::pair<std::string, std::string>> merges;  // raw text
  bool merges_as_pairs = false;
  bool ignore_merges = false;
  json pre_tokenizer;  // null: Llama-3 Split + ByteLevel(use_regex=false)
  json normalizer = nullptr;
  json added_tokens = json::array();
};

// Ids: 0..255 are the byte symbols in byte order, then `words` and the merge
// parts/results in order of first appearance.
json MakeTokenizerJson(const Spec& spec) {
  json vocab = json::object();
  int next_id = 0;
  for (int b = 0; b < 256; ++b) vocab[ByteLevel(std::string(1, static_cast<char>(b)))] = next_id++;
  const auto add_word = [&](const std::string& raw) {
    const std::string key = ByteLevel(raw);
    if (!vocab.contains(key)) vocab[key] = next_id++;
  };
  for (const auto& w : spec.words) add_word(w);
  json merges = json::array();
  for (const auto& [left, right] : spec.merges) {
    add_word(left);
    add_word(right);
    add_word(left + right);
    if (spec.merges_as_pairs) {
      merges.push_back(json::array({ByteLevel(left), ByteLevel(right)}));
    } else {
      merges.push_back(ByteLevel(left) + " " + ByteLevel(right));
    }
  }
  json pre = spec.pre_tokenizer;
  if (pre.is_null()) {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", kLlama3Pattern}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"},
              {"add_prefix_space", false},
              {"trim_offsets", true},
              {"use_regex", false}}}}};
  }
  return {{"version", "1.0"},
          {"added_tokens", spec.added_tokens},
          {"normalizer", spec.normalizer},
          {"pre_tokenizer", pre},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", spec.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

std::unique_ptr<Tokenizer> Make(const Spec& spec) {
  auto tokenizer = Tokenizer::FromJson(MakeTokenizerJson(spec).dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

json AddedToken(int id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

json SplitPreTokenizer(const std::string& pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
}

// The text of each token of Encode(text), decoded one id at a time.
std::vector<std::string> Tokens(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<std::string> out;
  auto ids = tokenizer.EncodeIds(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (!ids.ok()) return out;
  for (int32_t id : *ids) {
    auto piece = tokenizer.Decode({id});
    EXPECT_TRUE(piece.ok()) << piece.status();
    out.push_back(piece.ok() ? *piece : "?");
  }
  return out;
}

// With ignore_merges and every expected piece in the vocabulary, each
// pre-token comes out as one id, so Tokens() shows the pre-tokenizer split.
// A wrong split would produce a piece outside the vocabulary, which falls
// apart into single bytes and changes the result.
std::vector<std::string> Split(const std::string& pattern, const std::string& text,
                               const std::vector<std::string>& expected) {
  Spec spec;
  spec.words = expected;
  spec.ignore_merges = true;
  spec.pre_tokenizer = SplitPreTokenizer(pattern);
  auto tokenizer = Make(spec);
  if (tokenizer == nullptr) return {};
  return Tokens(*tokenizer, text);
}

struct SplitCase {
  const char* name;
  const char* pattern;
  std::string text;
  std::vector<std::string> pieces;
};

void PrintTo(const SplitCase& c, std::ostream* os) { *os << c.name; }

class PreTokenizerSplitTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(PreTokenizerSplitTest, SplitsLikeTheRegex) {
  const SplitCase& c = GetParam();
  EXPECT_EQ(Split(c.pattern, c.text, c.pieces), c.pieces);
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, PreTokenizerSplitTest,
    ::testing::Values(
        // \s+(?!\S) leaves the last space of a run to prefix the next word.
        SplitCase{"SpaceRun", kLlama3Pattern, "a   b", {"a", "  ", " b"}},
        SplitCase{"SingleSpace", kLlama3Pattern, "a b", {"a", " b"}},
        SplitCase{"TrailingSpaces", kLlama3Pattern, "end   ", {"end", "   "}},
        SplitCase{"TabRun", kLlama3Pattern, "a\t\tb", {"a", "\t", "\tb"}},
        // \s*[\r\n]+ ends right after the last CR/LF of the run.
        SplitCase{"NewlineRun", kLlama3Pattern, "a\n\nb", {"a", "\n\n", "b"}},
        SplitCase{"SpaceNewlineSpace", kLlama3Pattern, "a \n b", {"a", " \n", " b"}},
        SplitCase{"CrLfThenSpaces", kLlama3Pattern, "x\r\n  y", {"x", "\r\n", " ", " y"}},
        SplitCase{"MixedRun", kLlama3Pattern, "x \n\t\n  \ty", {"x", " \n\t\n", "  ", "\ty"}},
        SplitCase{"PunctuationTakesNewlines", kLlama3Pattern, "x.\n\ny", {"x", ".\n\n", "y"}},
        SplitCase{"SpacePunctuation", kLlama3Pattern, "a !!\r\nb", {"a", " !!\r\n", "b"}},
        SplitCase{"Contractions",
                  kLlama3Pattern,
                  "I'M you'Re we'LL",
                  {"I", "'M", " you", "'Re", " we", "'LL"}},
        SplitCase{"ApostropheAlone", kLlama3Pattern, "rock'n", {"rock", "'n"}},
        SplitCase{"DigitsInThrees", kLlama3Pattern, "1234567", {"123", "456", "7"}},
        SplitCase{"DigitsAfterSpace", kLlama3Pattern, "a 12", {"a", " ", "12"}},
        SplitCase{"DigitsSingle", kQwen2Pattern, "x2024", {"x", "2", "0", "2", "4"}},
        SplitCase{
            "UnicodeLetters", kLlama3Pattern, "héllo wörld Ж日本", {"héllo", " wörld", " Ж日本"}},
        SplitCase{"PrefixBeforeLetters", kLlama3Pattern, "(abc)", {"(abc", ")"}},
        SplitCase{"NoBreakSpacePrefix", kLlama3Pattern, "a\u00a0b", {"a", "\u00a0b"}},
        SplitCase{
            "IdeographicSpaceRun", kLlama3Pattern, "a\u3000\u3000b", {"a", "\u3000", "\u3000b"}},
        // U+0085 is not \s in ECMAScript, so it prefixes the word like any
        // other non-letter.
        SplitCase{"NextLineIsNotSpace", kLlama3Pattern, "a\u0085b", {"a", "\u0085b"}},
        SplitCase{"CombiningMarkBreaksLetters", kLlama3Pattern, "e\u0301x", {"e", "\u0301x"}},
        SplitCase{"EmojiZwj",
                  kLlama3Pattern,
                  "hi \U0001F468\u200D\U0001F469!",
                  {"hi", " \U0001F468\u200D\U0001F469!"}},
        SplitCase{"Gpt2",
                  R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                  "Hello world 123!!  x's I'M",
                  {"Hello", " world", " 123", "!!", " ", " x", "'s", " I", "'", "M"}}),
    [](const ::testing::TestParamInfo<SplitCase>& info) { return std::string(info.param.name); });

TEST(TokenizerTest, MergesApplyInRankOrder) {
  Spec ab_first;
  ab_first.merges = {{"a", "b"}, {"b", "c"}};
  EXPECT_THAT(Tokens(*Make(ab_first), "abc"), ElementsAre("ab", "c"));
  Spec bc_first;
  bc_first.merges = {{"b", "c"}, {"a", "b"}};
  EXPECT_THAT(Tokens(*Make(bc_first), "abc"), ElementsAre("a", "bc"));
}

TEST(TokenizerTest, EqualRanksMergeLeftmostFirst) {
  Spec spec;
  spec.merges = {{"a", "a"}};
  EXPECT_THAT(Tokens(*Make(spec), "aaa"), ElementsAre("aa", "a"));
  EXPECT_THAT(Tokens(*Make(spec), "aaaa"), ElementsAre("aa", "aa"));
}

TEST(TokenizerTest, MergesBuildWholeWordsAndAcceptPairFormat) {
  Spec spec;
  spec.merges = {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}};
  auto strings = Make(spec);
  spec.merges_as_pairs = true;
  auto pairs = Make(spec);
  for (const Tokenizer* tokenizer : {strings.get(), pairs.get()}) {
    EXPECT_THAT(Tokens(*tokenizer, "hello"), ElementsAre("hello"));
    EXPECT_THAT(Tokens(*tokenizer, "hello world"), ElementsAre("hello", " w", "o", "r", "l", "d"));
  }
  EXPECT_EQ(strings->EncodeIds("hello world").value(), pairs->EncodeIds("hello world").value());
}

TEST(TokenizerTest, LongWordMergesCompletely) {
  Spec spec;
  spec.merges = {{"a", "b"}, {"ab", "ab"}, {"abab", "abab"}};
  auto tokenizer = Make(spec);
  std::string word;
  for (int i = 0; i < 4096; ++i) word += "ab";
  auto ids = tokenizer->EncodeIds(word);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 4096u / 4);
  EXPECT_EQ(tokenizer->Decode(*ids).value(), word);
}

TEST(TokenizerTest, IgnoreMergesEmitsWholeVocabWords) {
  Spec spec;
  spec.words = {"xyz"};  // reachable by no merge
  spec.merges = {{"x", "y"}};
  spec.ignore_merges = false;
  EXPECT_THAT(Tokens(*Make(spec), "xyz"), ElementsAre("xy", "z"));
  spec.ignore_merges = true;
  EXPECT_THAT(Tokens(*Make(spec), "xyz"), ElementsAre("xyz"));
}

TEST(TokenizerTest, AddedTokensAreMatchedFirstAndNeverSplit) {
  Spec spec;
  spec.merges = {{"a", "b"}};
  spec.added_tokens =
      json::array({AddedToken(300, "<|im_start|>", true), AddedToken(301, "<|im", false),
                   AddedToken(302, "ab\nc", false)});
  auto tokenizer = Make(spec);
  auto encoding = tokenizer->Encode("x<|im_start|>ab\ncab");
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  EXPECT_THAT(encoding->ids,
              ElementsAre(static_cast<int32_t>('x'), 300, 302, tokenizer->TokenToId("ab").value()));
  // Leftmost-longest: "<|im" only where the longer token does not match.
  EXPECT_THAT(tokenizer->EncodeIds("<|im_end|>").value().front(), 301);
  EXPECT_TRUE(tokenizer->IsSpecial(300));
  EXPECT_FALSE(tokenizer->IsSpecial(301));
  EXPECT_FALSE(tokenizer->IsSpecial('a'));
  EXPECT_EQ(tokenizer->TokenToId("<|im_start|>"), 300);
  EXPECT_EQ(tokenizer->IdToToken(300), "<|im_start|>");
  EXPECT_EQ(tokenizer->IdToToken(static_cast<int32_t>('a')), "a");
  EXPECT_EQ(tokenizer->IdToToken(-1), std::nullopt);
  EXPECT_EQ(tokenizer->IdToToken(299), std::nullopt);
  EXPECT_EQ(tokenizer->TokenToId("not a token"), std::nullopt);
  EXPECT_EQ(tokenizer->vocab_size(), 303);
}

TEST(TokenizerTest, AddedTokenStripFlagsSwallowWhitespace) {
  Spec spec;
  json token = AddedToken(300, "<mask>", true);
  token["lstrip"] = true;
  token["rstrip"] = true;
  spec.added_tokens = json::array({token});
  auto tokenizer = Make(spec);
  auto encoding = tokenizer->Encode("a  <mask>\t b");
  ASSERT_TRUE(encoding.ok());
  EXPECT_THAT(encoding->ids, ElementsAre('a', 300, 'b'));
  EXPECT_EQ(encoding->offsets[1], std::make_pair(size_t{1}, size_t{11}));
}

TEST(TokenizerTest, SingleWordAddedTokenNeedsWordBoundaries) {
  Spec spec;
  json token = AddedToken(300, "cat", false);
  token["single_word"] = true;
  spec.added_tokens = json::array({token});
  auto tokenizer = Make(spec);
  EXPECT_THAT(tokenizer->EncodeIds("a cat!").value(), ElementsAre('a', ' ', 300, '!'));
  EXPECT_THAT(tokenizer->EncodeIds("cats").value(), ElementsAre('c', 'a', 't', 's'));
}

TEST(TokenizerTest, OffsetsPointIntoTheOriginalText) {
  Spec spec;
  spec.merges = {{"h", "i"}, {" ", "hi"}};
  spec.added_tokens = json::array({AddedToken(300, "<s>", true)});
  auto tokenizer = Make(spec);
  const std::string text = "hi<s> hi \xF0\x9F\x98\x80";  // ends with U+1F600
  auto encoding = tokenizer->Encode(text);
  ASSERT_TRUE(encoding.ok());
  using Range = std::pair<size_t, size_t>;
  // The emoji's four byte tokens all carry the character's whole span.
  EXPECT_THAT(encoding->offsets,
              ElementsAre(Range{0, 2}, Range{2, 5}, Range{5, 8}, Range{8, 9}, Range{9, 13},
                          Range{9, 13}, Range{9, 13}, Range{9, 13}));
  EXPECT_EQ(encoding->ids.size(), encoding->offsets.size());
}

TEST(TokenizerTest, NfcNormalizerComposesAndMapsOffsetsBack) {
  Spec spec;
  spec.normalizer = {{"type", "NFC"}};
  spec.merges = {{"\xC3", "\xA9"}, {"c", "a"}, {"f", "\xC3\xA9"}, {"ca", "f\xC3\xA9"}};
  auto tokenizer = Make(spec);
  const std::string decomposed =
      "x caf"
      "e\xCC\x81";  // e + U+0301
  auto encoding = tokenizer->Encode(decomposed);
  ASSERT_TRUE(encoding.ok());
  EXPECT_EQ(encoding->ids, tokenizer->EncodeIds("x caf\xC3\xA9").value());
  EXPECT_EQ(tokenizer->Decode(encoding->ids).value(), "x caf\xC3\xA9");
  ASSERT_FALSE(encoding->offsets.empty());
  EXPECT_EQ(encoding->offsets.back().second, decomposed.size());
  // "café" is one token; it spans "caf" + "e\u0301" in the original text.
  EXPECT_EQ(encoding->offsets.back().first, 2u);

  Spec sequence = spec;
  sequence.normalizer = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  EXPECT_EQ(Make(sequence)->EncodeIds(decomposed).value(), encoding->ids);

  Spec none = spec;
  none.normalizer = nullptr;
  EXPECT_NE(Make(none)->EncodeIds(decomposed).value(), encoding->ids);
}

TEST(TokenizerTest, DecodeRoundTripsAndHandlesSpecialAndBrokenBytes) {
  Spec spec;
  spec.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\xC3", "\xA9"}};
  spec.added_tokens =
      json::array({AddedToken(400, "<|eot|>", true), AddedToken(401, "<x y>", false)});
  auto tokenizer = Make(spec);
  for (const std::string text :
       {"hello world", "  two\r\n\tlines  \n", "h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC",
        "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 <|eot|> <x y>!", ""}) {
    auto ids = tokenizer->EncodeIds(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(tokenizer->Decode(*ids).value(), text);
  }
  const std::vector<int32_t> ids = tokenizer->EncodeIds("a<|eot|>b<x y>").value();
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special_tokens=*/true).value(), "ab<x y>");
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special_tokens=*/false).value(), "a<|eot|>b<x y>");
  // A lone lead byte and a stray continuation byte each become U+FFFD.
  const std::vector<int32_t> broken = {'a', 0xE6, 'b', 0x97};
  EXPECT_EQ(tokenizer->Decode(broken).value(),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  // A truncated 3-byte sequence is one maximal subpart: one U+FFFD.
  EXPECT_EQ(tokenizer->Decode({0xE6, 0x97}).value(), "\xEF\xBF\xBD");
}

TEST(TokenizerTest, RejectsInvalidUtf8AndUnknownIds) {
  auto tokenizer = Make(Spec{});
  for (const std::string& bad : {std::string("ab\xFF"), std::string("\xC3"),
                                 std::string("\xED\xA0\x80"), std::string("\xC0\xAF")}) {
    auto encoding = tokenizer->Encode(bad);
    EXPECT_EQ(encoding.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(encoding.status().message(), HasSubstr("UTF-8"));
  }
  for (int32_t id : {-1, 256, 100000}) {
    auto decoded = tokenizer->Decode({'a', id});
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(decoded.status().message(), HasSubstr(std::to_string(id)));
  }
}

struct BadJsonCase {
  const char* name;
  std::function<void(json&)> edit;
  const char* field;  // expected in the error message
};

void PrintTo(const BadJsonCase& c, std::ostream* os) { *os << c.name; }

class TokenizerJsonErrorTest : public ::testing::TestWithParam<BadJsonCase> {};

TEST_P(TokenizerJsonErrorTest, NamesTheField) {
  Spec spec;
  spec.merges = {{"a", "b"}};
  json doc = MakeTokenizerJson(spec);
  GetParam().edit(doc);
  auto tokenizer = Tokenizer::FromJson(doc.dump());
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(GetParam().field));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, TokenizerJsonErrorTest,
    ::testing::Values(
        BadJsonCase{"NoModel", [](json& j) { j.erase("model"); }, "model"},
        BadJsonCase{"WordPiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type"},
        BadJsonCase{"VocabNotObject", [](json& j) { j["model"]["vocab"] = json::array(); },
                    "model.vocab"},
        BadJsonCase{"VocabIdNotNumber", [](json& j) { j["model"]["vocab"]["a"] = "x"; },
                    "model.vocab"},
        BadJsonCase{"MissingByteSymbol", [](json& j) { j["model"]["vocab"].erase("a"); },
                    "model.vocab"},
        BadJsonCase{"MergeWithoutSpace", [](json& j) { j["model"]["merges"][0] = "ab"; },
                    "model.merges[0]"},
        BadJsonCase{"MergeNotInVocab", [](json& j) { j["model"]["merges"][0] = "q z"; },
                    "model.merges[0]"},
        BadJsonCase{"Dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
        BadJsonCase{"NfkcNormalizer",
                    [](json& j) {
                      j["normalizer"] = {{"type", "NFKC"}};
                    },
                    "normalizer.type"},
        BadJsonCase{"NormalizerInSequence",
                    [](json& j) {
                      j["normalizer"] = {
                          {"type", "Sequence"},
                          {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
                    },
                    "normalizer.normalizers[1].type"},
        BadJsonCase{"UnknownPattern",
                    [](json& j) {
                      j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\s+|\w+)";
                    },
                    "pre_tokenizer.pretokenizers[0].pattern.Regex"},
        BadJsonCase{"SplitBehavior",
                    [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
                    "pre_tokenizer.pretokenizers[0].behavior"},
        BadJsonCase{"NoPreTokenizer", [](json& j) { j["pre_tokenizer"] = nullptr; },
                    "pre_tokenizer"},
        BadJsonCase{"Metaspace",
                    [](json& j) {
                      j["pre_tokenizer"] = {{"type", "Metaspace"}};
                    },
                    "pre_tokenizer.type"},
        BadJsonCase{
            "PrefixSpace",
            [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
            "add_prefix_space"},
        BadJsonCase{"Decoder",
                    [](json& j) {
                      j["decoder"] = {{"type", "WordPiece"}};
                    },
                    "decoder.type"},
        BadJsonCase{"AddedTokenWithoutId",
                    [](json& j) {
                      j["added_tokens"] = {{{"content", "<x>"}}};
                    },
                    "added_tokens[0].id"},
        BadJsonCase{"AddedTokenFlagType",
                    [](json& j) {
                      j["added_tokens"] = {{{"id", 500}, {"content", "<x>"}, {"special", "yes"}}};
                    },
                    "added_tokens[0].special"}),
    [](const ::testing::TestParamInfo<BadJsonCase>& info) { return std::string(info.param.name); });

TEST(TokenizerTest, RejectsMalformedJson) {
  auto tokenizer = Tokenizer::FromJson("{\"model\": ");
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("JSON"));
}

TEST(TokenizerTest, LoadsFromFileAndDirectory) {
  specstream::testing::TempDir dir;
  Spec spec;
  spec.merges = {{"o", "k"}};
  specstream::testing::WriteFile(dir.Join("tokenizer.json"), MakeTokenizerJson(spec).dump());
  auto from_dir = Tokenizer::FromDirectory(dir.path());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  EXPECT_THAT(Tokens(**from_dir, "ok"), ElementsAre("ok"));
  auto from_file = Tokenizer::FromFile(dir.Join("tokenizer.json"));
  ASSERT_TRUE(from_file.ok()) << from_file.status();

  auto missing = Tokenizer::FromFile(dir.Join("nope.json"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  specstream::testing::WriteFile(dir.Join("bad.json"), R"({"model": {"type": "Unigram"}})");
  auto bad = Tokenizer::FromFile(dir.Join("bad.json"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.json"));
  EXPECT_THAT(bad.status().message(), HasSubstr("model.type"));
}

TEST(TokenizerTest, PlainByteLevelUsesTheGpt2Pattern) {
  Spec spec;
  spec.words = {"Hello", " world", "'s", " 42", "!!"};
  spec.ignore_merges = true;
  spec.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_THAT(Tokens(*Make(spec), "Hello world's 42!!"),
              ElementsAre("Hello", " world", "'s", " 42", "!!"));
}

// SmolLM2's vocabulary lacks some byte symbols. HF tokenizers (0.23, no
// unk_token) drops such a byte, and its neighbours then merge: "axb x" with
// no "x" and the merge a+b gives [ab, " "].
TEST(TokenizerTest, AByteWithoutASymbolIsDroppedAndItsNeighboursMerge) {
  Spec spec;
  spec.merges = {{"a", "b"}};
  spec.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json j = MakeTokenizerJson(spec);
  j["model"]["vocab"].erase(ByteLevel("x"));
  auto tokenizer = Tokenizer::FromJson(j.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const int32_t ab = j["model"]["vocab"][ByteLevel("ab")].get<int32_t>();
  EXPECT_EQ((*tokenizer)->EncodeIds("axb x").value(), (std::vector<int32_t>{ab, ' '}));
  EXPECT_EQ((*tokenizer)->EncodeIds("x").value(), std::vector<int32_t>{});
}

// SmolLM2's pre-tokenizer: Digits (individual) before the GPT-2 split.
TEST(TokenizerTest, DigitsStageSplitsNumbersFirst) {
  Spec spec;
  spec.merges = {{" ", "1"}, {"1", "2"}};
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  spec.pre_tokenizer = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  EXPECT_THAT(Tokens(*Make(spec), "a 12"), ElementsAre("a", " ", "1", "2"));
  spec.pre_tokenizer["pretokenizers"][0]["individual_digits"] = false;
  EXPECT_THAT(Tokens(*Make(spec), "a 12"), ElementsAre("a", " ", "12"));
  spec.pre_tokenizer = byte_level;
  EXPECT_THAT(Tokens(*Make(spec), "a 12"), ElementsAre("a", " 1", "2"));
}

}  // namespace
}  // namespace specstream
