// Hand framing of inline payload chunks, without gRPC (DESIGN §5). A chunk on
// the wire is an ordinary serialized specstream.v1.StreamResponse{chunk}; the
// sender writes its few header bytes (field tags and varint lengths) by hand
// and sends the data in place after them, so the payload is never copied
// into a protobuf std::string; the receiver finds the data by position in
// whatever segments the bytes arrived in. common/grpc/byte_buffer.h wraps
// both ends in grpc::ByteBuffer slices. Thread-safe (no state).
#ifndef SPECSTREAM_COMMON_TRANSPORT_FRAMING_H_
#define SPECSTREAM_COMMON_TRANSPORT_FRAMING_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace specstream {

// Bytes EncodeChunkHeader writes at most: 1 + 10 + 1 + 10 + 1 + 10 + 1 + 10
// (tags and varints).
inline constexpr size_t kMaxChunkHeaderBytes = 44;

// Writes into `out` the bytes that precede the data in
//   StreamResponse{chunk{request_id, offset, data}}.SerializeAsString()
// for `data_size` data bytes (proto3 canonical: zero fields omitted, the set
// oneof member always written); returns how many. Those bytes followed by
// the data are the whole message.
size_t EncodeChunkHeader(uint64_t request_id, uint64_t offset, uint64_t data_size,
                         uint8_t (&out)[kMaxChunkHeaderBytes]);

// Where a chunk's fields and data lie in a message received as `segments`
// (concatenated in order).
struct ChunkFrame {
  uint64_t request_id = 0;
  uint64_t offset = 0;
  uint64_t data_size = 0;
  size_t data_segment = 0;  // the data starts at segments[data_segment]
  size_t data_byte = 0;     // + data_byte
};

// Parses the layout EncodeChunkHeader writes: one outer `chunk` field
// spanning the whole message whose fields are request_id, offset and data,
// in any order (the last occurrence wins, as in the protobuf parser). False
// for anything else (other messages, unknown fields, shm locators,
// non-canonical varints): the caller then asks the protobuf parser, which
// decides.
bool ParseChunkFrame(absl::Span<const absl::string_view> segments, ChunkFrame* frame);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TRANSPORT_FRAMING_H_
