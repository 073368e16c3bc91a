// Validation of one StreamRequest.SampleRequest (proto/specstream/v1/
// teacher.proto) against what a teacher serves, and the rows it asks for.
// Every malformed request is refused with InvalidArgument naming its field;
// the stream goes on (the student gets a SampleError). Thread-safe.
#ifndef SPECSTREAM_TEACHER_SAMPLE_REQUEST_H_
#define SPECSTREAM_TEACHER_SAMPLE_REQUEST_H_

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "specstream/v1/teacher.pb.h"

namespace specstream::teacher {

// OK when `request` can be served: request_id > 0; 1 to max_tokens token
// ids, each in [0, vocab_size); a loss mask of one 0/1 byte per token or
// none; and either the whole sample (slice_end 0, no halos) or a non-empty
// slice [slice_begin, slice_end) within the tokens with halos >= 0.
absl::Status ValidateSampleRequest(const v1::StreamRequest::SampleRequest& request,
                                   int64_t max_tokens, int64_t vocab_size);

// Rows [begin, end) of the whole sample that a validated request returns:
// all of them, or its slice widened by its halos (saturating at the sample's
// ends: halos may be as large as the student likes).
std::pair<int64_t, int64_t> RequestRows(const v1::StreamRequest::SampleRequest& request);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_SAMPLE_REQUEST_H_
