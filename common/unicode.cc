#include "common/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace specstream::unicode {
namespace {

// Length of the well-formed UTF-8 sequence starting at text[pos], or 0 when
// the bytes there are not one. Follows Unicode Table 3-7 exactly.
size_t WellFormedLength(absl::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const size_t left = text.size() - pos;
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return 1;
  if (b0 < 0xC2) return 0;
  if (b0 < 0xE0) {
    return (left >= 2 && (byte(pos + 1) & 0xC0) == 0x80) ? 2 : 0;
  }
  if (b0 < 0xF0) {
    if (left < 3) return 0;
    const uint8_t b1 = byte(pos + 1);
    const uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80;
    const uint8_t hi = b0 == 0xED ? 0x9F : 0xBF;
    if (b1 < lo || b1 > hi) return 0;
    return (byte(pos + 2) & 0xC0) == 0x80 ? 3 : 0;
  }
  if (b0 < 0xF5) {
    if (left < 4) return 0;
    const uint8_t b1 = byte(pos + 1);
    const uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80;
    const uint8_t hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (b1 < lo || b1 > hi) return 0;
    if ((byte(pos + 2) & 0xC0) != 0x80) return 0;
    return (byte(pos + 3) & 0xC0) == 0x80 ? 4 : 0;
  }
  return 0;
}

// Length of the maximal subpart of an ill-formed sequence at text[pos]: the
// longest prefix that could start a well-formed sequence, at least 1.
size_t MaximalSubpartLength(absl::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  size_t need;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 < 0xE0) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 < 0xF0) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 < 0xF5) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t len = 1;
  for (; len < need && pos + len < text.size(); ++len) {
    const uint8_t b = byte(pos + len);
    const uint8_t l = len == 1 ? lo : 0x80;
    const uint8_t h = len == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return len;
}

const UNormalizer2* NfcInstance(absl::Status* status) {
  UErrorCode error = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&error);
  if (U_FAILURE(error)) {
    *status =
        absl::InternalError(absl::StrCat("ICU unorm2_getNFCInstance failed: ", u_errorName(error)));
    return nullptr;
  }
  return nfc;
}

void AppendUtf16(char32_t cp, std::u16string* out) {
  if (cp < 0x10000) {
    out->push_back(static_cast<char16_t>(cp));
  } else {
    out->push_back(static_cast<char16_t>(U16_LEAD(cp)));
    out->push_back(static_cast<char16_t>(U16_TRAIL(cp)));
  }
}

std::u16string ToUtf16(absl::string_view text) {
  std::u16string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) AppendUtf16(DecodeUtf8At(text, &pos), &out);
  return out;
}

void AppendUtf16AsUtf8(const std::u16string& text, std::string* out) {
  for (size_t i = 0; i < text.size();) {
    UChar32 cp;
    U16_NEXT(text.data(), i, text.size(), cp);
    AppendUtf8(static_cast<char32_t>(cp), out);
  }
}

absl::StatusOr<std::u16string> NormalizeUtf16(const UNormalizer2* nfc,
                                              const std::u16string& source) {
  std::u16string result(source.size() * 3 + 8, u'\0');
  UErrorCode error = U_ZERO_ERROR;
  int32_t length = unorm2_normalize(
      nfc, reinterpret_cast<const UChar*>(source.data()), static_cast<int32_t>(source.size()),
      reinterpret_cast<UChar*>(result.data()), static_cast<int32_t>(result.size()), &error);
  if (error == U_BUFFER_OVERFLOW_ERROR) {
    result.assign(static_cast<size_t>(length), u'\0');
    error = U_ZERO_ERROR;
    length = unorm2_normalize(
        nfc, reinterpret_cast<const UChar*>(source.data()), static_cast<int32_t>(source.size()),
        reinterpret_cast<UChar*>(result.data()), static_cast<int32_t>(result.size()), &error);
  }
  if (U_FAILURE(error)) {
    return absl::InternalError(absl::StrCat("ICU unorm2_normalize failed: ", u_errorName(error)));
  }
  result.resize(static_cast<size_t>(length));
  return result;
}

