#include "teacher/compute_batcher.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/capture_layers.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/device_checksum.h"
#include "common/torch/tensor_util.h"
#include "common/transport/contract.h"
#include "teacher/sample_request.h"
#include "teacher/sample_tensors.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {
namespace {

using SampleRequest = v1::StreamRequest::SampleRequest;

// Host segments of `tensors` (contract order), owned by the tensors.
PayloadBytes HostBytes(std::vector<NamedTensor> tensors) {
  auto owner = std::make_shared<std::vector<NamedTensor>>(std::move(tensors));
  std::vector<absl::string_view> segments;
  for (const NamedTensor& t : *owner) {
    segments.emplace_back(static_cast<const char*>(t.tensor.data_ptr()), t.tensor.nbytes());
  }
  return PayloadBytes(segments, std::move(owner));
}

// One packed tensor's bytes where it lies.
PayloadBytes PackedBytes(torch::Tensor packed) {
  auto owner = std::make_shared<torch::Tensor>(std::move(packed));
  const void* data = owner->data_ptr();
  const auto size = static_cast<uint64_t>(owner->numel());
  if (owner->is_cuda()) return PayloadBytes::OnDevice(data, size, std::move(owner));
  return PayloadBytes({absl::string_view(static_cast<const char*>(data), size)}, std::move(owner));
}

}  // namespace

ComputeBatcher::ComputeBatcher(TargetRuntime& runtime, ComputeBatcherOptions options)
    : runtime_(runtime), options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

ComputeBatcher::~ComputeBatcher() { Stop(); }

void ComputeBatcher::Enqueue(ComputeJob job) {
  absl::MutexLock lock(&mu_);
  SampleSink* sink = job.sink.get();
  auto it = by_sink_.find(sink);
  if (it == by_sink_.end()) {
    it = by_sink_.emplace(sink, turns_.insert(turns_.end(), SinkJobs{sink, {}})).first;
  }
  it->second->jobs.push_back(std::move(job));
  ++queued_;
}

void ComputeBatcher::EnqueueTask(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  task(nullptr);  // too late: dropped as Stop drops them
}

bool ComputeBatcher::TakeNextLocked(std::deque<ComputeJob>& batch, int64_t& longest,
                                    std::vector<ComputeJob>& dropped) {
  while (!turns_.empty()) {
    auto front = turns_.begin();
    if (front->sink->ended()) {  // every job of an ended sink goes at once
      queued_ -= static_cast<int64_t>(front->jobs.size());
      for (ComputeJob& job : front->jobs) dropped.push_back(std::move(job));
      by_sink_.erase(front->sink);
      turns_.erase(front);
      continue;
    }
    ComputeJob& job = front->jobs.front();
    const int64_t len = std::max<int64_t>(longest, job.request.token_ids_size());
    if (!batch.empty() &&
        len * static_cast<int64_t>(batch.size() + 1) > options_.max_batch_tokens) {
      return false;
    }
    longest = len;
    batch.push_back(std::move(job));
    front->jobs.pop_front();
    --queued_;
    if (front->jobs.empty()) {
      by_sink_.erase(front->sink);
      turns_.erase(front);
    } else {
      turns_.splice(turns_.end(), turns_, front);  // its next job waits a turn
    }
    return true;
  }
  return false;
}

std::vector<ComputeJob> ComputeBatcher::TakeAllLocked() {
  std::vector<ComputeJob> all;
  for (SinkJobs& waiting : turns_) {
    for (ComputeJob& job : waiting.jobs) all.push_back(std::move(job));
  }
  turns_.clear();
  by_sink_.clear();
  queued_ = 0;
  return all;
}

void ComputeBatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::vector<ComputeJob> dropped;  // released outside the lock
  std::deque<Task> tasks;
  {
    absl::MutexLock lock(&mu_);
    dropped = TakeAllLocked();
    tasks.swap(tasks_);
  }
  for (Task& task : tasks) task(nullptr);
}

int64_t ComputeBatcher::queued_jobs() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

int64_t ComputeBatcher::forward_calls() const {
  absl::MutexLock lock(&mu_);
  return forward_calls_;
}

