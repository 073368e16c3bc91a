#include "common/torch/tensor_util.h"

#include <malloc.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specstream {

torch::Dtype ToTorchDtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return torch::kFloat32;
    case DType::kF16:
      return torch::kFloat16;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kI64:
      return torch::kInt64;
    case DType::kI32:
      return torch::kInt32;
    case DType::kU8:
      return torch::kUInt8;
    case DType::kBool:
      return torch::kBool;
  }
  return torch::kFloat32;
}

absl::StatusOr<DType> FromTorchDtype(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return DType::kF32;
    case torch::kFloat16:
      return DType::kF16;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kInt64:
      return DType::kI64;
    case torch::kInt32:
      return DType::kI32;
    case torch::kUInt8:
      return DType::kU8;
    case torch::kBool:
      return DType::kBool;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor dtype ", c10::toString(dtype), " has no safetensors name"));
  }
}

torch::Tensor BorrowView(const TensorView& view) {
  // from_blob needs a non-const pointer; nothing writes through it.
  return torch::from_blob(const_cast<uint8_t*>(view.data), view.shape,
                          torch::TensorOptions().dtype(ToTorchDtype(view.dtype)));
}

absl::StatusOr<torch::Tensor> TensorFromView(const TensorView& view,
                                             std::optional<torch::Dtype> dtype,
                                             torch::Device device) {
  torch::Tensor out;
  absl::Status status = CatchTorch(absl::StrCat("tensor ", view.name), [&] {
    torch::Tensor borrowed = BorrowView(view);
    out = borrowed.to(device, dtype.value_or(borrowed.scalar_type()), /*non_blocking=*/false,
                      /*copy=*/true);
  });
  if (!status.ok()) return status;
  return out;
}

torch::Tensor CopyToDevice(const torch::Tensor& t, torch::Device device) {
  if (t.device() == device) return t;
  if (device.is_cuda() && t.is_cpu()) return t.pin_memory().to(device, /*non_blocking=*/true);
  return t.to(device);
}

absl::StatusOr<torch::Device> ParseDeviceName(const std::string& text, const std::string& what) {
  const bool known = text == "cpu" || text == "meta" || text == "cuda" ||
                     (text.rfind("cuda:", 0) == 0 && text.size() > 5 &&
                      text.find_first_not_of("0123456789", 5) == std::string::npos);
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown device \"", text, "\" (expected cpu, cuda or cuda:N)"));
  }
  return torch::Device(text);
}

absl::StatusOr<torch::Device> ParseDevice(const std::string& text, const std::string& what) {
  ASSIGN_OR_RETURN(torch::Device device, ParseDeviceName(text, what));
  if (device.is_cuda()) {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": \"", text,
                       "\" needs CUDA: this LibTorch is a CPU build or sees no CUDA device"));
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (device.has_index() && device.index() >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": \"", text, "\" but only ", count, " CUDA device(s) are visible"));
    }
  }
  return device;
}

TensorView ViewOf(std::string name, const torch::Tensor& t) {
  TensorView view;
  view.name = std::move(name);
  view.dtype = FromTorchDtype(t.scalar_type()).value_or(DType::kU8);
  view.shape = ShapeOf(t);
  view.data = static_cast<const uint8_t*>(t.data_ptr());
  view.nbytes = t.nbytes();
  return view;
}

absl::Status AddTensor(SafetensorsWriter& writer, const std::string& name,
                       const torch::Tensor& tensor) {
  auto dtype = FromTorchDtype(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status();
  torch::Tensor cpu = tensor.to(torch::kCPU).contiguous();
  return writer.Add(name, *dtype, ShapeOf(cpu), cpu.data_ptr(), cpu.nbytes());
}

absl::Status CatchTorch(const std::string& context, const std::function<void()>& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const StatusError& e) {
    return Annotate(e.status(), context);
  } catch (const c10::ValueError& e) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const c10::IndexError& e) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  }
}

void TuneAllocatorForTensors() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum
    mallopt(M_TRIM_THRESHOLD, 1 << 30);   // keep up to 1 GiB free
    mallopt(M_TOP_PAD, 64 << 20);
    return true;
  }();
  (void)done;
}

std::vector<int64_t> ShapeOf(const torch::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

}  // namespace specstream
