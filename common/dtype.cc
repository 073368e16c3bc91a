#include "common/dtype.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specstream {

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I64") return DType::kI64;
  if (name == "I32") return DType::kI32;
  if (name == "U8") return DType::kU8;
  if (name == "BOOL") return DType::kBool;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\" (expected F32, F16, BF16, I64, I32, U8 or BOOL)"));
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

absl::StatusOr<uint64_t> NumElements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError("shape overflows 64 bits");
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace specstream
