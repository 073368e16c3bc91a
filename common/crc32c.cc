#include "common/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace specstream {
namespace {

// --- CRC32C tables -------------------------------------------------------------

constexpr uint32_t kCrc32cPoly = 0x82F63B78;  // reflected Castagnoli

// tables[0] is the classic byte-at-a-time table; tables[k][b] is the CRC of
// byte b followed by k zero bytes, which lets slice-by-8 fold 8 bytes per step.
struct Crc32cTables {
  uint32_t t[8][256] = {};
  constexpr Crc32cTables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1) ? kCrc32cPoly : 0);
      t[0][b] = crc;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
};
constexpr Crc32cTables kTables;

uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // x86-64 and aarch64 Linux are little-endian
  return v;
}

// `state` is the raw (non-inverted) register.
uint32_t Crc32cUpdatePortable(uint32_t state, const uint8_t* p, size_t n) {
  const auto& t = kTables.t;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    state = (state >> 8) ^ t[0][(state ^ *p++) & 0xFF];
    --n;
  }
  while (n >= 8) {
    const uint64_t v = LoadLE64(p) ^ state;
    state = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^
            t[4][(v >> 24) & 0xFF] ^ t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^
            t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) state = (state >> 8) ^ t[0][(state ^ *p++) & 0xFF];
  return state;
}

#if defined(__x86_64__)
// The crc32 instruction computes exactly this CRC (same polynomial, same bit
// order); one 8-byte step per instruction.
__attribute__((target("sse4.2"))) uint32_t Crc32cUpdateSse42(uint32_t state, const uint8_t* p,
                                                             size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    state = _mm_crc32_u8(state, *p++);
    --n;
  }
  uint64_t s = state;
  while (n >= 8) {
    s = _mm_crc32_u64(s, LoadLE64(p));
    p += 8;
    n -= 8;
  }
  state = static_cast<uint32_t>(s);
  while (n-- > 0) state = _mm_crc32_u8(state, *p++);
  return state;
}

// Function-local so that it is initialized on first use, even from another
// translation unit's static initializer (__builtin_cpu_init makes that safe).
bool HaveSse42() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~Crc32cUpdatePortable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (HaveSse42()) return ~Crc32cUpdateSse42(~crc, static_cast<const uint8_t*>(data), n);
#endif
  return Crc32cExtendPortable(crc, data, n);
}

uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

}  // namespace specstream
