// Pieces the student benchmarks share: process memory from /proc, a
// synthetic offline store, and the path of the running binary (benchmarks
// re-run themselves as child processes so that each measurement has its own
// peak RSS).
#ifndef SPECSTREAM_TESTS_BENCH_BENCH_UTIL_H_
#define SPECSTREAM_TESTS_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace specstream::bench {

// A "Key:" line of /proc/self/status in kB (VmRSS:, VmHWM:), 0 if absent.
int64_t StatusKb(const char* key);

// CPU tensor memory, counted at LibTorch's CPU allocator: the CPU
// counterpart of torch.cuda.memory_allocated / max_memory_allocated, free of
// the heap fragmentation and allocator caching that RSS also holds.
// InstallTensorMemoryCounter wraps the allocator (once per process, before
// the tensors to be counted exist; tensors made earlier keep their own
// deleter and are not counted). Bytes; 0 until installed.
void InstallTensorMemoryCounter();
int64_t TensorBytesInUse();
int64_t TensorBytesPeak();  // the most in use since the last ResetTensorBytesPeak
void ResetTensorBytesPeak();

// The running executable's path.
std::string SelfExe();

// CPU seconds this process has run, over all its threads
// (CLOCK_PROCESS_CPUTIME_ID). A benchmark that shares the cores with other
// tests compares work per CPU-second: wall time counts the seconds another
// process held the core, CPU time does not.
double ProcessCpuSeconds();

// Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16 in
// /proc/cpuinfo). Without it oneDNN emulates bf16 and is several times
// slower than fp32, so the benchmarks train in fp32 there ("bf16 compute is
// the fast path on CPU" holds only with it; DESIGN.md §8).
bool CpuHasBf16Matmul();
// "bfloat16" where CpuHasBf16Matmul, else "float32".
const char* BenchDtypeName();

struct SyntheticStore {
  int64_t hidden = 0;  // target hidden size
  int64_t vocab = 0;   // target vocab
  int64_t layers = 0;  // target layers (capture ids must be below)
  std::vector<int> capture_layer_ids;
};

// Writes a complete store at `path` holding one sample (id 0) of `length`
// tokens: random ids, full loss mask, random bf16 hidden states and random
// target_ids, seeded by the length. False on any error.
bool WriteSyntheticStore(const std::string& path, const SyntheticStore& shape, int64_t length);

}  // namespace specstream::bench

#endif  // SPECSTREAM_TESTS_BENCH_BENCH_UTIL_H_
