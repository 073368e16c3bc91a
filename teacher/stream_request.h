// The checks a teacher stream (teacher/stream_session.h) applies to an Open
// or a Credit on its own, apart from the stream's state (Open first and
// once, request ids unique, the bound on queued requests). SampleRequests
// have theirs in teacher/sample_request.h. LibTorch-free, so the
// stream_request fuzzer (tests/fuzz) runs the very checks the session does.
// Thread-safe.
#ifndef SPECSTREAM_TEACHER_STREAM_REQUEST_H_
#define SPECSTREAM_TEACHER_STREAM_REQUEST_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport/payload_sender.h"
#include "specstream/v1/teacher.pb.h"
#include "specstream/v1/tensor.pb.h"

namespace specstream::teacher {

// The sender a student's Open asks for, or why the stream is refused:
// capture_layer_ids that are not ascending, distinct and in
// [0, num_layers) (InvalidArgument naming open.capture_layer_ids; checked
// first, so a refused Open attaches nothing), what OpenPayloadSender
// refuses (the transport, the shm ring, the NCCL id), then a contract_dtype
// other than DTYPE_UNSPECIFIED and `payload_dtype` (FailedPrecondition). An
// shm Open attaches the ring it names.
absl::StatusOr<std::unique_ptr<PayloadSender>> AcceptOpen(const v1::StreamRequest::Open& open,
                                                          const PayloadSenderConfig& config,
                                                          v1::DType payload_dtype,
                                                          int64_t num_layers);

// A Credit grants at least one sample: InvalidArgument when n is 0.
absl::Status ValidateCredit(const v1::StreamRequest::Credit& credit);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_STREAM_REQUEST_H_
