#include "common/coding.h"

namespace specstream {

size_t VarintLength(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* EncodeVarint64(uint64_t v, uint8_t* out) {
  while (v >= 0x80) {
    *out++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *out++ = static_cast<uint8_t>(v);
  return out;
}

void PutVarint64(std::string& out, uint64_t v) {
  uint8_t buffer[kMaxVarint64Bytes];
  const uint8_t* end = EncodeVarint64(v, buffer);
  out.append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(end - buffer));
}

}  // namespace specstream
