// Payload building blocks for the teacher stream (DESIGN §5): CRC32C, tensor
// contracts (build, validate, verify) and zero-copy gRPC framing of inline
// payload chunks. LibTorch-free; used by both the teacher (sender) and the
// student (receiver).
//
// Framing: a sample's payload is one contiguous buffer. The sender cuts it
// into PayloadChunks and writes each as a raw grpc::ByteBuffer whose bytes are
// an ordinary serialized specstream.v1.StreamResponse{chunk}: a few header
// bytes written by hand (field tags and varint lengths) followed by a slice
// that points into the payload buffer, so the payload is never copied into a
// protobuf std::string. The receiver decodes chunks by hand too and copies the
// data straight from gRPC's slices into its destination buffer.
//
// Every function here is thread-safe (no shared state); a ReceivedChunk is a
// plain value owned by its caller.
#ifndef SPECSTREAM_COMMON_PAYLOAD_H_
#define SPECSTREAM_COMMON_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "specstream/v1/teacher.pb.h"
#include "specstream/v1/tensor.pb.h"

namespace specstream {

// --- CRC32C ----------------------------------------------------------------

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR
// 0xFFFFFFFF; the iSCSI / ext4 / leveldb checksum). Crc32c("123456789") ==
// 0xE3069283. Uses the SSE4.2 crc32 instruction when the CPU has it, a
// slice-by-8 table otherwise; both give identical results.
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

// --- gRPC framing --------------------------------------------------------------

// Serializes `message` into a ByteBuffer (one copy, for small control
// messages). Internal when serialization fails.
absl::StatusOr<grpc::ByteBuffer> SerializeToByteBuffer(
    const google::protobuf::MessageLite& message);

// Bytes FramePayloadChunk puts before the data: at most 1 + 10 + 1 + 10 + 1 +
// 10 + 1 + 10 (tags and varints).
inline constexpr size_t kMaxChunkHeaderBytes = 44;

// A ByteBuffer whose bytes are exactly
//   StreamResponse{chunk{request_id, offset, data}}.SerializeAsString()
// (proto3 canonical: zero fields omitted), made of a small copied header slice
// and, when `data` is non-empty, a slice that references `data` in place.
// `keep_alive` must own the memory `data` points into; the ByteBuffer (and
// every copy gRPC makes of its slices) holds a reference to it until gRPC has
// written the bytes, which may be after the write's completion callback runs.
// The data must not change until then.
grpc::ByteBuffer FramePayloadChunk(uint64_t request_id, uint64_t offset, absl::string_view data,
                                   std::shared_ptr<const void> keep_alive);

// A received PayloadChunk whose data still lies in gRPC's slices (held by
// reference, not copied).
class ReceivedChunk final {
 public:
  ReceivedChunk() = default;

  uint64_t request_id() const { return request_id_; }
  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }
  // True when decoded by hand (the data still lies in gRPC's slices); false
  // when it came through the protobuf parser (a copy).
  bool zero_copy() const { return !parsed_; }
  // TRANSPORT_SHM chunks: the ring record that holds the bytes (the chunk's
  // own data is then empty). Null when the chunk has no locator.
  const v1::StreamResponse::ShmLocator* shm() const { return has_shm_ ? &shm_ : nullptr; }

  // Copies the data bytes into dest[0, size()). One memcpy per slice.
  void CopyTo(char* dest) const;
  // The data as a string (a copy; for tests and small chunks).
  std::string ToString() const;

 private:
  friend absl::StatusOr<bool> DecodeStreamResponse(const grpc::ByteBuffer&, v1::StreamResponse*,
                                                   ReceivedChunk*);
  uint64_t request_id_ = 0;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
  // The data is size_ bytes starting at slices_[first_slice_] + first_byte_.
  std::vector<grpc::Slice> slices_;
  size_t first_slice_ = 0;
  size_t first_byte_ = 0;
  // Set when the chunk came through the protobuf parser (non-canonical
  // encodings); then the data is this string instead of the slices.
  std::string parsed_data_;
  bool parsed_ = false;
  v1::StreamResponse::ShmLocator shm_;
  bool has_shm_ = false;
};

// Decodes a serialized StreamResponse received as a raw ByteBuffer.
// Returns true when it is a PayloadChunk: *chunk is set and *message is left
// untouched. Returns false for any other message (or a message with no kind):
// *message holds it, parsed by the protobuf parser.
// Chunks in the layout FramePayloadChunk writes (one outer chunk field whose
// fields are request_id, offset and data in any order) are decoded by hand
// without copying the data; anything else (shm chunks included) falls back to
// the protobuf parser, so the result always equals what ParseFromString would
// give. DataLoss when the bytes are not a valid StreamResponse.
absl::StatusOr<bool> DecodeStreamResponse(const grpc::ByteBuffer& buffer,
                                          v1::StreamResponse* message, ReceivedChunk* chunk);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_PAYLOAD_H_
