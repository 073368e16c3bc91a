// Conversions between SpecStream's torch-free tensor types (DType,
// safetensors TensorView) and LibTorch tensors, and the shim that turns
// LibTorch's c10::Error into absl::Status.
#ifndef SPECSTREAM_COMMON_TORCH_TENSOR_UTIL_H_
#define SPECSTREAM_COMMON_TORCH_TENSOR_UTIL_H_

#include <functional>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/safetensors.h"

namespace specstream {

torch::Dtype ToTorchDtype(DType dtype);
absl::StatusOr<DType> FromTorchDtype(torch::Dtype dtype);

// Copies a view into a new tensor of `dtype` (the view's own when nullopt)
// on `device`: one copy, straight from the mapped file to the device.
absl::StatusOr<torch::Tensor> TensorFromView(const TensorView& view,
                                             std::optional<torch::Dtype> dtype = std::nullopt,
                                             torch::Device device = torch::kCPU);

// `t` on `device`: itself when already there; from the host to a CUDA
// device through pinned memory without waiting (the copy is ordered before
// later work on the current stream, and the host never blocks on the
// device); otherwise an ordinary copy.
torch::Tensor CopyToDevice(const torch::Tensor& t, torch::Device device);

// "cpu", "cuda", "cuda:N" or "meta" (shape-only tensors, for device checks in
// tests) as a torch::Device. InvalidArgument for anything else (naming
// `what`, e.g. "--devices"); FailedPrecondition for a CUDA device that this
// LibTorch or this machine does not have.
absl::StatusOr<torch::Device> ParseDevice(const std::string& text, const std::string& what);
// The same, the name only: whether this machine has the device is not asked
// (a configuration checked before it reaches its machine, --check-config).
absl::StatusOr<torch::Device> ParseDeviceName(const std::string& text, const std::string& what);

// A non-owning torch view of a TensorView; valid while the view's file lives.
// Read-only by contract (the mapping is PROT_READ).
torch::Tensor BorrowView(const TensorView& view);

// A TensorView of a contiguous CPU tensor (valid while `t` lives).
TensorView ViewOf(std::string name, const torch::Tensor& t);

// Adds a CPU tensor (made contiguous) to a safetensors writer.
absl::Status AddTensor(SafetensorsWriter& writer, const std::string& name,
                       const torch::Tensor& tensor);

// A Status carried through code that can only throw: a LibTorch autograd
// function, or a lambda deep in a forward. CatchTorch gives it back with its
// code (a collective's UNAVAILABLE stays UNAVAILABLE, not INTERNAL).
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

// Throws StatusError(status) unless it is OK.
inline void ThrowIfError(absl::Status status) {
  if (!status.ok()) throw StatusError(std::move(status));
}

// Runs `fn`, converting what it throws into a Status with `context`: a
// StatusError's own (code kept), InvalidArgument for c10::ValueError /
// IndexError, Internal for any other c10::Error / std::exception.
absl::Status CatchTorch(const std::string& context, const std::function<void()>& fn);

// Process-wide: keeps freed tensor memory in the malloc heap instead of
// returning every large block to the kernel (glibc's default mmap threshold
// turns each big temporary into page faults; measured 1.6x on bf16 forward).
// Idempotent; called by the runtimes at creation.
void TuneAllocatorForTensors();

// The number of elements of `t` as a shape vector.
std::vector<int64_t> ShapeOf(const torch::Tensor& t);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TORCH_TENSOR_UTIL_H_
