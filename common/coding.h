// Protobuf-style base-128 varints, the one encoder and decoder in the tree:
// the hand-framed payload chunks (common/transport/framing.h) and the
// TensorBoard event writer use them. Little-endian groups of 7 bits, the
// high bit set on every byte but the last; at most 10 bytes for 64 bits.
// Thread-safe (no state).
#ifndef SPECSTREAM_COMMON_CODING_H_
#define SPECSTREAM_COMMON_CODING_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace specstream {

inline constexpr size_t kMaxVarint64Bytes = 10;

// Bytes EncodeVarint64 writes for `v` (1 to 10).
size_t VarintLength(uint64_t v);

// Writes `v` at `out` (room for VarintLength(v) bytes); returns the byte
// after it.
uint8_t* EncodeVarint64(uint64_t v, uint8_t* out);

// Appends `v` to `out`.
void PutVarint64(std::string& out, uint64_t v);

// Reads one varint through `next_byte` (bool(uint8_t*): false at the end of
// the input). Accepts exactly the encodings every protobuf parser agrees on:
// at most 10 bytes whose value fits 64 bits. False otherwise (truncated or
// overlong); *v is then unchanged.
template <typename NextByte>
bool DecodeVarint64(NextByte&& next_byte, uint64_t* v) {
  uint64_t result = 0;
  for (size_t i = 0; i < kMaxVarint64Bytes; ++i) {
    uint8_t b = 0;
    if (!next_byte(&b)) return false;
    if (i == kMaxVarint64Bytes - 1 && b > 1) return false;
    result |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
    if ((b & 0x80) == 0) {
      *v = result;
      return true;
    }
  }
  return false;
}

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_CODING_H_
