#include "common/terminal_text.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/unicode.h"

namespace specstream {
namespace {

// Code points above ASCII that a terminal acts on rather than prints.
bool IsNonAsciiControl(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) ||      // C1: CSI, OSC, ... as code points
         (cp >= 0x2028 && cp <= 0x2029) ||  // line and paragraph separators
         (cp >= 0x202a && cp <= 0x202e) ||  // bidi embeddings and overrides
         (cp >= 0x2066 && cp <= 0x2069);    // bidi isolates
}

// The length of the UTF-8 sequence a lead byte announces; 0 for a byte that
// cannot start one.
size_t SequenceLength(unsigned char lead) {
  if (lead >= 0xc2 && lead <= 0xdf) return 2;
  if (lead >= 0xe0 && lead <= 0xef) return 3;
  if (lead >= 0xf0 && lead <= 0xf4) return 4;
  return 0;
}

std::string Escape(absl::string_view text, bool keep_lines) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const auto byte = static_cast<unsigned char>(text[pos]);
    if (byte < 0x80) {
      const bool kept = keep_lines && (byte == '\n' || byte == '\t');
      if ((byte < 0x20 || byte == 0x7f) && !kept) {
        absl::StrAppendFormat(&out, "\\x%02x", byte);
      } else {
        out.push_back(static_cast<char>(byte));
      }
      ++pos;
      continue;
    }
    const size_t length = SequenceLength(byte);
    const absl::string_view sequence = text.substr(pos, length);
    if (length == 0 || sequence.size() < length || !unicode::IsValidUtf8(sequence)) {
      absl::StrAppendFormat(&out, "\\x%02x", byte);  // a stray or truncated byte
      ++pos;
      continue;
    }
    size_t next = pos;
    const char32_t cp = unicode::DecodeUtf8At(text, &next);
    if (IsNonAsciiControl(cp)) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<uint32_t>(cp));
    } else {
      out.append(sequence.data(), sequence.size());
    }
    pos += length;
  }
  return out;
}

}  // namespace

std::string EscapeForTerminal(absl::string_view text) { return Escape(text, false); }

std::string EscapeForTerminalKeepLines(absl::string_view text) { return Escape(text, true); }

}  // namespace specstream