void ComputeBatcher::Loop() {
  while (true) {
    std::deque<ComputeJob> batch;
    std::vector<ComputeJob> dropped;  // jobs of ended sinks, released outside the lock
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || queued_ > 0 || !tasks_.empty();
      };
      mu_.Await(absl::Condition(&wake));
      if (stopping_) return;
      if (!tasks_.empty() && (task_turn_ || queued_ == 0)) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
        task_turn_ = false;
      } else {
        // Sinks in turn (Enqueue); a batch grows while its padded size
        // (count x longest) stays within max_batch_tokens.
        int64_t longest = 0;
        while (TakeNextLocked(batch, longest, dropped)) {
        }
        task_turn_ = true;
      }
    }
    if (task) task(&runtime_);
    if (!batch.empty()) RunBatch(batch);
  }
}

void ComputeBatcher::RunBatch(std::deque<ComputeJob>& batch) {
  ForwardRequest request;
  request.want_target_ids = options_.keep_target_ids;
  const CaptureLayerIds& described = runtime_.Describe().capture_layer_ids;
  auto layers_of = [&](const ComputeJob& job) -> const std::vector<int>& {
    return job.capture_layer_ids.empty() ? described : job.capture_layer_ids;
  };
  // The layers this forward captures: the jobs' one set when they agree
  // (then no sample is sliced), else the ascending union of theirs.
  bool one_set = true;
  for (const ComputeJob& job : batch) {
    request.sequences.emplace_back(job.request.token_ids().begin(), job.request.token_ids().end());
    one_set = one_set && layers_of(job) == layers_of(batch.front());
  }
  CaptureLayerIds captured = layers_of(batch.front());
  if (!one_set) {
    captured.clear();
    for (const ComputeJob& job : batch) {
      captured.insert(captured.end(), layers_of(job).begin(), layers_of(job).end());
    }
    std::sort(captured.begin(), captured.end());
    captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
  }
  // The described set stays implicit (a runtime need not know the field).
  if (captured != described) request.capture_layer_ids = captured;
  absl::StatusOr<std::vector<SequenceCapture>> captures = runtime_.Forward(request);
  {
    absl::MutexLock lock(&mu_);
    ++forward_calls_;
  }
  if (!captures.ok()) {
    if (batch.size() > 1) {
      // One sample may be what failed: retry each alone so the others live.
      for (ComputeJob& job : batch) {
        std::deque<ComputeJob> one;
        one.push_back(std::move(job));
        RunBatch(one);
      }
      return;
    }
    SS_LOG_WARN("teacher forward failed for request {}: {}", batch[0].request.request_id(),
                captures.status().ToString());
    batch[0].sink->Deliver(batch[0].request.request_id(),
                           Annotate(captures.status(), "teacher forward"));
    return;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    absl::StatusOr<SequenceCapture> own =
        SelectLayers((*captures)[i], captured, layers_of(batch[i]));
    if (!own.ok()) {
      batch[i].sink->Deliver(batch[i].request.request_id(), own.status());
      continue;
    }
    batch[i].sink->Deliver(batch[i].request.request_id(),
                           BuildSample(batch[i].request, *own, batch[i].packed_on_device));
  }
}

absl::StatusOr<SequenceCapture> ComputeBatcher::SelectLayers(const SequenceCapture& capture,
                                                             const CaptureLayerIds& captured,
                                                             const std::vector<int>& want) const {
  const int64_t hidden = runtime_.Describe().hidden_size;
  const int64_t width = static_cast<int64_t>(captured.size()) * hidden;
  if (!capture.aux_hidden.defined() || capture.aux_hidden.dim() != 2 ||
      capture.aux_hidden.size(1) != width) {
    return absl::InternalError(absl::StrCat(
        "the runtime's aux_hidden is not [T, ", width, "] for the ", captured.size(),
        " capture layers asked for (does it honour ForwardRequest.capture_layer_ids?)"));
  }
  if (want == captured) return capture;
  SequenceCapture own = capture;
  RETURN_IF_ERROR(CatchTorch("capture layers", [&] {
    std::vector<torch::Tensor> columns;
    for (int id : want) {
      const auto at = std::find(captured.begin(), captured.end(), id);
      TORCH_CHECK(at != captured.end(), "layer ", id, " was not captured");
      columns.push_back(capture.aux_hidden.narrow(1, (at - captured.begin()) * hidden, hidden));
    }
    own.aux_hidden = torch::cat(columns, 1);
  }));
  return own;
}

