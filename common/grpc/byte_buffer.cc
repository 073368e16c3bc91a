#include "common/grpc/byte_buffer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace specstream {
namespace {

// Drops the reference FramePayloadChunk gave a data slice.
void ReleaseKeepAlive(void* keep_alive) {
  delete static_cast<std::shared_ptr<const void>*>(keep_alive);
}

}  // namespace

absl::StatusOr<grpc::ByteBuffer> SerializeToByteBuffer(
    const google::protobuf::MessageLite& message) {
  grpc::ByteBuffer buffer;
  bool own = false;
  grpc::Status status =
      grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(message, &buffer, &own);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("serializing ", message.GetTypeName(), ": ", status.error_message()));
  }
  return buffer;
}

grpc::ByteBuffer FramePayloadChunk(uint64_t request_id, uint64_t offset, absl::string_view data,
                                   std::shared_ptr<const void> keep_alive) {
  uint8_t header[kMaxChunkHeaderBytes];
  const size_t header_bytes = EncodeChunkHeader(request_id, offset, data.size(), header);
  if (data.empty()) {
    grpc::Slice slice(header, header_bytes);
    return {&slice, 1};
  }
  grpc::Slice slices[2] = {
      grpc::Slice(header, header_bytes),
      // gRPC never writes through the pointer; the slice only reads it.
      grpc::Slice(const_cast<char*>(data.data()), data.size(), &ReleaseKeepAlive,
                  new std::shared_ptr<const void>(std::move(keep_alive))),
  };
  return {slices, 2};
}

void ReceivedChunk::CopyTo(char* dest) const {
  if (parsed_) {
    if (!parsed_data_.empty()) std::memcpy(dest, parsed_data_.data(), parsed_data_.size());
    return;
  }
  uint64_t left = size_;
  size_t byte = first_byte_;
  for (size_t s = first_slice_; left > 0; ++s, byte = 0) {
    const grpc::Slice& slice = slices_[s];
    const uint64_t n = std::min<uint64_t>(left, slice.size() - byte);
    std::memcpy(dest, slice.begin() + byte, n);
    dest += n;
    left -= n;
  }
}

std::string ReceivedChunk::ToString() const {
  std::string out(size_, '\0');
  CopyTo(out.data());
  return out;
}

absl::StatusOr<bool> DecodeStreamResponse(const grpc::ByteBuffer& buffer,
                                          v1::StreamResponse* message, ReceivedChunk* chunk) {
  // Fast path: the layout FramePayloadChunk writes; the data is recorded by
  // position in gRPC's slices, not copied.
  std::vector<grpc::Slice> slices;
  if (buffer.Valid() && buffer.Dump(&slices).ok()) {
    std::vector<absl::string_view> segments;
    segments.reserve(slices.size());
    for (const grpc::Slice& s : slices) {
      segments.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    ChunkFrame frame;
    if (ParseChunkFrame(segments, &frame)) {
      *chunk = ReceivedChunk();
      chunk->request_id_ = frame.request_id;
      chunk->offset_ = frame.offset;
      chunk->size_ = frame.data_size;
      chunk->first_slice_ = frame.data_segment;
      chunk->first_byte_ = frame.data_byte;
      chunk->slices_ = std::move(slices);
      return true;
    }
  }

  // Everything else: the protobuf parser over the slices (no flattening).
  v1::StreamResponse parsed;
  if (buffer.Valid()) {
    grpc::ByteBuffer copy(buffer);  // refcounts the slices; the reader consumes it
    grpc::ProtoBufferReader reader(&copy);
    if (!reader.status().ok() || !parsed.ParseFromZeroCopyStream(&reader)) {
      return absl::DataLossError(
          absl::StrFormat("StreamResponse: %d bytes do not parse", buffer.Length()));
    }
  }
  if (parsed.kind_case() == v1::StreamResponse::kChunk) {
    v1::StreamResponse::PayloadChunk* c = parsed.mutable_chunk();
    *chunk = ReceivedChunk();
    chunk->request_id_ = c->request_id();
    chunk->offset_ = c->offset();
    chunk->size_ = c->data().size();
    chunk->parsed_data_ = std::move(*c->mutable_data());
    chunk->parsed_ = true;
    if (c->has_shm()) {
      chunk->shm_ = c->shm();
      chunk->has_shm_ = true;
    }
    return true;
  }
  *message = std::move(parsed);
  return false;
}

}  // namespace specstream
