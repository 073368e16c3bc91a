// Tensor contracts (DESIGN §5, proto/specstream/v1/tensor.proto): what a
// payload holds (names, dtypes, shapes, offsets) and how it is checked
// (CRC32C, or the device checksum of NCCL payloads). Built by the teacher,
// validated and verified by the student before any byte is used.
// LibTorch- and gRPC-free; every function is thread-safe (no shared state).
#ifndef SPECSTREAM_COMMON_TRANSPORT_CONTRACT_H_
#define SPECSTREAM_COMMON_TRANSPORT_CONTRACT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "specstream/v1/tensor.pb.h"

namespace specstream {

// --- Tensor contracts --------------------------------------------------------

// v1::DType <-> DType. InvalidArgument for DTYPE_UNSPECIFIED or an unknown
// value.
absl::StatusOr<DType> FromProtoDType(v1::DType dtype);
v1::DType ToProtoDType(DType dtype);

// One named tensor of a payload: its element type, shape and bytes (not
// owned; must stay valid for the call).
struct PayloadTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::string_view bytes;
};

// The contract of a payload that holds `tensors` back to back in the given
// order: offsets from 0 with no gaps, nbytes = product(shape) * dtype size,
// payload_bytes = the sum, crc32c over the concatenated bytes (computed
// incrementally, nothing is copied). InvalidArgument naming the tensor when
// its byte count does not match its shape, or when the result would fail
// ValidateContract with default limits.
absl::StatusOr<v1::TensorContract> MakeContract(absl::Span<const PayloadTensor> tensors);

// The layout of one tensor of a payload whose bytes the caller does not
// hand over (they may be in device memory).
struct PayloadTensorLayout {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// The contract of a payload that holds `tensors` back to back (offsets as
// MakeContract) and is checked by `device_checksum` (has_device_checksum
// set, crc32c 0): an NCCL payload, whose sender computed the checksum where
// its bytes are (common/torch/device_checksum.h). Errors as MakeContract.
absl::StatusOr<v1::TensorContract> MakeDeviceContract(absl::Span<const PayloadTensorLayout> tensors,
                                                      uint64_t device_checksum);

// The device checksum of host bytes, by its definition (tensor.proto):
// little-endian 16-bit words w_i (an odd last byte a word of its own),
// A = sum w_i mod 2^32, B = sum ((i mod 65521) + 1) w_i mod 2^32, B·2^32 + A.
uint64_t DeviceChecksumOf(absl::string_view bytes);

// Copies `tensors` into `out` at the offsets of MakeContract(tensors) (e.g.
// into a shared-memory ring reservation). `out` must be exactly
// payload_bytes long (InvalidArgument otherwise).
absl::Status PackPayload(absl::Span<const PayloadTensor> tensors, absl::Span<char> out);

// What a receiver accepts.
struct ContractLimits {
  uint64_t max_payload_bytes = uint64_t{16} << 30;  // 16 GiB
  int max_tensors = 64;
  int max_rank = 8;
  size_t max_name_bytes = 128;
};

// Checks a received contract before any payload byte is accepted:
//   * 1 to max_tensors tensors;
//   * names non-empty, at most max_name_bytes of [A-Za-z0-9_.], unique;
//   * dtype a known value other than DTYPE_UNSPECIFIED;
//   * shape of at most max_rank non-negative dimensions;
//   * nbytes == product(shape) * dtype size (no overflow);
//   * offsets contiguous in order: tensors[0].offset == 0 and
//     tensors[i].offset == tensors[i-1].offset + tensors[i-1].nbytes;
//   * payload_bytes == sum of nbytes, at most max_payload_bytes.
// InvalidArgument naming the field, e.g.
// "contract.tensors[1] (aux_hidden).nbytes: 100 != 4 x 3 x 2 bytes (BF16)".
absl::Status ValidateContract(const v1::TensorContract& contract,
                              const ContractLimits& limits = {});

// Checks a whole received payload in host memory against its (validated)
// contract: its length equals payload_bytes and its CRC32C equals crc32c
// (or, with has_device_checksum, DeviceChecksumOf equals device_checksum).
// DataLoss naming the mismatch otherwise.
absl::Status VerifyPayload(const v1::TensorContract& contract, absl::string_view payload);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TRANSPORT_CONTRACT_H_
