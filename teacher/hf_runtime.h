// The "hf" target runtime: dense Llama / Qwen2 / Qwen3 / Mistral checkpoints
// in Hugging Face layout with HF numerics, right-padded batches, and tensor
// parallelism over c10d (column-parallel q/k/v/gate/up, row-parallel
// o/down, an all-reduce after each).
//
// Under TP every rank loads its shard; the leader/follower protocol is
// TensorParallelRuntime's (teacher/tp_runtime.h).
#ifndef SPECSTREAM_TEACHER_HF_RUNTIME_H_
#define SPECSTREAM_TEACHER_HF_RUNTIME_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "common/torch/blocks.h"
#include "teacher/tp_runtime.h"

namespace specstream::teacher {

struct ModelWeights;

using HfRuntimeOptions = TargetRuntimeOptions;

// One sequence's attention keys and values for incremental decoding
// (HfRuntime::Extend): per layer [1, kv_heads, capacity, head_dim] in the
// compute dtype, of which the first `length` positions are filled. Truncate
// drops positions (a rejected speculative proposal) without reallocating.
struct KvCache {
  std::vector<torch::Tensor> keys, values;
  int64_t length = 0;
  void Truncate(int64_t new_length);
};

class HfRuntime final : public TensorParallelRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<HfRuntime>> Create(HfRuntimeOptions options);
  ~HfRuntime() override;

  const ModelDescription& Describe() const override { return description_; }
  const HfModelConfig& config() const override { return config_; }

  // HF's output_hidden_states for one sequence (no TP broadcast; every rank
  // must call it together under TP): [0] = embeddings, [i+1] = output of
  // layer i, each [T, H]. For checking capture wiring.
  absl::StatusOr<std::vector<torch::Tensor>> HiddenStates(const std::vector<int32_t>& ids);

  // Incremental decoding (tp_size 1): runs `ids` at positions [cache.length,
  // cache.length + n) against the cached keys and values, appends theirs and
  // returns the n new rows' captures (aux_hidden of `capture_ids`, or the
  // described layers when empty, and last_hidden). A row's values do not
  // depend on how many rows are extended at once. InvalidArgument for no
  // ids, an id outside the vocab, positions past max_position_embeddings or
  // a capture layer outside the model; the cache is then unchanged.
  // Whether Extend works here: one rank (tp_size 1).
  bool can_decode() const { return options_.tp_size == 1; }
  absl::StatusOr<SequenceCapture> Extend(KvCache& cache, const std::vector<int32_t>& ids,
                                         const CaptureLayerIds& capture_ids = {});

  // One decoding step of several sequences at once (tp_size 1): ids[b] at
  // position caches[b]->length of sequence b, which gets its key and value
  // appended. Returns the new rows' last_hidden [B, H]. The projections and
  // the MLP run as one batch (a GEMM instead of B GEMVs); attention runs per
  // sequence on its cache, as Extend's. InvalidArgument for an id outside
  // the vocab or a position past max_position_embeddings (no cache changed).
  absl::StatusOr<torch::Tensor> DecodeStep(const std::vector<KvCache*>& caches,
                                           const std::vector<int32_t>& ids);

  // Full-vocab next-token logits, float32 [T, V], of last_hidden rows [T, H].
  torch::Tensor Logits(const torch::Tensor& last_hidden) const;

 private:
  HfRuntime() = default;
  absl::Status Load();
  // Right-pads the packed sequences (id 0) and runs ComputePadded.
  absl::StatusOr<std::vector<SequenceCapture>> Compute(const torch::Tensor& ids,
                                                       const std::vector<int64_t>& lengths,
                                                       bool want_target_ids,
                                                       const CaptureLayerIds& capture_ids) override;
  // ids [B, T] int64 right-padded, on device_; causal attention keeps the
  // padding out of every real position.
  absl::StatusOr<std::vector<SequenceCapture>> ComputePadded(
      const torch::Tensor& ids, const std::vector<int64_t>& lengths, bool want_target_ids,
      const CaptureLayerIds& capture_ids, std::vector<torch::Tensor>* all_hidden);
  // Grows the cache's buffers to hold `total` positions (keeping its rows).
  void GrowCache(KvCache& cache, int64_t total) const;
  // Attention of layer `layer` for n new rows of one sequence at positions
  // [cache.length, + n): q [1, Hq, n, D], k/v [1, Hkv, n, D] (RoPE applied)
  // are written into the cache (its length is left to the caller) and the
  // rows attend to every cached position -> [1, Hq, n, D].
  torch::Tensor AttendCached(KvCache& cache, int64_t layer, const torch::Tensor& q,
                             const torch::Tensor& k, const torch::Tensor& v) const;
  // Attention of one layer: q [B, Hq, T, D], k/v [B, Hkv, T, D] (RoPE
  // applied) -> [B, Hq, T, D].
  using AttendFn = std::function<torch::Tensor(int64_t layer, const torch::Tensor& q,
                                               const torch::Tensor& k, const torch::Tensor& v)>;
  // Decoder layer `i` on h [B, T, H] at rotary cos/sin [T, D]: attention
  // through `attend`, the MLP, both residuals (and the TP all-reduces).
  torch::Tensor Layer(int64_t i, const torch::Tensor& h, const torch::Tensor& cos,
                      const torch::Tensor& sin, const AttendFn& attend);

  HfModelConfig config_;
  ModelDescription description_;
  torch::Dtype dtype_ = torch::kFloat32;
  std::unique_ptr<ModelWeights> weights_;
  std::optional<nn::Rotary> rotary_;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_HF_RUNTIME_H_
