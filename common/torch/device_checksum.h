// The device checksum of a payload (TensorContract.device_checksum,
// proto/specstream/v1/tensor.proto), computed with tensor ops where the
// bytes are, so that NCCL payloads are checked without copying them to the
// host. The value equals DeviceChecksumOf (common/payload.h), its
// definition over host bytes. Every partial sum is an exact int64 (chunks of
// 2^22 words), so any device and any reduction order give the same value.
// Like Fletcher's sums it catches changed, zeroed and reordered words; it is
// no defence against an attacker.
#ifndef SPECSTREAM_COMMON_TORCH_DEVICE_CHECKSUM_H_
#define SPECSTREAM_COMMON_TORCH_DEVICE_CHECKSUM_H_

#include <cstdint>

#include <torch/torch.h>

namespace specstream {

// The checksum of `bytes` (uint8, 1-D, contiguous, on any device) as an int64
// scalar on the same device: queued, not read back. Throws c10::Error for
// another dtype or shape.
torch::Tensor DeviceChecksum(const torch::Tensor& bytes);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TORCH_DEVICE_CHECKSUM_H_
