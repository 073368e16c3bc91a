// Unicode helpers for the tokenizer: strict UTF-8 decoding, lossy UTF-8
// repair, the character classes the pre-tokenizer regexes use, and NFC
// normalization that remembers where each output byte came from.
//
// Character classes follow the JavaScript RegExp `u` flag (the parity
// reference is a transformers.js derivative): \p{L} and \p{N} are the Unicode
// general categories L* and N* (from ICU's u_charType, so the ICU version
// linked decides newly assigned characters), and \s is the ECMAScript
// WhiteSpace + LineTerminator set, which differs from Unicode White_Space
// (Rust regex \s, used by HF tokenizers) in leaving out U+0085 (NEL) and
// including U+FEFF.
//
// Thread-safety: every function is pure and may be called concurrently.
#ifndef SPECSTREAM_COMMON_UNICODE_H_
#define SPECSTREAM_COMMON_UNICODE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specstream::unicode {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, nothing
// above U+10FFFF, no truncated sequences).
bool IsValidUtf8(absl::string_view text);

// Byte offset of the first ill-formed sequence, or text.size() when valid.
size_t FindInvalidUtf8(absl::string_view text);

// Decodes the code point starting at text[pos] of VALID UTF-8 text and
// advances `pos` past it. Behaviour on invalid input is unspecified (but
// memory-safe: pos always advances by 1..4 and stays <= size).
char32_t DecodeUtf8At(absl::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `cp` (which must be a scalar value).
void AppendUtf8(char32_t cp, std::string* out);

// Replaces every maximal ill-formed subsequence with U+FFFD ("substitution of
// maximal subparts", as WHATWG TextDecoder and Rust's from_utf8_lossy do).
std::string ToValidUtf8Lossy(absl::string_view bytes);

// \p{L}: general category Lu, Ll, Lt, Lm or Lo.
bool IsLetter(char32_t cp);
// \p{N}: general category Nd, Nl or No.
bool IsNumber(char32_t cp);
// ECMAScript \s: [\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f
// \u205f\u3000\ufeff].
bool IsJsWhitespace(char32_t cp);

// NFC of `text` (valid UTF-8) plus, for every byte of the result, the
// [begin, end) byte span of `text` it came from. The text is cut at NFC
// boundaries (ICU unorm2_hasBoundaryBefore) into chunks that normalize
// independently; a chunk that normalization leaves unchanged maps byte for
// byte, a changed chunk maps every output byte to the whole input chunk.
struct NormalizedText {
  std::string text;
  std::vector<size_t> source_begin;  // size() == text.size()
  std::vector<size_t> source_end;    // size() == text.size()
};
absl::StatusOr<NormalizedText> NormalizeNfcWithOffsets(absl::string_view text);

// NFC of `text` (valid UTF-8).
absl::StatusOr<std::string> NormalizeNfc(absl::string_view text);

}  // namespace specstream::unicode

#endif  // SPECSTREAM_COMMON_UNICODE_H_
