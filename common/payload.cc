#include "common/payload.h"

#include <array>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"

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

// --- Wire format helpers ---------------------------------------------------------

// Protobuf wire tags of StreamResponse.chunk (field 3, length-delimited) and
// of PayloadChunk's request_id (1, varint), offset (2, varint), data (3,
// length-delimited).
constexpr uint8_t kTagChunk = (3 << 3) | 2;
constexpr uint8_t kTagRequestId = (1 << 3) | 0;
constexpr uint8_t kTagOffset = (2 << 3) | 0;
constexpr uint8_t kTagData = (3 << 3) | 2;

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* WriteVarint(uint64_t v, uint8_t* out) {
  while (v >= 0x80) {
    *out++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *out++ = static_cast<uint8_t>(v);
  return out;
}

// Drops the reference FramePayloadChunk gave a data slice.
void ReleaseKeepAlive(void* keep_alive) {
  delete static_cast<std::shared_ptr<const void>*>(keep_alive);
}

// Reads bytes across the slices of a received ByteBuffer without copying.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) remaining_ += s.size();
    SkipEmpty();
  }

  uint64_t remaining() const { return remaining_; }
  size_t slice() const { return slice_; }
  size_t pos() const { return pos_; }

  bool ReadByte(uint8_t* b) {
    if (remaining_ == 0) return false;
    *b = slices_[slice_].begin()[pos_];
    Advance(1);
    return true;
  }

  // A varint of at most 10 bytes whose value fits 64 bits, the encodings on
  // which every protobuf parser agrees. False otherwise (the caller then
  // falls back to the protobuf parser, which decides).
  bool ReadVarint(uint64_t* v) {
    uint64_t result = 0;
    for (int i = 0; i < 10; ++i) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      if (i == 9 && b > 1) return false;
      result |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
      if ((b & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;
  }

  bool Skip(uint64_t n) {
    if (n > remaining_) return false;
    while (n > 0) {
      const uint64_t in_slice = slices_[slice_].size() - pos_;
      const uint64_t step = std::min(n, in_slice);
      Advance(step);
      n -= step;
    }
    return true;
  }

 private:
  void Advance(uint64_t n) {
    pos_ += n;
    remaining_ -= n;
    if (pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
  uint64_t remaining_ = 0;
};

bool ValidNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.';
}

std::string FormatShape(const google::protobuf::RepeatedField<int64_t>& shape) {
  return shape.empty() ? "[]" : absl::StrJoin(shape, " x ");
}

}  // namespace

// --- CRC32C ----------------------------------------------------------------------

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

// --- Tensor contracts ------------------------------------------------------------

absl::StatusOr<DType> FromProtoDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_F16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_I64:
      return DType::kI64;
    case v1::DTYPE_I32:
      return DType::kI32;
    case v1::DTYPE_U8:
      return DType::kU8;
    case v1::DTYPE_BOOL:
      return DType::kBool;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", static_cast<int>(dtype), " is not a known element type"));
  }
}

v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kF16:
      return v1::DTYPE_F16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kI64:
      return v1::DTYPE_I64;
    case DType::kI32:
      return v1::DTYPE_I32;
    case DType::kU8:
      return v1::DTYPE_U8;
    case DType::kBool:
      return v1::DTYPE_BOOL;
  }
  return v1::DTYPE_UNSPECIFIED;
}

namespace {

// Appends the spec of one tensor at `*offset` and advances it; its byte
// count, or InvalidArgument naming the tensor when it overflows.
absl::StatusOr<uint64_t> AppendTensorSpec(const std::string& name, DType dtype,
                                          const std::vector<int64_t>& shape,
                                          v1::TensorContract& contract, uint64_t& offset) {
  ASSIGN_OR_RETURN(uint64_t elements, NumElements(shape));
  const uint64_t size = DTypeSize(dtype);
  if (elements > std::numeric_limits<uint64_t>::max() / size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": byte count overflows"));
  }
  const uint64_t nbytes = elements * size;
  v1::TensorSpec* spec = contract.add_tensors();
  spec->set_name(name);
  spec->set_dtype(ToProtoDType(dtype));
  for (int64_t d : shape) spec->add_shape(d);
  spec->set_offset(offset);
  spec->set_nbytes(nbytes);
  offset += nbytes;
  return nbytes;
}

}  // namespace

