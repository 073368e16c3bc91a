#include "common/transport/contract.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/status.h"

namespace specstream {
namespace {

bool ValidNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.';
}

std::string FormatShape(const google::protobuf::RepeatedField<int64_t>& shape) {
  return shape.empty() ? "[]" : absl::StrJoin(shape, " x ");
}

}  // namespace

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

}  // namespace specstream
