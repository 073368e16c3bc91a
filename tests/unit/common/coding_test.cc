#include "common/coding.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specstream {
namespace {

// Decodes `bytes` whole: the value, or nullopt when DecodeVarint64 refuses or
// leaves bytes over.
std::optional<uint64_t> Decode(const std::string& bytes) {
  size_t at = 0;
  uint64_t v = 12345;
  const bool ok = DecodeVarint64(
      [&](uint8_t* b) {
        if (at == bytes.size()) return false;
        *b = static_cast<uint8_t>(bytes[at++]);
        return true;
      },
      &v);
  if (!ok) {
    EXPECT_EQ(v, 12345u) << "a refused decode changed its output";
    return std::nullopt;
  }
  if (at != bytes.size()) return std::nullopt;
  return v;
}

// The encodings protobuf's documentation gives (1, 150, 300) and the edges
// of each length.
TEST(CodingTest, EncodesTheKnownBytesAndLengths) {
  struct Case {
    uint64_t v;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {0, std::string("\x00", 1)},
      {1, "\x01"},
      {127, "\x7f"},
      {128, "\x80\x01"},
      {150, "\x96\x01"},
      {300, "\xac\x02"},
      {16383, "\xff\x7f"},
      {16384, "\x80\x80\x01"},
      {UINT64_MAX, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.v);
    std::string out;
    PutVarint64(out, c.v);
    EXPECT_EQ(out, c.bytes);
    EXPECT_EQ(VarintLength(c.v), c.bytes.size());
    uint8_t buffer[kMaxVarint64Bytes];
    EXPECT_EQ(EncodeVarint64(c.v, buffer) - buffer, static_cast<ptrdiff_t>(c.bytes.size()));
    EXPECT_EQ(std::string(reinterpret_cast<char*>(buffer), c.bytes.size()), c.bytes);
    EXPECT_EQ(Decode(c.bytes), c.v);
  }
}

TEST(CodingTest, EveryLengthRoundTrips) {
  for (int bits = 0; bits <= 64; ++bits) {
    const uint64_t v = bits == 64 ? UINT64_MAX : (uint64_t{1} << bits) - 1;
    std::string out;
    PutVarint64(out, v);
    EXPECT_EQ(out.size(), bits == 0 ? 1u : static_cast<size_t>((bits + 6) / 7)) << bits;
    EXPECT_EQ(Decode(out), v) << bits;
  }
}

TEST(CodingTest, RefusesTruncatedAndOverlongInput) {
  EXPECT_EQ(Decode(""), std::nullopt);              // nothing
  EXPECT_EQ(Decode("\x80"), std::nullopt);          // a continuation, then the end
  EXPECT_EQ(Decode("\xff\xff\xff"), std::nullopt);  // truncated mid-value
  // Eleven bytes: longer than any 64-bit value.
  EXPECT_EQ(Decode("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x81\x00"), std::nullopt);
  // Ten bytes whose last carries bits past 64.
  EXPECT_EQ(Decode("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02"), std::nullopt);
  EXPECT_EQ(Decode("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f"), std::nullopt);
}

}  // namespace
}  // namespace specstream