absl::StatusOr<v1::TensorContract> MakeContract(absl::Span<const PayloadTensor> tensors) {
  v1::TensorContract contract;
  uint64_t offset = 0;
  uint32_t crc = 0;
  for (const PayloadTensor& tensor : tensors) {
    ASSIGN_OR_RETURN(const uint64_t nbytes,
                     AppendTensorSpec(tensor.name, tensor.dtype, tensor.shape, contract, offset));
    if (tensor.bytes.size() != nbytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %s: %d bytes given, shape [%s] of %s needs %d", tensor.name, tensor.bytes.size(),
          absl::StrJoin(tensor.shape, ", "), DTypeName(tensor.dtype), nbytes));
    }
    crc = Crc32cExtend(crc, tensor.bytes);
  }
  contract.set_payload_bytes(offset);
  contract.set_crc32c(crc);
  RETURN_IF_ERROR(ValidateContract(contract));
  return contract;
}

absl::StatusOr<v1::TensorContract> MakeDeviceContract(absl::Span<const PayloadTensorLayout> tensors,
                                                      uint64_t device_checksum) {
  v1::TensorContract contract;
  uint64_t offset = 0;
  for (const PayloadTensorLayout& tensor : tensors) {
    RETURN_IF_ERROR(
        AppendTensorSpec(tensor.name, tensor.dtype, tensor.shape, contract, offset).status());
  }
  contract.set_payload_bytes(offset);
  contract.set_device_checksum(device_checksum);
  contract.set_has_device_checksum(true);
  RETURN_IF_ERROR(ValidateContract(contract));
  return contract;
}

uint64_t DeviceChecksumOf(absl::string_view bytes) {
  constexpr uint64_t kModulus = 65521;
  uint64_t a = 0, b = 0;
  const size_t words = (bytes.size() + 1) / 2;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t low = static_cast<uint8_t>(bytes[2 * i]);
    const uint64_t high = 2 * i + 1 < bytes.size() ? static_cast<uint8_t>(bytes[2 * i + 1]) : 0;
    const uint64_t w = low | (high << 8);
    a = (a + w) & 0xffffffffu;
    b = (b + (i % kModulus + 1) * w) & 0xffffffffu;
  }
  return (b << 32) | a;
}

absl::Status PackPayload(absl::Span<const PayloadTensor> tensors, absl::Span<char> out) {
  uint64_t total = 0;
  for (const PayloadTensor& tensor : tensors) total += tensor.bytes.size();
  if (total != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PackPayload: tensors hold %d bytes, output is %d", total, out.size()));
  }
  char* p = out.data();
  for (const PayloadTensor& tensor : tensors) {
    if (!tensor.bytes.empty()) std::memcpy(p, tensor.bytes.data(), tensor.bytes.size());
    p += tensor.bytes.size();
  }
  return absl::OkStatus();
}

absl::Status ValidateContract(const v1::TensorContract& contract, const ContractLimits& limits) {
  const int n = contract.tensors_size();
  if (n == 0) return absl::InvalidArgumentError("contract.tensors: empty");
  if (n > limits.max_tensors) {
    return absl::InvalidArgumentError(
        absl::StrFormat("contract.tensors: %d tensors, limit %d", n, limits.max_tensors));
  }
  absl::flat_hash_set<std::string> names;
  uint64_t offset = 0;
  for (int i = 0; i < n; ++i) {
    const v1::TensorSpec& t = contract.tensors(i);
    const std::string field = absl::StrFormat("contract.tensors[%d] (%s)", i, t.name());
    if (t.name().empty() || t.name().size() > limits.max_name_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat("%s.name: length %d not in [1, %d]", field,
                                                        t.name().size(), limits.max_name_bytes));
    }
    for (char c : t.name()) {
      if (!ValidNameChar(c)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".name: only [A-Za-z0-9_.] are allowed"));
      }
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: duplicate"));
    }
    absl::StatusOr<DType> dtype = FromProtoDType(t.dtype());
    if (!dtype.ok()) return Annotate(dtype.status(), absl::StrCat(field, ".dtype"));
    if (t.shape_size() > limits.max_rank) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.shape: rank %d, limit %d", field, t.shape_size(), limits.max_rank));
    }
    const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    absl::StatusOr<uint64_t> elements = NumElements(shape);
    if (!elements.ok()) return Annotate(elements.status(), absl::StrCat(field, ".shape"));
    const uint64_t size = DTypeSize(*dtype);
    if (*elements > std::numeric_limits<uint64_t>::max() / size || *elements * size != t.nbytes()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s.nbytes: %d != %s x %d bytes (%s)",
                                                        field, t.nbytes(), FormatShape(t.shape()),
                                                        size, DTypeName(*dtype)));
    }
    if (t.offset() != offset) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.offset: %d, expected %d (tensors are contiguous in order from 0)",
                          field, t.offset(), offset));
    }
    if (t.nbytes() > limits.max_payload_bytes - offset) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.nbytes: payload would exceed the limit of %d bytes", field,
                          limits.max_payload_bytes));
    }
    offset += t.nbytes();
  }
  if (contract.payload_bytes() != offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "contract.payload_bytes: %d != %d (sum of nbytes)", contract.payload_bytes(), offset));
  }
  return absl::OkStatus();
}

