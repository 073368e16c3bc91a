#include "student/data_source.h"

#include <algorithm>
#include <limits>

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
  const nlohmann::json& contract = source->reader_->contract();
  ASSIGN_OR_RETURN(
      source->model_,
      ModelContract::FromJson(contract.contains("model") ? contract["model"] : nlohmann::json(),
                              absl::StrCat("store ", dir, ": contract.model")));
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
  const int64_t all = std::numeric_limits<int64_t>::max();
  return GetRows(index, RowRange{0, all, all});
}

absl::StatusOr<TrainingSample> StoreSource::GetRows(int64_t index, const RowRange& rows) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  if (rows.begin < 0 || rows.end < rows.begin || rows.halo_end < rows.end) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad row range [", rows.begin, ", ", rows.end, ") + halo to ", rows.halo_end));
  }
  TrainingSample sample;
  sample.id = reader_->sample_ids()[index];
  sample.length = lengths_[index];
  sample.offset = rows.begin;
  const int64_t begin = std::min(rows.begin, sample.length);
  const int64_t own = std::min(rows.end, sample.length) - begin;
  const int64_t with_halo = std::min(rows.halo_end, sample.length) - begin;
  ASSIGN_OR_RETURN(std::vector<TensorView> views, reader_->Get(sample.id));
  // The views map the store; narrowing before copying reads only the
  // requested rows.
  RETURN_IF_ERROR(CatchTorch(absl::StrCat("sample ", sample.id), [&] {
    for (const TensorView& v : views) {
      torch::Tensor t = BorrowView(v);
      if (v.name == "aux_hidden") {
        sample.aux_hidden = t.narrow(0, begin, own).clone();
        continue;
      }
      t = t.narrow(0, begin, with_halo);
      if (v.name == "input_ids") sample.input_ids = t.to(torch::kInt64);
      if (v.name == "loss_mask") sample.loss_mask = t.to(torch::kUInt8, false, true);
      if (v.name == "last_hidden") sample.last_hidden = t.clone();
      if (v.name == "target_ids") sample.target_ids = t.to(torch::kInt64);
    }
  }));
  return sample;
}

absl::Status StoreSource::TokenIds(int64_t index, std::vector<int32_t>* ids,
                                   std::vector<uint8_t>* mask) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  const int64_t id = reader_->sample_ids()[index];
  ASSIGN_OR_RETURN(std::vector<TensorView> views, reader_->Get(id));
  return CatchTorch(absl::StrCat("sample ", id), [&] {
    for (const TensorView& v : views) {
      if (v.name == "input_ids") {
        torch::Tensor t = BorrowView(v).to(torch::kInt32).contiguous();
        ids->assign(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + t.numel());
      }
      if (v.name == "loss_mask") {
        torch::Tensor t = BorrowView(v).to(torch::kUInt8).contiguous();
        mask->assign(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
      }
    }
  });
}

DraftBatch Collate(const std::vector<TrainingSample>& samples, int64_t max_length) {
  int64_t t = 0;
  for (const TrainingSample& s : samples) {
    t = std::max(t, max_length > 0 ? std::min(s.length, max_length) : s.length);
  }
  return CollateShard(samples, max_length, 0, t, 0);
}

DraftBatch CollateShard(const std::vector<TrainingSample>& samples, int64_t max_length,
                        int64_t offset, int64_t rows, int64_t halo) {
  const int64_t b = static_cast<int64_t>(samples.size());
  const int64_t te = rows + halo;
  std::vector<int64_t> lengths;
  for (const TrainingSample& s : samples) {
    lengths.push_back(max_length > 0 ? std::min(s.length, max_length) : s.length);
  }
  const TrainingSample& first = samples.front();
  DraftBatch batch;
  batch.offset = offset;
  // On the samples' device (the host, or a GPU for payloads that arrived
  // there).
  const torch::TensorOptions on = first.input_ids.options();
  batch.input_ids = torch::zeros({b, te}, on.dtype(torch::kInt64));
  batch.loss_mask = torch::zeros({b, te}, on.dtype(torch::kUInt8));
  batch.aux_hidden = torch::zeros({b, rows, first.aux_hidden.size(1)}, first.aux_hidden.options());
  batch.last_hidden = torch::zeros({b, te, first.last_hidden.size(1)}, first.last_hidden.options());
  if (first.target_ids.defined()) batch.target_ids = torch::zeros({b, te}, on.dtype(torch::kInt64));
  for (int64_t i = 0; i < b; ++i) {
    const TrainingSample& s = samples[i];
    // Rows of the window [offset, offset + te) that hold sample tokens,
    // relative to both the batch and the sample's own row 0.
    const int64_t skip = offset - s.offset;
    auto copy = [&](torch::Tensor& dst, const torch::Tensor& src, int64_t window) {
      const int64_t n = std::clamp<int64_t>(lengths[i] - offset, 0, window);
      if (n == 0) return;
      dst[i].narrow(0, 0, n).copy_(src.narrow(0, skip, n));
    };
    copy(batch.input_ids, s.input_ids, te);
    copy(batch.loss_mask, s.loss_mask, te);
    copy(batch.aux_hidden, s.aux_hidden, rows);
    copy(batch.last_hidden, s.last_hidden, te);
    if (batch.target_ids.defined()) copy(batch.target_ids, s.target_ids, te);
  }
  batch.lengths = CopyToDevice(torch::tensor(lengths, torch::kInt64), on.device());
  batch.host_lengths = std::move(lengths);
  return batch;
}

DraftBatch ToDevice(DraftBatch batch, torch::Device device) {
  for (torch::Tensor* t : {&batch.input_ids, &batch.loss_mask, &batch.aux_hidden,
                           &batch.last_hidden, &batch.target_ids, &batch.lengths}) {
    if (t->defined()) *t = CopyToDevice(*t, device);
  }
  return batch;
}

}  // namespace specstream::student
