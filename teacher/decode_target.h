// The hf runtime as the target of in-process speculative decoding
// (common/torch/speculative.h): one sequence at a time on a KV cache, each
// forward returning the new rows' full-vocab logits and the captures the
// draft reads.
#ifndef SPECSTREAM_TEACHER_DECODE_TARGET_H_
#define SPECSTREAM_TEACHER_DECODE_TARGET_H_

#include <vector>

#include "common/torch/speculative.h"
#include "teacher/hf_runtime.h"

namespace specstream::teacher {

class DecodeTarget final : public spec::Target {
 public:
  // `capture_layer_ids`: the layers the draft's fc reads, in its order
  // (empty: the runtime's described ones). The runtime must outlive this.
  DecodeTarget(HfRuntime& runtime, std::vector<int> capture_layer_ids)
      : runtime_(runtime), captures_(std::move(capture_layer_ids)) {}

  absl::StatusOr<Rows> Extend(const std::vector<int32_t>& ids) override;
  void Truncate(int64_t length) override { cache_.Truncate(length); }
  void Reset() override { cache_.Truncate(0); }

 private:
  HfRuntime& runtime_;
  std::vector<int> captures_;
  KvCache cache_;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_DECODE_TARGET_H_