bool IsAscii(absl::string_view text) {
  for (char c : text) {
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

size_t FindInvalidUtf8(absl::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t len = WellFormedLength(text, pos);
    if (len == 0) return pos;
    pos += len;
  }
  return text.size();
}

bool IsValidUtf8(absl::string_view text) { return FindInvalidUtf8(text) == text.size(); }

char32_t DecodeUtf8At(absl::string_view text, size_t* pos) {
  const auto byte = [&](size_t i) -> char32_t {
    return i < text.size() ? static_cast<uint8_t>(text[i]) : 0x80;
  };
  const char32_t b0 = byte(*pos);
  if (b0 < 0x80) {
    *pos += 1;
    return b0;
  }
  size_t len;
  char32_t cp;
  if (b0 >= 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else if (b0 >= 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else {
    *pos += 1;
    return kReplacementChar;
  }
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (byte(*pos + i) & 0x3F);
  *pos = std::min(*pos + len, text.size());
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string ToValidUtf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t len = WellFormedLength(bytes, pos);
    if (len > 0) {
      out.append(bytes.data() + pos, len);
      pos += len;
    } else {
      AppendUtf8(kReplacementChar, &out);
      pos += MaximalSubpartLength(bytes, pos);
    }
  }
  return out;
}

bool IsLetter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return true;
    default:
      return false;
  }
}

bool IsNumber(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return true;
    default:
      return false;
  }
}

bool IsJsWhitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x00A0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

absl::StatusOr<NormalizedText> NormalizeNfcWithOffsets(absl::string_view text) {
  NormalizedText result;
  const auto identity = [&] {
    result.text.assign(text.data(), text.size());
    result.source_begin.resize(text.size());
    result.source_end.resize(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t start = pos;
      DecodeUtf8At(text, &pos);
      for (size_t i = start; i < pos; ++i) {
        result.source_begin[i] = start;
        result.source_end[i] = pos;
      }
    }
  };
  if (IsAscii(text)) {
    identity();
    return result;
  }
  absl::Status status;
  const UNormalizer2* nfc = NfcInstance(&status);
  if (nfc == nullptr) return status;

  const std::u16string whole = ToUtf16(text);
  UErrorCode error = U_ZERO_ERROR;
  const UBool normalized = unorm2_isNormalized(nfc, reinterpret_cast<const UChar*>(whole.data()),
                                               static_cast<int32_t>(whole.size()), &error);
  if (U_FAILURE(error)) {
    return absl::InternalError(
        absl::StrCat("ICU unorm2_isNormalized failed: ", u_errorName(error)));
  }
  if (normalized) {
    identity();
    return result;
  }

  // Cut at NFC boundaries: NFC(a + b) == NFC(a) + NFC(b) when b starts with a
  // character that has a boundary before it, so each chunk maps back to its
  // own span of the input.
  result.text.reserve(text.size());
  result.source_begin.reserve(text.size());
  result.source_end.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t chunk_begin = pos;
    DecodeUtf8At(text, &pos);
    while (pos < text.size()) {
      size_t next = pos;
      const char32_t cp = DecodeUtf8At(text, &next);
      if (unorm2_hasBoundaryBefore(nfc, static_cast<UChar32>(cp))) break;
      pos = next;
    }
    const absl::string_view chunk = text.substr(chunk_begin, pos - chunk_begin);
    std::string out;
    if (IsAscii(chunk)) {
      out.assign(chunk.data(), chunk.size());
    } else {
      auto normalized_chunk = NormalizeUtf16(nfc, ToUtf16(chunk));
      if (!normalized_chunk.ok()) return normalized_chunk.status();
      AppendUtf16AsUtf8(*normalized_chunk, &out);
    }
    if (out == chunk) {
      size_t p = 0;
      while (p < chunk.size()) {
        const size_t start = p;
        DecodeUtf8At(chunk, &p);
        for (size_t i = start; i < p; ++i) {
          result.source_begin.push_back(chunk_begin + start);
          result.source_end.push_back(chunk_begin + p);
        }
      }
    } else {
      result.source_begin.insert(result.source_begin.end(), out.size(), chunk_begin);
      result.source_end.insert(result.source_end.end(), out.size(), pos);
    }
    result.text += out;
  }
  return result;
}

absl::StatusOr<std::string> NormalizeNfc(absl::string_view text) {
  if (IsAscii(text)) return std::string(text);
  absl::Status status;
  const UNormalizer2* nfc = NfcInstance(&status);
  if (nfc == nullptr) return status;
  auto normalized = NormalizeUtf16(nfc, ToUtf16(text));
  if (!normalized.ok()) return normalized.status();
  std::string out;
  AppendUtf16AsUtf8(*normalized, &out);
  return out;
}

}  // namespace specstream::unicode
