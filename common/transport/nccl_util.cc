#include "common/transport/nccl_util.h"

#include "absl/strings/str_cat.h"
#include "cuda_runtime_api.h"

namespace specstream {

absl::Status NcclStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  std::string message =
      absl::StrCat(file, ":", line, ": ", expr, " failed: ", ncclGetErrorString(result));
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaStatus(int error, const char* expr, const char* file, int line) {
  const cudaError_t code = static_cast<cudaError_t>(error);
  std::string message =
      absl::StrCat(file, ":", line, ": ", expr, " failed: ", cudaGetErrorName(code), " (",
                   cudaGetErrorString(code), ")");
  cudaGetLastError();  // clear a non-sticky error so later calls start clean
  if (code == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (code == cudaErrorInvalidDevice || code == cudaErrorNoDevice ||
      code == cudaErrorInsufficientDriver) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

absl::StatusOr<int> NcclVersion() {
  int version = 0;
  RETURN_IF_NCCL_ERROR(ncclGetVersion(&version));
  return version;
}

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  RETURN_IF_NCCL_ERROR(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

}  // namespace specstream
