// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR
// 0xFFFFFFFF; the iSCSI / ext4 / leveldb / TFRecord checksum), the one
// implementation in the tree: payload contracts, TensorBoard records and
// anything else that needs a CRC32C call these. Crc32c("123456789") ==
// 0xE3069283. Uses the SSE4.2 crc32 instruction when the CPU has it, a
// slice-by-8 table otherwise; both give identical results. Thread-safe.
#ifndef SPECSTREAM_COMMON_CRC32C_H_
#define SPECSTREAM_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace specstream {

uint32_t Crc32c(const void* data, size_t n);
inline uint32_t Crc32c(absl::string_view data) { return Crc32c(data.data(), data.size()); }

// Continues a checksum: Crc32cExtend(Crc32c(a), b) == Crc32c(a + b), and
// Crc32cExtend(0, b) == Crc32c(b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32cExtend(uint32_t crc, absl::string_view data) {
  return Crc32cExtend(crc, data.data(), data.size());
}

// The portable slice-by-8 implementation, always available (for tests and
// for comparing against the hardware path).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_CRC32C_H_
