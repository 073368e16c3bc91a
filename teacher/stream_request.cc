#include "teacher/stream_request.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/capture_layers.h"
#include "common/status.h"

namespace specstream::teacher {

absl::StatusOr<std::unique_ptr<PayloadSender>> AcceptOpen(const v1::StreamRequest::Open& open,
                                                          const PayloadSenderConfig& config,
                                                          v1::DType payload_dtype,
                                                          int64_t num_layers) {
  RETURN_IF_ERROR(
      ValidateCaptureLayerIds(open.capture_layer_ids(), num_layers, "open.capture_layer_ids"));
  ASSIGN_OR_RETURN(std::unique_ptr<PayloadSender> sender, OpenPayloadSender(open, config));
  if (open.contract_dtype() != v1::DTYPE_UNSPECIFIED && open.contract_dtype() != payload_dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "open.contract_dtype: the student expects ", v1::DType_Name(open.contract_dtype()),
        ", this teacher sends ", v1::DType_Name(payload_dtype)));
  }
  return sender;
}

absl::Status ValidateCredit(const v1::StreamRequest::Credit& credit) {
  if (credit.n() == 0) return absl::InvalidArgumentError("credit.n: must be > 0");
  return absl::OkStatus();
}

}  // namespace specstream::teacher
