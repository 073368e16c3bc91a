// hf runtime throughput on a random ~100M-parameter model at 1k tokens, as a
// fraction of plain matmul FLOP/s measured in the same run, for fp32 and
// bf16. Fails (exit 1) when the fp32 fraction is under kMinFraction.
//
//   teacher_bench [--tokens 1024] [--reps 3] [--min-fraction 0.5]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "teacher/hf_runtime.h"
#include "teacher/init_random.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best-of-reps FLOP/s of [m,k]x[k,n] matmuls in `dtype` (the baseline).
double MatmulFlops(torch::Dtype dtype, int64_t m, int64_t k, int64_t n, int reps) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({m, k}).to(dtype), b = torch::randn({n, k}).to(dtype);
  torch::linear(a, b);  // warm up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    for (int i = 0; i < 4; ++i) torch::linear(a, b);
    best = std::min(best, Seconds(start, Clock::now()) / 4);
  }
  return 2.0 * m * k * n / best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 1024;
  int reps = 3;
  double min_fraction = 0.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--min-fraction")) min_fraction = std::atof(argv[i + 1]);
  }
  specstream::LoggingOptions logging;
  logging.role = "bench";
  logging.level = "warn";
  specstream::InitLogging(logging);

  // ~100M parameters: 12 layers of hidden 768, GQA 12/4 heads, MLP 2048,
  // vocab 32000 with tied embeddings.
  const int64_t L = 12, H = 768, A = 12, B = 4, I = 2048, V = 32000, D = H / A;
  const double layer_params = H * A * D + 2.0 * H * B * D + A * D * H + 3.0 * H * I;
  const double params = L * layer_params + V * H;
  std::string dir = (std::filesystem::temp_directory_path() / "specstream-teacher-bench").string();
  std::printf("teacher_bench: %.1fM parameters, %ld tokens, best of %d\n", params / 1e6,
              static_cast<long>(tokens), reps);
  std::printf("%-9s %14s %14s %16s %9s\n", "dtype", "tokens/s", "model GFLOP/s", "matmul GFLOP/s",
              "fraction");

  double fp32_fraction = 0;
  for (const char* dtype : {"float32", "bfloat16"}) {
    specstream::teacher::InitRandomOptions init;
    init.arch = "llama";
    init.layers = L;
    init.hidden = H;
    init.heads = A;
    init.kv_heads = B;
    init.intermediate = I;
    init.vocab = V;
    init.tie_embeddings = true;
    init.dtype = dtype;
    init.out = dir;
    if (auto s = specstream::teacher::WriteRandomCheckpoint(init); !s.ok()) {
      std::fprintf(stderr, "init-random: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    specstream::teacher::HfRuntimeOptions options;
    options.model_dir = dir;
    options.dtype = dtype;
    auto runtime = specstream::teacher::HfRuntime::Create(options);
    if (!runtime.ok()) {
      std::fprintf(stderr, "load: %s\n", std::string(runtime.status().message()).c_str());
      return 1;
    }
    specstream::teacher::ForwardRequest request;
    request.want_target_ids = true;
    request.sequences.emplace_back();
    for (int64_t t = 0; t < tokens; ++t) {
      request.sequences[0].push_back(static_cast<int32_t>((t * 7919) % V));
    }
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {  // the first run warms up
      auto start = Clock::now();
      auto out = (*runtime)->Forward(request);
      double s = Seconds(start, Clock::now());
      if (!out.ok()) {
        std::fprintf(stderr, "forward: %s\n", std::string(out.status().message()).c_str());
        return 1;
      }
      if (r > 0) best = std::min(best, s);
    }
    // Matmul FLOPs per token: the layers, the lm_head (target_ids), and the
    // causal attention (QKᵀ and PV over on average T/2 keys).
    const double T = static_cast<double>(tokens);
    const double flops =
        2.0 * T * L * layer_params + 2.0 * T * V * H + L * 2.0 * 2.0 * A * D * T * T / 2;
    const torch::Dtype torch_dtype =
        std::string(dtype) == "float32" ? torch::kFloat32 : torch::kBFloat16;
    const double baseline = MatmulFlops(torch_dtype, tokens, H, I, reps);
    const double achieved = flops / best;
    const double fraction = achieved / baseline;
    if (std::string(dtype) == "float32") fp32_fraction = fraction;
    std::printf("%-9s %14.0f %14.1f %16.1f %9.2f\n", dtype, T / best, achieved / 1e9,
                baseline / 1e9, fraction);
  }
  std::filesystem::remove_all(dir);
  if (fp32_fraction < min_fraction) {
    std::printf("teacher_bench: FAIL fp32 fraction %.2f < %.2f\n", fp32_fraction, min_fraction);
    return 1;
  }
  std::printf("teacher_bench: OK fp32 fraction %.2f >= %.2f\n", fp32_fraction, min_fraction);
  return 0;
}
