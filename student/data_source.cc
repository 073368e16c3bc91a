#include "student/data_source.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream::student {

absl::StatusOr<std::unique_ptr<StoreSource>> StoreSource::Open(const std::string& dir) {
  std::unique_ptr<StoreSource> source(new StoreSource());
  ASSIGN_OR_RETURN(source->reader_, StoreReader::Open(dir));
  if (!source->reader_->complete()) {
    return absl::FailedPreconditionError(
        absl::StrCat("store ", dir, " is incomplete (re-run its dump to finish it)"));
  }
  bool has_aux = false, has_last = false;
  for (const StoreTensorSpec& spec : source->reader_->tensor_specs()) {
    if (spec.name == "target_ids") source->has_target_ids_ = true;
    if (spec.name == "aux_hidden") has_aux = true;
    if (spec.name == "last_hidden") has_last = true;
  }
  if (!has_aux || !has_last) {
    return absl::InvalidArgumentError(
        absl::StrCat("store ", dir, " lacks aux_hidden/last_hidden tensors"));
  }
  // Lengths from input_ids shapes (views: no data is read).
  for (int64_t id : source->reader_->sample_ids()) {
    ASSIGN_OR_RETURN(std::vector<TensorView> views, source->reader_->Get(id));
    int64_t length = 0;
    for (const TensorView& v : views) {
      if (v.name == "input_ids") length = v.shape[0];
    }
    source->lengths_.push_back(length);
  }
  return source;
}

absl::StatusOr<TrainingSample> StoreSource::Get(int64_t index) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  TrainingSample sample;
  sample.id = reader_->sample_ids()[index];
  ASSIGN_OR_RETURN(std::vector<TensorView> views, reader_->Get(sample.id));
  RETURN_IF_ERROR(CatchTorch(absl::StrCat("sample ", sample.id), [&] {
    for (const TensorView& v : views) {
      torch::Tensor t = BorrowView(v);
      if (v.name == "input_ids") sample.input_ids = t.to(torch::kInt64);
      if (v.name == "loss_mask") sample.loss_mask = t.to(torch::kUInt8, false, true);
      if (v.name == "aux_hidden") sample.aux_hidden = t.clone();
      if (v.name == "last_hidden") sample.last_hidden = t.clone();
      if (v.name == "target_ids") sample.target_ids = t.to(torch::kInt64);
    }
  }));
  return sample;
}

DraftBatch Collate(const std::vector<TrainingSample>& samples, int64_t max_length) {
  const int64_t b = static_cast<int64_t>(samples.size());
  std::vector<int64_t> lengths;
  int64_t t = 0;
  for (const TrainingSample& s : samples) {
    int64_t len = s.input_ids.size(0);
    if (max_length > 0) len = std::min(len, max_length);
    lengths.push_back(len);
    t = std::max(t, len);
  }
  const TrainingSample& first = samples.front();
  DraftBatch batch;
  batch.input_ids = torch::zeros({b, t}, torch::kInt64);
  batch.loss_mask = torch::zeros({b, t}, torch::kUInt8);
  batch.aux_hidden = torch::zeros({b, t, first.aux_hidden.size(1)}, first.aux_hidden.options());
  batch.last_hidden = torch::zeros({b, t, first.last_hidden.size(1)}, first.last_hidden.options());
  if (first.target_ids.defined()) batch.target_ids = torch::zeros({b, t}, torch::kInt64);
  for (int64_t i = 0; i < b; ++i) {
    const TrainingSample& s = samples[i];
    const int64_t len = lengths[i];
    batch.input_ids[i].narrow(0, 0, len).copy_(s.input_ids.narrow(0, 0, len));
    batch.loss_mask[i].narrow(0, 0, len).copy_(s.loss_mask.narrow(0, 0, len));
    batch.aux_hidden[i].narrow(0, 0, len).copy_(s.aux_hidden.narrow(0, 0, len));
    batch.last_hidden[i].narrow(0, 0, len).copy_(s.last_hidden.narrow(0, 0, len));
    if (batch.target_ids.defined()) {
      batch.target_ids[i].narrow(0, 0, len).copy_(s.target_ids.narrow(0, 0, len));
    }
  }
  batch.lengths = torch::tensor(lengths, torch::kInt64);
  return batch;
}

}  // namespace specstream::student
