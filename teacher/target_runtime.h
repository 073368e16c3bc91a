// The target-model runtime interface every teacher runtime implements ("hf"
// and "sglang"). Callers (dump, the teacher service) depend only on
// this.
//
// Contract (shared/DESIGN.md §3, §10): for each sequence of token ids the
// runtime returns the residual stream at the output of the capture layers,
// concatenated in order (aux_hidden [T, C*H]: the request's layers, or the
// described ones when it names none), the final post-norm hidden state
// (last_hidden [T, H]) and, when asked, the full-vocab argmax of the next-token
// logits (target_ids int32 [T]).
//
// Thread-safety: Forward is called by one thread at a time.
#ifndef SPECSTREAM_TEACHER_TARGET_RUNTIME_H_
#define SPECSTREAM_TEACHER_TARGET_RUNTIME_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"

namespace specstream::teacher {

struct ModelDescription {
  std::string model_type;
  std::string runtime;  // "hf" or "sglang"
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t num_layers = 0;
  int64_t max_position_embeddings = 0;
  CaptureLayerIds capture_layer_ids;     // SGLang convention: id k = output of layer k
  torch::Dtype dtype = torch::kFloat32;  // compute dtype
  int tp_size = 1;
};

struct ForwardRequest {
  std::vector<std::vector<int32_t>> sequences;  // each non-empty, ids < vocab
  bool want_target_ids = false;
  // The layers this forward captures for every sequence, in this order,
  // each in [0, num_layers) (the compute batcher asks for the union of its
  // streams' sets). Empty: ModelDescription::capture_layer_ids.
  CaptureLayerIds capture_layer_ids;
};

struct SequenceCapture {
  torch::Tensor aux_hidden;   // [T, C*H], compute dtype
  torch::Tensor last_hidden;  // [T, H], compute dtype
  torch::Tensor target_ids;   // [T] int32; undefined unless requested
};

class TargetRuntime {
 public:
  virtual ~TargetRuntime() = default;
  virtual const ModelDescription& Describe() const = 0;
  // InvalidArgument for an empty sequence, an id outside the vocab, a
  // sequence longer than max_position_embeddings or a capture layer outside
  // [0, num_layers); the runtime stays usable.
  virtual absl::StatusOr<std::vector<SequenceCapture>> Forward(const ForwardRequest& request) = 0;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_TARGET_RUNTIME_H_
