// Text from users and remote peers (job names, ids, reasons, error messages)
// made safe to print on a terminal: nothing in it can move the cursor,
// recolour the screen, retitle the window or reorder what follows it.
//
// Escaped: the C0 controls 0x00-0x1f (ESC included) and DEL 0x7f as \xNN;
// bytes that are not part of well-formed UTF-8 (a lone 0x9b is CSI to an
// 8-bit terminal) as \xNN; the C1 controls U+0080-U+009F, the bidirectional
// embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and the
// line / paragraph separators U+2028-U+2029 as \uNNNN. Everything else,
// printable ASCII and well-formed UTF-8, passes through unchanged, and so does
// a backslash (escaping is for display, not a reversible encoding).
//
// Thread-safety: pure functions.
#ifndef SPECSTREAM_COMMON_TERMINAL_TEXT_H_
#define SPECSTREAM_COMMON_TERMINAL_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace specstream {

// For one table cell or one line: every control character escaped, tab and
// newline included.
std::string EscapeForTerminal(absl::string_view text);

// For messages that may span lines (errors): as EscapeForTerminal, but '\n'
// and '\t' are kept.
std::string EscapeForTerminalKeepLines(absl::string_view text);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TERMINAL_TEXT_H_