absl::Status VerifyPayload(const v1::TensorContract& contract, absl::string_view payload) {
  if (payload.size() != contract.payload_bytes()) {
    return absl::DataLossError(absl::StrFormat("payload: %d bytes, contract.payload_bytes is %d",
                                               payload.size(), contract.payload_bytes()));
  }
  if (contract.has_device_checksum()) {
    const uint64_t sum = DeviceChecksumOf(payload);
    if (sum != contract.device_checksum()) {
      return absl::DataLossError(
          absl::StrFormat("payload: device checksum 0x%016x != contract.device_checksum 0x%016x",
                          sum, contract.device_checksum()));
    }
    return absl::OkStatus();
  }
  const uint32_t crc = Crc32c(payload);
  if (crc != contract.crc32c()) {
    return absl::DataLossError(absl::StrFormat("payload: crc32c 0x%08x != contract.crc32c 0x%08x",
                                               crc, contract.crc32c()));
  }
  return absl::OkStatus();
}

// --- gRPC framing ------------------------------------------------------------------

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
  // Proto3 canonical serialization omits zero scalars and empty bytes; the
  // set oneof member is always written, even when empty.
  uint64_t inner = 0;
  if (request_id != 0) inner += 1 + VarintSize(request_id);
  if (offset != 0) inner += 1 + VarintSize(offset);
  if (!data.empty()) inner += 1 + VarintSize(data.size()) + data.size();

  uint8_t header[kMaxChunkHeaderBytes];
  uint8_t* p = header;
  *p++ = kTagChunk;
  p = WriteVarint(inner, p);
  if (request_id != 0) {
    *p++ = kTagRequestId;
    p = WriteVarint(request_id, p);
  }
  if (offset != 0) {
    *p++ = kTagOffset;
    p = WriteVarint(offset, p);
  }
  if (data.empty()) {
    grpc::Slice slice(header, static_cast<size_t>(p - header));
    return {&slice, 1};
  }
  *p++ = kTagData;
  p = WriteVarint(data.size(), p);
  grpc::Slice slices[2] = {
      grpc::Slice(header, static_cast<size_t>(p - header)),
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
  // Fast path: exactly one outer `chunk` field spanning the whole message,
  // holding only request_id, offset and data (last occurrence wins, as in
  // the protobuf parser). The data is recorded by position, not copied.
  std::vector<grpc::Slice> slices;
  if (buffer.Valid() && buffer.Dump(&slices).ok()) {
    SliceCursor in(slices);
    uint64_t tag = 0, length = 0;
    if (in.ReadVarint(&tag) && tag == kTagChunk && in.ReadVarint(&length) &&
        length == in.remaining()) {
      uint64_t request_id = 0, offset = 0, data_size = 0;
      size_t data_slice = 0, data_byte = 0;
      bool ok = true;
      while (ok && in.remaining() > 0) {
        ok = in.ReadVarint(&tag);
        if (!ok) break;
        if (tag == kTagRequestId) {
          ok = in.ReadVarint(&request_id);
        } else if (tag == kTagOffset) {
          ok = in.ReadVarint(&offset);
        } else if (tag == kTagData) {
          ok = in.ReadVarint(&data_size) && data_size <= in.remaining();
          if (ok) {
            data_slice = in.slice();
            data_byte = in.pos();
            ok = in.Skip(data_size);
          }
        } else {
          ok = false;  // unknown field or wire type: let protobuf decide
        }
      }
      if (ok) {
        *chunk = ReceivedChunk();
        chunk->request_id_ = request_id;
        chunk->offset_ = offset;
        chunk->size_ = data_size;
        chunk->first_slice_ = data_slice;
        chunk->first_byte_ = data_byte;
        chunk->slices_ = std::move(slices);
        return true;
      }
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
