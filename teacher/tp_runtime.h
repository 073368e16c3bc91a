// Options and the leader/follower interface shared by the target runtimes
// that run tensor-parallel over c10d ("hf", "sglang"), so that one launcher
// (teacher/tp_launcher.h) starts either.
//
// Under TP every rank loads its shard. Rank 0 is the leader: its Forward()
// broadcasts the request to the other ranks, which sit in RunFollower() until
// the leader calls StopFollowers(). With tp_size 1 there are no followers and
// no process group is needed.
#ifndef SPECSTREAM_TEACHER_TP_RUNTIME_H_
#define SPECSTREAM_TEACHER_TP_RUNTIME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "common/torch/compat.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {

struct TargetRuntimeOptions {
  std::string model_dir;
  // "auto" (config's torch_dtype; float16 computes in float32 on CPU),
  // "float32" or "bfloat16".
  std::string dtype = "auto";
  CaptureLayerIds capture_layer_ids;  // empty: {1, L/2-1, L-4}
  int tp_rank = 0;
  int tp_size = 1;
  // Expert parallelism within the TP group (MoE models, sglang runtime):
  // divides tp_size; see teacher/model_weights.h for the layout.
  int ep_size = 1;
  // sglang runtime, for checking the expert dispatch: every token's experts
  // run one token at a time (tp_size 1 only). Slow; never in serving.
  bool moe_per_token_loop = false;
  // Required when tp_size > 1, before Forward/RunFollower; may be attached
  // after Create (AttachGroup) so that loading errors surface first. `group`
  // (Gloo) carries the leader's requests (host tensors); `device_group`
  // carries the activations' collectives (TP all-reduce, EP all-to-all) on
  // `device`: an NCCL group for CUDA devices, null on CPU (then `group`
  // serves both).
  c10::intrusive_ptr<CommGroup> group;
  c10::intrusive_ptr<CommGroup> device_group;
  // Bound on attention score elements held at once (blockwise attention).
  int64_t max_score_elements = int64_t{1} << 22;
  // Where this rank's weights live and its forward runs: "cpu", "cuda:N"
  // (or "meta" in device-discipline tests). Requests arrive on the host and
  // are moved there; captures come back on it (teacher/sample_tensors.cc
  // copies them to the host for the payloads).
  std::string device = "cpu";
};

// The leader/follower protocol, shared by the runtimes: a forward is
// broadcast as a header {sequences, total tokens, want_target_ids}, the
// sequence lengths and the ids packed back to back (int64 [total]); every
// rank then runs Compute on the same packed ids. A header of 0 sequences
// releases the followers. The capture layers are not broadcast: which
// layers are kept changes no collective, and only the leader's captures are
// returned (followers keep the described ones and drop them).
class TensorParallelRuntime : public TargetRuntime {
 public:
  // Rank 0: validates the request, broadcasts it to the followers, computes.
  absl::StatusOr<std::vector<SequenceCapture>> Forward(const ForwardRequest& request) final;
  void AttachGroup(c10::intrusive_ptr<CommGroup> group,
                   c10::intrusive_ptr<CommGroup> device_group = {}) {
    options_.group = std::move(group);
    options_.device_group = std::move(device_group);
  }
  // Followers (tp_rank > 0): serve the leader's broadcasts until stopped.
  absl::Status RunFollower();
  // Leader: releases the followers; idempotent. Aborted (without a
  // broadcast) once a collective failed mid-forward: the followers are then
  // out of step and the caller stops the workers.
  absl::Status StopFollowers();

  virtual const HfModelConfig& config() const = 0;

 protected:
  // The forward every rank runs: `ids` int64 [N] (on the host) holds the
  // sequences back to back, `lengths` sums to N. `capture_ids` (each in
  // [0, L), any order) are the layers concatenated into aux_hidden. Target
  // ids are computed on rank 0 only. Captures are on device_.
  virtual absl::StatusOr<std::vector<SequenceCapture>> Compute(
      const torch::Tensor& ids, const std::vector<int64_t>& lengths, bool want_target_ids,
      const CaptureLayerIds& capture_ids) = 0;

  // The group for collectives on device_ tensors (see TargetRuntimeOptions).
  CommGroup& ActivationGroup() const {
    return options_.device_group ? *options_.device_group : *options_.group;
  }

  TargetRuntimeOptions options_;
  torch::Device device_ = torch::kCPU;  // options_.device, parsed at load

 private:
  bool followers_stopped_ = false;
  bool group_broken_ = false;  // a collective failed mid-forward
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_TP_RUNTIME_H_
