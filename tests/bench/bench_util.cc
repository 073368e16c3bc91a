#include "tests/bench/bench_util.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/offline_store.h"
#include "common/torch/tensor_util.h"
#include "teacher/dump.h"

namespace specstream::bench {

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
