// NCCL helpers shared by the GPU payload transport. Compiled only when
// SPECSTREAM_WITH_NCCL is 1 (target specstream_nccl); include this header only
// from GPU-only files.
#ifndef SPECSTREAM_COMMON_TRANSPORT_NCCL_UTIL_H_
#define SPECSTREAM_COMMON_TRANSPORT_NCCL_UTIL_H_

#if !SPECSTREAM_WITH_NCCL
#error "common/transport/nccl_util.h needs SPECSTREAM_WITH_NCCL=1 (link specstream_nccl)"
#endif

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nccl.h"

namespace specstream {

// Converts an ncclResult_t into a status naming the call site.
absl::Status NcclStatus(ncclResult_t result, const char* expr, const char* file, int line);

// The same for a CUDA runtime error code (cudaError_t, passed as int so this
// header needs no CUDA include).
absl::Status CudaStatus(int error, const char* expr, const char* file, int line);

}  // namespace specstream

// Every NCCL call goes through this: returns a status with file:line and
// NCCL's own error string from the enclosing function on failure.
#define RETURN_IF_NCCL_ERROR(expr)                                                         \
  do {                                                                                     \
    ncclResult_t specstream_nccl_result_ = (expr);                                         \
    if (specstream_nccl_result_ != ncclSuccess) {                                          \
      return ::specstream::NcclStatus(specstream_nccl_result_, #expr, __FILE__, __LINE__); \
    }                                                                                      \
  } while (false)

// The same for CUDA runtime calls (cudaSuccess is 0).
#define RETURN_IF_CUDA_ERROR(expr)                                                         \
  do {                                                                                     \
    const int specstream_cuda_result_ = static_cast<int>(expr);                            \
    if (specstream_cuda_result_ != 0) {                                                    \
      return ::specstream::CudaStatus(specstream_cuda_result_, #expr, __FILE__, __LINE__); \
    }                                                                                      \
  } while (false)

namespace specstream {

// NCCL's version as major*10000 + minor*100 + patch (e.g. 22803 for 2.28.3).
absl::StatusOr<int> NcclVersion();

// A fresh ncclUniqueId as raw bytes (NCCL_UNIQUE_ID_BYTES), to be sent to
// the peer over gRPC. Works without a GPU.
absl::StatusOr<std::string> NewNcclUniqueId();

// Number of visible CUDA devices; 0 (not an error) without a driver.
int CudaDeviceCount();

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TRANSPORT_NCCL_UTIL_H_
