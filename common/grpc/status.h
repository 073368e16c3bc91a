// The one mapping between absl::Status and grpc::Status. The canonical codes
// are numerically identical in both libraries; messages pass through.
#ifndef SPECSTREAM_COMMON_GRPC_STATUS_H_
#define SPECSTREAM_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace specstream {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_GRPC_STATUS_H_
