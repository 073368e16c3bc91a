#include "common/torch/device_checksum.h"

#include <algorithm>

namespace specstream {
namespace {

constexpr int64_t kModulus = 65521;                // as DeviceChecksumOf
constexpr int64_t kChunkWords = int64_t{1} << 22;  // exact int64 partial sums
constexpr int64_t kLow32 = (int64_t{1} << 32) - 1;

}  // namespace

torch::Tensor DeviceChecksum(const torch::Tensor& bytes) {
  TORCH_CHECK(bytes.scalar_type() == torch::kUInt8 && bytes.dim() == 1 && bytes.is_contiguous(),
              "DeviceChecksum: expected contiguous uint8 [n], got ", bytes.scalar_type(), " ",
              bytes.sizes());
  const auto int64 = bytes.options().dtype(torch::kInt64);
  const int64_t n = bytes.numel();
  // Words: pairs of bytes, low byte first; an odd last byte stands alone.
  const int64_t pairs = n / 2;
  torch::Tensor a = torch::zeros({}, int64), b = torch::zeros({}, int64);
  for (int64_t start = 0; start < pairs; start += kChunkWords) {
    const int64_t count = std::min(kChunkWords, pairs - start);
    const torch::Tensor pair =
        bytes.narrow(0, 2 * start, 2 * count).view({count, 2}).to(torch::kInt64);
    const torch::Tensor words = pair.select(1, 0) + pair.select(1, 1) * 256;
    const torch::Tensor weights =
        torch::arange(start, start + count, int64).remainder_(kModulus).add_(1);
    // Chunk sums stay below 2^22 * 2^16 * 2^16 = 2^54: exact.
    a = (a + words.sum()).bitwise_and_(kLow32);
    b = (b + (words * weights).sum()).bitwise_and_(kLow32);
  }
  if (n % 2 == 1) {
    const torch::Tensor last = bytes.narrow(0, n - 1, 1).to(torch::kInt64).sum();
    a = (a + last).bitwise_and_(kLow32);
    b = (b + last * ((pairs % kModulus) + 1)).bitwise_and_(kLow32);
  }
  // B * 2^32 + A as the int64 with the same 64 bits.
  return b.bitwise_left_shift(32).bitwise_or(a);
}

}  // namespace specstream
