#include "common/transport/framing.h"

#include <algorithm>

#include "common/coding.h"

namespace specstream {
namespace {

// Protobuf wire tags of StreamResponse.chunk (field 3, length-delimited) and
// of PayloadChunk's request_id (1, varint), offset (2, varint), data (3,
// length-delimited).
constexpr uint8_t kTagChunk = (3 << 3) | 2;
constexpr uint8_t kTagRequestId = (1 << 3) | 0;
constexpr uint8_t kTagOffset = (2 << 3) | 0;
constexpr uint8_t kTagData = (3 << 3) | 2;

// Reads bytes across the segments of a received message without copying.
class SegmentCursor {
 public:
  explicit SegmentCursor(absl::Span<const absl::string_view> segments) : segments_(segments) {
    for (absl::string_view s : segments) remaining_ += s.size();
    SkipEmpty();
  }

  uint64_t remaining() const { return remaining_; }
  size_t segment() const { return segment_; }
  size_t pos() const { return pos_; }

  bool ReadByte(uint8_t* b) {
    if (remaining_ == 0) return false;
    *b = static_cast<uint8_t>(segments_[segment_][pos_]);
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* v) {
    return DecodeVarint64([this](uint8_t* b) { return ReadByte(b); }, v);
  }

  bool Skip(uint64_t n) {
    if (n > remaining_) return false;
    while (n > 0) {
      const uint64_t step = std::min<uint64_t>(n, segments_[segment_].size() - pos_);
      Advance(step);
      n -= step;
    }
    return true;
  }

 private:
  void Advance(uint64_t n) {
    pos_ += n;
    remaining_ -= n;
    if (pos_ == segments_[segment_].size()) {
      ++segment_;
      pos_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (segment_ < segments_.size() && segments_[segment_].empty()) ++segment_;
  }

  absl::Span<const absl::string_view> segments_;
  size_t segment_ = 0;
  size_t pos_ = 0;
  uint64_t remaining_ = 0;
};

}  // namespace

size_t EncodeChunkHeader(uint64_t request_id, uint64_t offset, uint64_t data_size,
                         uint8_t (&out)[kMaxChunkHeaderBytes]) {
  uint64_t inner = 0;
  if (request_id != 0) inner += 1 + VarintLength(request_id);
  if (offset != 0) inner += 1 + VarintLength(offset);
  if (data_size != 0) inner += 1 + VarintLength(data_size) + data_size;
  uint8_t* p = out;
  *p++ = kTagChunk;
  p = EncodeVarint64(inner, p);
  if (request_id != 0) {
    *p++ = kTagRequestId;
    p = EncodeVarint64(request_id, p);
  }
  if (offset != 0) {
    *p++ = kTagOffset;
    p = EncodeVarint64(offset, p);
  }
  if (data_size != 0) {
    *p++ = kTagData;
    p = EncodeVarint64(data_size, p);
  }
  return static_cast<size_t>(p - out);
}

bool ParseChunkFrame(absl::Span<const absl::string_view> segments, ChunkFrame* frame) {
  SegmentCursor in(segments);
  uint64_t tag = 0, length = 0;
  if (!in.ReadVarint(&tag) || tag != kTagChunk || !in.ReadVarint(&length) ||
      length != in.remaining()) {
    return false;
  }
  ChunkFrame parsed;
  while (in.remaining() > 0) {
    if (!in.ReadVarint(&tag)) return false;
    if (tag == kTagRequestId) {
      if (!in.ReadVarint(&parsed.request_id)) return false;
    } else if (tag == kTagOffset) {
      if (!in.ReadVarint(&parsed.offset)) return false;
    } else if (tag == kTagData) {
      if (!in.ReadVarint(&parsed.data_size) || parsed.data_size > in.remaining()) return false;
      parsed.data_segment = in.segment();
      parsed.data_byte = in.pos();
      if (!in.Skip(parsed.data_size)) return false;
    } else {
      return false;  // unknown field or wire type: let protobuf decide
    }
  }
  *frame = parsed;
  return true;
}

}  // namespace specstream
