// hf runtime throughput on a random ~100M-parameter model at 1k tokens,
// against the same model's linear layers timed alone as plain matmuls in the
// same run: fraction = (time of the forward's linear GEMMs alone) / (forward
// time). The forward does those GEMMs and more (attention, norms, rotary,
// activations), so the fraction is at most 1; reps of the two alternate, so
// a slow stretch of a shared machine falls on both. fp32 always; bf16 only
// where the CPU has a bf16 matmul (elsewhere oneDNN emulates it and the row
// would take many minutes to say nothing about our code).
// Fails (exit 1) when the fp32 fraction is under --min-fraction.
//
//   teacher_bench [--tokens 1024] [--reps 5] [--min-fraction 0.4]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "teacher/hf_runtime.h"
#include "teacher/init_random.h"
#include "tests/bench/bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One [m,k]x[k,n] linear of the model: `count` of them in one forward.
struct Gemm {
  int64_t k, n, count;
};

// Random operands for each Gemm at m rows; Time() runs every Gemm `count`
// times and returns the seconds. Weights are reused across a Gemm's count, so
// they stay warmer in cache than the model's: the baseline errs fast.
class LinearBaseline {
 public:
  LinearBaseline(torch::Dtype dtype, int64_t m, std::vector<Gemm> gemms)
      : gemms_(std::move(gemms)) {
    for (const Gemm& g : gemms_) {
      inputs_.push_back(torch::randn({m, g.k}).to(dtype));
      weights_.push_back(torch::randn({g.n, g.k}).to(dtype));
      flops_ += 2.0 * m * g.k * g.n * g.count;
    }
  }
  double Time() const {
    torch::NoGradGuard no_grad;
    auto start = Clock::now();
    for (size_t i = 0; i < gemms_.size(); ++i) {
      for (int64_t c = 0; c < gemms_[i].count; ++c) torch::linear(inputs_[i], weights_[i]);
    }
    return Seconds(start, Clock::now());
  }
  double flops() const { return flops_; }

 private:
  std::vector<Gemm> gemms_;
  std::vector<torch::Tensor> inputs_, weights_;
  double flops_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 1024;
  int reps = 5;
  double min_fraction = 0.4;
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
  // The forward's linears: per layer q, k, v, o, gate, up, down; then the
  // lm_head (target_ids), tied to the embeddings, so these are the parameters.
  const std::vector<Gemm> linears = {{H, A * D, L}, {H, B * D, 2 * L}, {A * D, H, L},
                                     {H, I, 2 * L}, {I, H, L},         {H, V, 1}};
  double params = 0;
  for (const Gemm& g : linears) params += static_cast<double>(g.k) * g.n * g.count;
  std::string dir = (std::filesystem::temp_directory_path() / "specstream-teacher-bench").string();
  std::printf("teacher_bench: %.1fM parameters, %ld tokens, best of %d\n", params / 1e6,
              static_cast<long>(tokens), reps);
  std::printf("%-9s %14s %14s %16s %9s\n", "dtype", "tokens/s", "model GFLOP/s", "linears GFLOP/s",
              "fraction");

  double fp32_fraction = 0;
  for (const char* dtype : {"float32", "bfloat16"}) {
    if (std::string(dtype) == "bfloat16" && !specstream::bench::CpuHasBf16Matmul()) {
      std::printf("%-9s skipped: this CPU has no bf16 matmul (no avx512_bf16 / amx_bf16)\n", dtype);
      continue;
    }
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
    const torch::Dtype torch_dtype =
        std::string(dtype) == "float32" ? torch::kFloat32 : torch::kBFloat16;
    const LinearBaseline baseline(torch_dtype, tokens, linears);
    double best = 1e30, best_baseline = 1e30;
    for (int r = 0; r <= reps; ++r) {  // the first round warms up
      auto start = Clock::now();
      auto out = (*runtime)->Forward(request);
      double s = Seconds(start, Clock::now());
      if (!out.ok()) {
        std::fprintf(stderr, "forward: %s\n", std::string(out.status().message()).c_str());
        return 1;
      }
      double b = baseline.Time();
      if (r > 0) best = std::min(best, s), best_baseline = std::min(best_baseline, b);
    }
    // Matmul FLOPs of the forward: the linears above plus the causal
    // attention (QKᵀ and PV over on average T/2 keys).
    const double T = static_cast<double>(tokens);
    const double flops = baseline.flops() + L * 2.0 * 2.0 * A * D * T * T / 2;
    const double achieved = flops / best;
    const double fraction = best_baseline / best;
    if (std::string(dtype) == "float32") fp32_fraction = fraction;
    std::printf("%-9s %14.0f %14.1f %16.1f %9.2f\n", dtype, T / best, achieved / 1e9,
                baseline.flops() / best_baseline / 1e9, fraction);
  }
  std::filesystem::remove_all(dir);
  if (fp32_fraction < min_fraction) {
    std::printf("teacher_bench: FAIL fp32 fraction %.2f < %.2f\n", fp32_fraction, min_fraction);
    return 1;
  }
  std::printf("teacher_bench: OK fp32 fraction %.2f >= %.2f\n", fp32_fraction, min_fraction);
  return 0;
}
