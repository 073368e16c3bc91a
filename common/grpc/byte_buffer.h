// gRPC framing of the teacher stream (DESIGN §5): control messages as
// ByteBuffers, and inline payload chunks framed by hand
// (common/transport/framing.h) around a slice that points into the payload,
// so the payload is never copied into a protobuf std::string; received
// chunks are decoded by hand too and copied straight from gRPC's slices into
// their destination. Used by the gRPC adapters of both ends
// (services/teacher, services/student).
//
// Every function here is thread-safe (no shared state); a ReceivedChunk is a
// plain value owned by its caller.
#ifndef SPECSTREAM_COMMON_GRPC_BYTE_BUFFER_H_
#define SPECSTREAM_COMMON_GRPC_BYTE_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/transport/framing.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "specstream/v1/teacher.pb.h"

namespace specstream {

// Serializes `message` into a ByteBuffer (one copy, for small control
// messages). Internal when serialization fails.
absl::StatusOr<grpc::ByteBuffer> SerializeToByteBuffer(
    const google::protobuf::MessageLite& message);

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

#endif  // SPECSTREAM_COMMON_GRPC_BYTE_BUFFER_H_
