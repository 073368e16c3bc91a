#include "tests/testing/device_audit.h"

#include <ATen/ExpandUtils.h>
#include <ATen/record_function.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specstream::testing {
namespace {

thread_local DeviceAudit* current = nullptr;

void Collect(const c10::IValue& value, std::vector<const at::Tensor*>& out) {
  if (value.isTensor()) {
    out.push_back(&value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) Collect(item, out);
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) Collect(item, out);
  }
}

// The ops that move data between devices on purpose.
bool IsTransfer(const char* name) {
  static const std::set<std::string> kTransfers = {"aten::to", "aten::_to_copy", "aten::copy_",
                                                   "aten::_copy_from",
                                                   "aten::_copy_from_and_resize"};
  return kTransfers.count(name) > 0;
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  if (current == nullptr) return nullptr;
  current->Count();
  if (IsTransfer(fn.name())) return nullptr;
  std::vector<const at::Tensor*> tensors;
  for (const c10::IValue& input : fn.inputs()) Collect(input, tensors);
  std::set<std::string> devices;
  std::vector<std::string> shown;
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (t->device().is_cpu() && t->dim() == 0) continue;  // a scalar
    const std::string device = t->device().str();
    if (devices.insert(device).second) {
      shown.push_back(absl::StrCat(device, " [", absl::StrJoin(t->sizes(), ", "), "]"));
    }
  }
  if (devices.size() > 1) {
    current->Record(absl::StrCat(fn.name(), ": ", absl::StrJoin(shown, ", ")));
  }
  return nullptr;
}

// Shape-only kernels for ops whose meta kernels LibTorch registers from
// Python (torch/_meta_registrations.py), so a C++ program has none: without
// them the runtimes' forward cannot run on meta at all. Test-only.
at::Tensor MetaIndexSelect(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  std::vector<int64_t> sizes = self.sizes().vec();
  if (dim < 0) dim += self.dim();
  sizes[dim] = index.numel();
  return at::empty(sizes, self.options());
}

at::Tensor MetaWhere(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  std::vector<int64_t> sizes = at::infer_size(condition.sizes(), self.sizes());
  sizes = at::infer_size(sizes, other.sizes());
  return at::empty(sizes, self.options().dtype(at::result_type(self, other)));
}

at::Tensor& MetaWhereOut(const at::Tensor& condition, const at::Tensor& self,
                         const at::Tensor& other, at::Tensor& out) {
  std::vector<int64_t> sizes = at::infer_size(condition.sizes(), self.sizes());
  out.resize_(at::infer_size(sizes, other.sizes()));
  return out;
}

// logsumexp masks infinite maxima with abs() == inf.
at::Tensor& MetaAbsOut(const at::Tensor& self, at::Tensor& out) {
  out.resize_(self.sizes());
  return out;
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("abs.out", &MetaAbsOut);
  m.impl("index_select", &MetaIndexSelect);
  m.impl("where.self", &MetaWhere);
  m.impl("where.self_out", &MetaWhereOut);
}

}  // namespace

DeviceAudit::DeviceAudit() {
  current = this;
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&OnStart).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

DeviceAudit::~DeviceAudit() {
  at::removeCallback(handle_);
  current = nullptr;
}

}  // namespace specstream::testing
