#include "teacher/sample_tensors.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream::teacher {

absl::StatusOr<DType> ParseHiddenDType(const std::string& flag, const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " \"", name, "\" (expected float32, bfloat16 or float16)"));
}

std::vector<StoreTensorSpec> SampleTensorSpecs(const ModelDescription& model,
                                               const SampleTensorsOptions& options) {
  std::vector<StoreTensorSpec> specs = {
      {"input_ids", DType::kI32, {}},
      {"loss_mask", DType::kU8, {}},
      {"aux_hidden",
       options.hidden_dtype,
       {static_cast<int64_t>(model.capture_layer_ids.size()) * model.hidden_size}},
      {"last_hidden", options.hidden_dtype, {model.hidden_size}},
  };
  if (options.keep_target_ids) specs.push_back({"target_ids", DType::kI32, {}});
  return specs;
}

absl::StatusOr<std::vector<NamedTensor>> SampleTensors(absl::Span<const int32_t> input_ids,
                                                       absl::Span<const uint8_t> loss_mask,
                                                       const SequenceCapture& capture,
                                                       const SampleTensorsOptions& options,
                                                       int64_t row_begin, int64_t row_end) {
  const int64_t t = static_cast<int64_t>(input_ids.size());
  if (row_begin < 0 || row_begin >= row_end || row_end > t) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", row_begin, ", ", row_end, ") not within [0, ", t, ")"));
  }
  if (!loss_mask.empty() && static_cast<int64_t>(loss_mask.size()) != t) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_mask has ", loss_mask.size(), " entries for ", t, " tokens"));
  }
  auto rows_of = [&](const torch::Tensor& x, const char* name) -> absl::Status {
    if (!x.defined() || x.dim() < 1 || x.size(0) != t) {
      return absl::InvalidArgumentError(absl::StrCat("capture ", name, " has ",
                                                     x.defined() && x.dim() >= 1 ? x.size(0) : -1,
                                                     " rows, ", "expected ", t));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(rows_of(capture.aux_hidden, "aux_hidden"));
  RETURN_IF_ERROR(rows_of(capture.last_hidden, "last_hidden"));
  if (options.keep_target_ids) RETURN_IF_ERROR(rows_of(capture.target_ids, "target_ids"));

  const int64_t n = row_end - row_begin;
  std::vector<NamedTensor> out;
  absl::Status status = CatchTorch("sample tensors", [&] {
    // Elementwise conversion commutes with row slicing, so a slice holds the
    // same bytes as the corresponding rows of the whole sample.
    const torch::Dtype hidden = ToTorchDtype(options.hidden_dtype);
    const torch::Device device = capture.aux_hidden.device();
    const bool on_device = options.on_capture_device && !device.is_cpu();
    // A capture's rows converted to `dtype`, where the options say.
    auto rows = [&](const torch::Tensor& x, torch::Dtype dtype) {
      torch::Tensor slice = x.narrow(0, row_begin, n);
      if (on_device || x.is_cpu()) return slice.to(dtype).contiguous();
      torch::Tensor host =
          torch::empty(slice.sizes(), torch::TensorOptions(dtype).pinned_memory(true));
      host.copy_(slice);
      return host;
    };
    torch::Tensor ids =
        torch::from_blob(const_cast<int32_t*>(input_ids.data() + row_begin), {n}, torch::kInt32)
            .clone();
    torch::Tensor mask = loss_mask.empty()
                             ? torch::ones({n}, torch::kUInt8)
                             : torch::from_blob(const_cast<uint8_t*>(loss_mask.data() + row_begin),
                                                {n}, torch::kUInt8)
                                   .clone();
    if (on_device) {
      ids = ids.to(device);
      mask = mask.to(device);
    }
    out.push_back({"input_ids", std::move(ids)});
    out.push_back({"loss_mask", std::move(mask)});
    out.push_back({"aux_hidden", rows(capture.aux_hidden, hidden)});
    out.push_back({"last_hidden", rows(capture.last_hidden, hidden)});
    if (options.keep_target_ids)
      out.push_back({"target_ids", rows(capture.target_ids, torch::kInt32)});
  });
  if (!status.ok()) return status;
  return out;
}

}  // namespace specstream::teacher
