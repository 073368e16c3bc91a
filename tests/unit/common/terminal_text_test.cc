#include "common/terminal_text.h"

#include <string>

#include "gtest/gtest.h"

namespace specstream {
namespace {

TEST(TerminalTextTest, PrintableAsciiAndUtf8PassThrough) {
  EXPECT_EQ(EscapeForTerminal("tiny-eagle_3.1 (lr 1e-4) \\ 100%"),
            "tiny-eagle_3.1 (lr 1e-4) \\ 100%");
  EXPECT_EQ(EscapeForTerminal("模型-蒸馏 café ✓"), "模型-蒸馏 café ✓");
  EXPECT_EQ(EscapeForTerminal(""), "");
}

TEST(TerminalTextTest, C0ControlsAndDeleteAreEscaped) {
  // A name that would clear the screen, turn the text red and retitle the
  // window.
  EXPECT_EQ(EscapeForTerminal("a\x1b[2J\x1b[31mred\x1b]0;owned\x07"),
            "a\\x1b[2J\\x1b[31mred\\x1b]0;owned\\x07");
  EXPECT_EQ(EscapeForTerminal(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(EscapeForTerminal("\r\n\t\b\x7f"), "\\x0d\\x0a\\x09\\x08\\x7f");
}

TEST(TerminalTextTest, KeepLinesKeepsOnlyNewlineAndTab) {
  EXPECT_EQ(EscapeForTerminalKeepLines("line 1\n\tline 2\r\x1b[K"), "line 1\n\tline 2\\x0d\\x1b[K");
}

TEST(TerminalTextTest, C1ControlsAndStrayBytesAreEscaped) {
  // U+009B (CSI) encoded as UTF-8, and a raw 0x9b byte (CSI to an 8-bit
  // terminal; not UTF-8).
  EXPECT_EQ(EscapeForTerminal("a\xc2\x9b"
                              "31mb"),
            "a\\u009b31mb");
  EXPECT_EQ(EscapeForTerminal("a\x9b"
                              "31mb"),
            "a\\x9b31mb");
  // Truncated, overlong and surrogate sequences byte by byte.
  EXPECT_EQ(EscapeForTerminal("\xe6\xa8"), "\\xe6\\xa8");
  EXPECT_EQ(EscapeForTerminal("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(EscapeForTerminal("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(EscapeForTerminal("\xff"), "\\xff");
}

TEST(TerminalTextTest, BidiOverridesAndSeparatorsAreEscaped) {
  EXPECT_EQ(EscapeForTerminal("job\xe2\x80\xae"
                              "gpj.exe"),
            "job\\u202egpj.exe");
  EXPECT_EQ(EscapeForTerminal("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");
  EXPECT_EQ(EscapeForTerminal("a\xe2\x80\xa8"
                              "b"),
            "a\\u2028b");
}

}  // namespace
}  // namespace specstream
