// TttAttention forward + backward at T = 1k, 2k, 4k, 8k (B=1, Hq=8, Hkv=8,
// D=128, S=6, fp32): time, effective FLOP/s as a fraction of plain fp32 matmul
// FLOP/s measured in the same run, and the extra peak memory of one
// forward + backward. Each length runs in a fresh child process (this binary
// re-executed with --child), so VmHWM belongs to that length alone.
// Fails (exit 1) when memory grows super-linearly: extra memory at the longest
// length over that at the shortest above kMaxMemorySlack times the length
// ratio (12× for 1k → 8k, where linear is 8× and quadratic 64×).
//
//   ttt_attention_bench [--lengths 1024,2048,4096,8192] [--block 128] [--reps 1]
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "student/ttt_attention.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kHeads = 8, kKvHeads = 8, kHeadDim = 128, kSteps = 6;
constexpr double kMaxMemorySlack = 1.5;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A field of /proc/self/status in bytes (VmRSS, VmHWM), -1 if absent.
int64_t StatusBytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t len = std::strlen(field);
  while (std::getline(status, line)) {
    if (line.compare(0, len, field) == 0 && line[len] == ':') {
      return std::atoll(line.c_str() + len + 1) * 1024;  // reported in kB
    }
  }
  return -1;
}

// Best-of-reps FLOP/s of a [m,k]x[k,n] fp32 matmul (the baseline).
double MatmulFlops(int64_t m, int64_t k, int64_t n, int reps) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({m, k}), b = torch::randn({k, n});
  torch::matmul(a, b);  // warm up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    for (int i = 0; i < 4; ++i) torch::matmul(a, b);
    best = std::min(best, Seconds(start, Clock::now()) / 4);
  }
  return 2.0 * m * k * n / best;
}

// Child: one length; prints "seconds extra_bytes".
int RunChild(int64_t t, int64_t block, int reps) {
  torch::manual_seed(0);
  auto make = [](std::vector<int64_t> shape) { return torch::randn(shape).requires_grad_(); };
  torch::Tensor q = make({1, kHeads, t, kHeadDim});
  torch::Tensor k0 = make({1, kKvHeads, t, kHeadDim}), v0 = make({1, kKvHeads, t, kHeadDim});
  torch::Tensor kd = make({kSteps, 1, kKvHeads, t, kHeadDim});
  torch::Tensor vd = make({kSteps, 1, kKvHeads, t, kHeadDim});
  torch::Tensor weight = torch::randn({1, kHeads, t, kHeadDim});
  const specstream::student::TttAttentionOptions options{1.0 / std::sqrt(double{kHeadDim}), block};
  const int64_t rss_before = StatusBytes("VmRSS");
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    torch::Tensor out = specstream::student::TttAttention(q, k0, v0, kd, vd, options);
    auto grads = torch::autograd::grad({(out * weight).sum()}, {q, k0, v0, kd, vd});
    best = std::min(best, Seconds(start, Clock::now()));
  }
  const int64_t extra = StatusBytes("VmHWM") - rss_before;
  std::printf("%.6f %lld\n", best, static_cast<long long>(extra));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {1024, 2048, 4096, 8192};
  int64_t block = 128;
  int reps = 1;
  int64_t child_t = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--block")) block = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--child")) child_t = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--lengths")) {
      lengths.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) lengths.push_back(std::stoll(item));
    }
  }
  if (child_t > 0) return RunChild(child_t, block, reps);

  const double matmul = MatmulFlops(1024, kHeadDim, 1024, 3);
  std::printf("fp32 matmul baseline: %.1f GFLOP/s\n", matmul / 1e9);
  std::printf("%7s %10s %14s %9s %14s %12s\n", "T", "fwd+bwd s", "eff. GFLOP/s", "fraction",
              "extra MiB", "MiB/1k tok");
  // popen runs a shell, for which /proc/self/exe would be the shell itself.
  std::error_code error;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  if (error) {
    std::fprintf(stderr, "cannot resolve /proc/self/exe: %s\n", error.message().c_str());
    return 1;
  }
  std::vector<double> extras;
  for (int64_t t : lengths) {
    const std::string command = "'" + self + "' --child " + std::to_string(t) + " --block " +
                                std::to_string(block) + " --reps " + std::to_string(reps);
    FILE* pipe = popen(command.c_str(), "r");
    double seconds = 0;
    long long extra = 0;
    if (pipe == nullptr || std::fscanf(pipe, "%lf %lld", &seconds, &extra) != 2) {
      std::fprintf(stderr, "child for T=%lld failed\n", static_cast<long long>(t));
      if (pipe != nullptr) pclose(pipe);
      return 1;
    }
    if (pclose(pipe) != 0) {
      std::fprintf(stderr, "child for T=%lld exited non-zero\n", static_cast<long long>(t));
      return 1;
    }
    // Per head, the causal half of each [T,D]x[D,T]-sized product costs
    // T²·D: QKᵀ and PV forward, then QKᵀ again, PᵀdO, dO·Vᵀ, dS·K and dSᵀ·Q
    // backward (diagonals ignored).
    const double flops = 7.0 * static_cast<double>(t) * t * kHeadDim * kHeads;
    const double mib = static_cast<double>(extra) / (1 << 20);
    extras.push_back(mib);
    std::printf("%7lld %10.3f %14.1f %9.3f %14.1f %12.2f\n", static_cast<long long>(t), seconds,
                flops / seconds / 1e9, flops / seconds / matmul, mib, mib / (t / 1024.0));
  }
  if (extras.size() >= 2 && extras.front() > 0) {
    const double ratio = extras.back() / extras.front();
    const double length_ratio = static_cast<double>(lengths.back()) / lengths.front();
    const double limit = kMaxMemorySlack * length_ratio;
    std::printf("extra memory ratio %.2f for %.0fx the length (limit %.1f)\n", ratio, length_ratio,
                limit);
    if (ratio > limit) {
      std::fflush(stdout);
      std::fprintf(stderr, "FAIL: memory grows super-linearly with T\n");
      return 1;
    }
  }
  return 0;
}
