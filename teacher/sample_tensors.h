// The tensors of one sample as the teacher hands them to students (DESIGN §3
// "Wire"): the one conversion from a runtime's SequenceCapture to named,
// typed tensors, shared by `dump` (the offline store) and the teacher service
// (the online payload), so that both hold the same bytes for the same sample
// and hidden dtype.
//
// Tensors, in this order (every one per-token, T rows):
//   input_ids    int32  [T]
//   loss_mask    uint8  [T]        (0 or 1)
//   aux_hidden   <hidden dtype> [T, C*H]   (C capture layers, concatenated)
//   last_hidden  <hidden dtype> [T, H]
//   target_ids   int32  [T]        (only with keep_target_ids)
//
// Thread-safety: pure functions.
#ifndef SPECSTREAM_TEACHER_SAMPLE_TENSORS_H_
#define SPECSTREAM_TEACHER_SAMPLE_TENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/offline_store.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {

struct SampleTensorsOptions {
  // Element type of aux_hidden and last_hidden: kF32, kBF16 or kF16.
  DType hidden_dtype = DType::kBF16;
  bool keep_target_ids = false;
  // Where the tensors go: false, host memory (pinned when the capture is on
  // a CUDA device, so the copy out runs at full speed); true, the capture's
  // device (an NCCL payload that stays there).
  bool on_capture_device = false;
};

// "float32" | "bfloat16" | "float16" -> DType; InvalidArgument naming `flag`
// and the accepted values otherwise.
absl::StatusOr<DType> ParseHiddenDType(const std::string& flag, const std::string& name);

// The tensor specs (names, dtypes, dimensions after T) in the order above.
std::vector<StoreTensorSpec> SampleTensorSpecs(const ModelDescription& model,
                                               const SampleTensorsOptions& options);

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;  // contiguous; on the host unless on_capture_device
};

// The sample's tensors (order above) for rows [row_begin, row_end) of a
// sequence of T = input_ids.size() tokens: input_ids and loss_mask are copied
// (an empty loss_mask means all ones), the hidden states are converted to the
// hidden dtype, and each is narrowed to the rows. `capture` is the runtime's
// capture of exactly these ids (target_ids defined when keep_target_ids).
// The result owns its memory or shares it with `capture`.
// InvalidArgument when the rows are not 0 <= row_begin < row_end <= T, the
// loss_mask length is neither 0 nor T, or the capture's shapes disagree with
// T; Internal for a LibTorch error.
absl::StatusOr<std::vector<NamedTensor>> SampleTensors(absl::Span<const int32_t> input_ids,
                                                       absl::Span<const uint8_t> loss_mask,
                                                       const SequenceCapture& capture,
                                                       const SampleTensorsOptions& options,
                                                       int64_t row_begin, int64_t row_end);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_SAMPLE_TENSORS_H_
