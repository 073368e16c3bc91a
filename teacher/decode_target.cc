#include "teacher/decode_target.h"

#include "common/status.h"

namespace specstream::teacher {

absl::StatusOr<spec::Target::Rows> DecodeTarget::Extend(const std::vector<int32_t>& ids) {
  ASSIGN_OR_RETURN(SequenceCapture capture, runtime_.Extend(cache_, ids, captures_));
  Rows rows;
  rows.logits = runtime_.Logits(capture.last_hidden).to(torch::kCPU);
  rows.aux_hidden = capture.aux_hidden;
  return rows;
}

}  // namespace specstream::teacher