absl::StatusOr<std::shared_ptr<const ReadySample>> ComputeBatcher::BuildSample(
    const SampleRequest& request, const SequenceCapture& capture, bool packed_on_device) {
  const auto [row_begin, row_end] = RequestRows(request);
  SampleTensorsOptions tensor_options;
  tensor_options.hidden_dtype = options_.payload_dtype;
  tensor_options.keep_target_ids = options_.keep_target_ids;
  tensor_options.on_capture_device = packed_on_device;
  const std::string& mask = request.loss_mask();
  ASSIGN_OR_RETURN(
      std::vector<NamedTensor> tensors,
      SampleTensors(absl::MakeConstSpan(request.token_ids().data(), request.token_ids_size()),
                    absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(mask.data()), mask.size()),
                    capture, tensor_options, row_begin, row_end));
  auto sample = std::make_shared<ReadySample>();
  sample->request_id = request.request_id();
  sample->sample_id = request.sample_id();
  sample->row_begin = row_begin;
  sample->row_end = row_end;

  if (!packed_on_device) {
    std::vector<PayloadTensor> views;
    for (const NamedTensor& t : tensors) {
      ASSIGN_OR_RETURN(DType dtype, FromTorchDtype(t.tensor.scalar_type()));
      views.push_back(
          {t.name, dtype, ShapeOf(t.tensor),
           absl::string_view(static_cast<const char*>(t.tensor.data_ptr()), t.tensor.nbytes())});
    }
    ASSIGN_OR_RETURN(sample->contract, MakeContract(views));
    if (options_.corrupt_payload_for_testing) {
      auto packed = std::make_shared<std::string>(sample->contract.payload_bytes(), '\0');
      RETURN_IF_ERROR(PackPayload(views, absl::MakeSpan(*packed)));
      options_.corrupt_payload_for_testing(request.sample_id(), *packed);
      if (packed->size() != sample->contract.payload_bytes()) {
        return absl::InternalError("corrupt_payload_for_testing changed the payload's length");
      }
      sample->bytes = PayloadBytes({absl::string_view(*packed)}, packed);
    } else {
      sample->bytes = HostBytes(std::move(tensors));
    }
    return sample;
  }

  // One packed buffer where the tensors are (the GPU the target computes
  // on, or the host), sent as it is: on a GPU it never visits the host.
  std::vector<PayloadTensorLayout> layouts;
  std::vector<torch::Tensor> parts;
  for (const NamedTensor& t : tensors) {
    ASSIGN_OR_RETURN(DType dtype, FromTorchDtype(t.tensor.scalar_type()));
    layouts.push_back({t.name, dtype, ShapeOf(t.tensor)});
    parts.push_back(t.tensor.contiguous().view(-1).view(torch::kUInt8));
  }
  int64_t checksum = 0;
  torch::Tensor packed;
  RETURN_IF_ERROR(CatchTorch("nccl payload", [&] {
    packed = torch::cat(parts);
    if (packed.is_cuda() && packed.device().index() != options_.nccl_device) {
      packed = packed.to(torch::Device(torch::kCUDA, options_.nccl_device));
    }
    if (options_.corrupt_payload_for_testing) {
      torch::Tensor host = packed.to(torch::kCPU).contiguous();
      std::string bytes(static_cast<const char*>(host.data_ptr()), host.numel());
      // The checksum is of the bytes before the test changed them.
      checksum = static_cast<int64_t>(DeviceChecksumOf(bytes));
      options_.corrupt_payload_for_testing(request.sample_id(), bytes);
      TORCH_CHECK(bytes.size() == static_cast<size_t>(packed.numel()),
                  "corrupt_payload_for_testing changed the payload's length");
      packed = torch::from_blob(bytes.data(), {packed.numel()}, torch::kUInt8)
                   .to(packed.device(), /*non_blocking=*/false, /*copy=*/true);
      return;
    }
    // Reading the checksum waits for the forward's kernels, so the payload
    // is complete before the stream's payload thread sends it from another
    // CUDA stream.
    checksum = DeviceChecksum(packed).item<int64_t>();
  }));
  if (!packed.defined()) return absl::InternalError("nccl payload: nothing packed");
  ASSIGN_OR_RETURN(sample->contract, MakeDeviceContract(layouts, static_cast<uint64_t>(checksum)));
  sample->bytes = PackedBytes(std::move(packed));
  return sample;
}

}  // namespace specstream::teacher
