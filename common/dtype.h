// Element types of tensors on disk and on the wire (safetensors names).
#ifndef SPECSTREAM_COMMON_DTYPE_H_
#define SPECSTREAM_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specstream {

enum class DType { kF32, kF16, kBF16, kI64, kI32, kU8, kBool };

// "F32", "F16", "BF16", "I64", "I32", "U8", "BOOL"; anything else is
// InvalidArgument naming the string.
absl::StatusOr<DType> ParseDType(absl::string_view name);
absl::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

// Product of `shape`; InvalidArgument on a negative dimension or overflow.
absl::StatusOr<uint64_t> NumElements(const std::vector<int64_t>& shape);

// "[2, 3]": a shape as error messages print it.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_DTYPE_H_
