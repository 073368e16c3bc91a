#include "tests/bench/bench_util.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>

#include "c10/core/CPUAllocator.h"
#include "common/offline_store.h"
#include "common/torch/compat.h"
#include "common/torch/tensor_util.h"
#include "teacher/dump.h"

namespace specstream::bench {
namespace {

// Wraps LibTorch's CPU allocator and keeps each live block's size, so that
// the bytes in use and their high-water mark are exact.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base)
      : base_(base), base_deleter_(base->raw_deleter()) {}

#if SPECSTREAM_TORCH_2
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  static CountingCpuAllocator* instance;
  std::mutex mu;
  std::unordered_map<void*, size_t> sizes;  // live blocks
  int64_t in_use = 0, peak = 0;

 private:
  c10::DataPtr Allocate(size_t n) const {
    void* data = base_->raw_allocate(n);
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(instance->mu);
      instance->sizes[data] = n;
      instance->in_use += static_cast<int64_t>(n);
      instance->peak = std::max(instance->peak, instance->in_use);
    }
    return {data, data, &Free, c10::Device(c10::DeviceType::CPU)};
  }
  static void Free(void* data) {
    if (data == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(instance->mu);
      auto it = instance->sizes.find(data);
      if (it != instance->sizes.end()) {
        instance->in_use -= static_cast<int64_t>(it->second);
        instance->sizes.erase(it);
      }
    }
    instance->base_deleter_(data);
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_deleter_;
};
CountingCpuAllocator* CountingCpuAllocator::instance = nullptr;

}  // namespace

void InstallTensorMemoryCounter() {
  if (CountingCpuAllocator::instance != nullptr) return;
  CountingCpuAllocator::instance = new CountingCpuAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(CountingCpuAllocator::instance, /*priority=*/100);
}

int64_t TensorBytesInUse() {
  if (CountingCpuAllocator::instance == nullptr) return 0;
  std::lock_guard<std::mutex> lock(CountingCpuAllocator::instance->mu);
  return CountingCpuAllocator::instance->in_use;
}

int64_t TensorBytesPeak() {
  if (CountingCpuAllocator::instance == nullptr) return 0;
  std::lock_guard<std::mutex> lock(CountingCpuAllocator::instance->mu);
  return CountingCpuAllocator::instance->peak;
}

void ResetTensorBytesPeak() {
  if (CountingCpuAllocator::instance == nullptr) return;
  std::lock_guard<std::mutex> lock(CountingCpuAllocator::instance->mu);
  CountingCpuAllocator::instance->peak = CountingCpuAllocator::instance->in_use;
}

bool CpuHasBf16Matmul() {
  static const bool has = [] {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("flags", 0) == 0) {
        return line.find(" avx512_bf16") != std::string::npos ||
               line.find(" amx_bf16") != std::string::npos;
      }
    }
    return false;
  }();
  return has;
}

const char* BenchDtypeName() { return CpuHasBf16Matmul() ? "bfloat16" : "float32"; }

int64_t StatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key));
  }
  return 0;
}

std::string SelfExe() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return std::string(self, n > 0 ? n : 0);
}

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

bool WriteSyntheticStore(const std::string& path, const SyntheticStore& shape, int64_t length) {
  teacher::ModelDescription model;
  model.model_type = "llama";
  model.hidden_size = shape.hidden;
  model.vocab_size = shape.vocab;
  model.num_layers = shape.layers;
  model.capture_layer_ids = shape.capture_layer_ids;
  auto writer = StoreWriter::Open(path, teacher::DumpContract(model, true, DType::kBF16));
  if (!writer.ok()) return false;
  const int64_t captures = static_cast<int64_t>(shape.capture_layer_ids.size());
  torch::manual_seed(length);
  torch::Tensor ids = torch::randint(shape.vocab, {length}, torch::kInt32);
  torch::Tensor mask = torch::ones({length}, torch::kUInt8);
  torch::Tensor aux = torch::randn({length, captures * shape.hidden}).to(torch::kBFloat16);
  torch::Tensor last = torch::randn({length, shape.hidden}).to(torch::kBFloat16);
  torch::Tensor target = torch::randint(shape.vocab, {length}, torch::kInt32);
  if (!(*writer)
           ->Add(0, {ViewOf("input_ids", ids), ViewOf("loss_mask", mask), ViewOf("aux_hidden", aux),
                     ViewOf("last_hidden", last), ViewOf("target_ids", target)})
           .ok()) {
    return false;
  }
  return (*writer)->Finish().ok();
}

}  // namespace specstream::bench
