#include "teacher/tp_runtime.h"

#include "common/status.h"
#include "common/torch/process_group.h"
#include "teacher/model_weights.h"

namespace specstream::teacher {

absl::StatusOr<std::vector<SequenceCapture>> TensorParallelRuntime::Forward(
    const ForwardRequest& request) {
  if (options_.tp_rank != 0) {
    return absl::FailedPreconditionError("Forward is called on TP rank 0; followers RunFollower()");
  }
  RETURN_IF_ERROR(ValidateForwardRequest(request, config()));
  if (options_.tp_size > 1 && !options_.group) {
    return absl::FailedPreconditionError("tensor parallelism needs a process group");
  }
  std::vector<int64_t> lengths;
  int64_t total = 0;
  for (const auto& seq : request.sequences) {
    lengths.push_back(static_cast<int64_t>(seq.size()));
    total += static_cast<int64_t>(seq.size());
  }
  torch::Tensor ids = torch::empty({total}, torch::kInt64);
  int64_t* out = ids.data_ptr<int64_t>();
  for (const auto& seq : request.sequences) {
    for (int32_t id : seq) *out++ = id;
  }
  if (options_.tp_size > 1) {
    torch::Tensor header = torch::tensor(
        {static_cast<int64_t>(lengths.size()), total, int64_t{request.want_target_ids}},
        torch::kInt64);
    torch::Tensor lens = torch::tensor(lengths, torch::kInt64);
    absl::Status sent = Broadcast(*options_.group, header, 0);
    if (sent.ok()) sent = Broadcast(*options_.group, lens, 0);
    if (sent.ok()) sent = Broadcast(*options_.group, ids, 0);
    if (!sent.ok()) {
      group_broken_ = true;
      return sent;
    }
  }
  const CaptureLayerIds& capture =
      request.capture_layer_ids.empty() ? Describe().capture_layer_ids : request.capture_layer_ids;
  auto result = Compute(ids, lengths, request.want_target_ids, capture);
  if (!result.ok() && options_.tp_size > 1) group_broken_ = true;
  return result;
}

absl::Status TensorParallelRuntime::RunFollower() {
  if (options_.tp_rank == 0) return absl::FailedPreconditionError("rank 0 is the leader");
  if (!options_.group) return absl::FailedPreconditionError("no process group attached");
  while (true) {
    torch::Tensor header = torch::zeros({3}, torch::kInt64);
    RETURN_IF_ERROR(Broadcast(*options_.group, header, 0));
    const int64_t count = header[0].item<int64_t>();
    if (count == 0) return absl::OkStatus();
    torch::Tensor lens = torch::zeros({count}, torch::kInt64);
    RETURN_IF_ERROR(Broadcast(*options_.group, lens, 0));
    torch::Tensor ids = torch::zeros({header[1].item<int64_t>()}, torch::kInt64);
    RETURN_IF_ERROR(Broadcast(*options_.group, ids, 0));
    std::vector<int64_t> lengths(lens.data_ptr<int64_t>(), lens.data_ptr<int64_t>() + count);
    // The leader's capture layers are not sent (see the header): these
    // captures are dropped.
    auto result =
        Compute(ids, lengths, header[2].item<int64_t>() != 0, Describe().capture_layer_ids);
    if (!result.ok()) return result.status();
  }
}

absl::Status TensorParallelRuntime::StopFollowers() {
  if (options_.tp_size == 1 || followers_stopped_) return absl::OkStatus();
  followers_stopped_ = true;
  if (group_broken_) {
    return absl::AbortedError("the TP group is out of step after a failed forward");
  }
  torch::Tensor header = torch::zeros({3}, torch::kInt64);
  return Broadcast(*options_.group, header, 0);
}

}  // namespace specstream::teacher
