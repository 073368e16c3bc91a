// The sglang runtime against the hf runtime, in-process, tokens/s of real
// tokens (target_ids included, as a teacher that keeps them serves). Every
// process computes on one thread (main() re-executes itself with
// OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1).
//
// Dense section: one random llama checkpoint (4 layers of hidden 384, MLP
// 1024, fp32: the layers' matmuls dominate) and two batches of about the same
// real tokens:
//   skewed   one sequence of 512 tokens and eight of 51 (10:1): hf pads every
//            row to 512 (4,608 rows computed for 920 real tokens), sglang
//            packs them into 920 rows;
//   uniform  eight sequences of 115 tokens: nothing to pad, so the ratio shows
//            what packing and the fused weights cost or save by themselves.
// The hf runtime on the same batch, timed in the same run (interleaved with
// sglang, best of --reps), is the baseline. On the skewed batch packing can
// win at most hf rows / tokens = 5.0 (measured here: 4.8); fails when sglang
// / hf there is under --min-skewed-ratio (2.0).
//
// The MoE section (MoeSection) times expert-parallel layouts.
//
//   sglang_bench [--reps 5] [--min-skewed-ratio 2.0] [--teacher-bin PATH]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "teacher/init_random.h"
#include "teacher/tp_launcher.h"

namespace {

using Clock = std::chrono::steady_clock;
using specstream::teacher::ForwardRequest;
using specstream::teacher::TargetRuntime;

struct Batch {
  const char* name;
  std::vector<int64_t> lengths;
};

// `lengths` sequences of pseudo-random ids below `vocab`, target_ids wanted.
ForwardRequest MakeRequest(const std::vector<int64_t>& lengths, int64_t vocab) {
  ForwardRequest request;
  request.want_target_ids = true;
  uint64_t state = 7;
  for (int64_t length : lengths) {
    std::vector<int32_t>& ids = request.sequences.emplace_back();
    for (int64_t t = 0; t < length; ++t) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      ids.push_back(static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab)));
    }
  }
  return request;
}

// Best-of-`reps` tokens/s of each runtime on `request` (after one warm-up
// forward each). The runtimes take turns within every rep, so load from
// elsewhere on the machine hits them alike. Empty on a failed forward.
std::vector<double> TokensPerSecond(const std::vector<TargetRuntime*>& runtimes,
                                    const ForwardRequest& request, int reps) {
  int64_t tokens = 0;
  for (const auto& sequence : request.sequences) tokens += static_cast<int64_t>(sequence.size());
  std::vector<double> best(runtimes.size(), 1e30);
  for (int r = 0; r <= reps; ++r) {  // rep 0 warms up
    for (size_t i = 0; i < runtimes.size(); ++i) {
      const auto start = Clock::now();
      auto out = runtimes[i]->Forward(request);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (!out.ok()) {
        std::fprintf(stderr, "sglang_bench: forward: %s\n", out.status().ToString().c_str());
        return {};
      }
      if (r > 0) best[i] = std::min(best[i], seconds);
    }
  }
  std::vector<double> result;
  for (double seconds : best) result.push_back(static_cast<double>(tokens) / seconds);
  return result;
}

// "1x512 + 8x51" for {512, 51, ..., 51}.
std::string LengthsString(const std::vector<int64_t>& lengths) {
  std::string out;
  for (size_t i = 0; i < lengths.size();) {
    size_t j = i;
    while (j < lengths.size() && lengths[j] == lengths[i]) ++j;
    absl::StrAppend(&out, out.empty() ? "" : " + ", j - i, "x", lengths[i]);
    i = j;
  }
  return out;
}

// The benchmarks' random fp32 target in `out`: 4 layers, hidden 384, 6
// heads over 2 kv heads, vocab 4000, the given MLP (or expert) size and, for
// MoE archs, experts and top-k. nullopt (reported) on failure.
std::optional<specstream::teacher::InitRandomOptions> WriteBenchModel(const std::string& arch,
                                                                      const std::string& out,
                                                                      int64_t intermediate,
                                                                      int64_t experts = 0,
                                                                      int64_t top_k = 0) {
  specstream::teacher::InitRandomOptions init;
  init.arch = arch;
  init.layers = 4;
  init.hidden = 384;
  init.heads = 6;
  init.kv_heads = 2;
  init.intermediate = intermediate;
  init.experts = experts;
  init.top_k = top_k;
  init.vocab = 4000;
  init.dtype = "float32";
  init.out = out;
  if (absl::Status s = specstream::teacher::WriteRandomCheckpoint(init); !s.ok()) {
    std::fprintf(stderr, "sglang_bench: init-random: %s\n", s.ToString().c_str());
    return std::nullopt;
  }
  return init;
}

// Dense hf vs sglang; false on an error or when the skewed ratio misses
// `min_skewed_ratio`.
bool DenseSection(const std::string& dir, int reps, double min_skewed_ratio) {
  const auto written = WriteBenchModel("llama", dir + "/dense", 1024);
  if (!written) return false;
  const specstream::teacher::InitRandomOptions& init = *written;
  std::vector<std::unique_ptr<specstream::teacher::TensorParallelRuntime>> owned;
  std::vector<TargetRuntime*> runtimes;
  for (const char* name : {"hf", "sglang"}) {
    specstream::teacher::TargetRuntimeOptions options;
    options.model_dir = init.out;
    options.dtype = "float32";
    options.capture_layer_ids = {0, 1, 2};  // below 8 layers the default ids collide
    auto runtime = specstream::teacher::CreateTargetRuntime(name, options);
    if (!runtime.ok()) {
      std::fprintf(stderr, "sglang_bench: %s: %s\n", name, runtime.status().ToString().c_str());
      return false;
    }
    runtimes.push_back(runtime->get());
    owned.push_back(std::move(*runtime));
  }

  std::printf(
      "sglang_bench: dense llama, %ld layers, hidden %ld, heads %ld/%ld, MLP %ld, vocab %ld, "
      "fp32, target_ids, best of %d\n",
      static_cast<long>(init.layers), static_cast<long>(init.hidden), static_cast<long>(init.heads),
      static_cast<long>(init.kv_heads), static_cast<long>(init.intermediate),
      static_cast<long>(init.vocab), reps);
  std::printf("%-8s %-14s %6s %10s %12s %16s %10s\n", "batch", "lengths", "tokens", "hf rows",
              "hf tokens/s", "sglang tokens/s", "sglang/hf");
  std::vector<int64_t> skewed = {512};
  skewed.insert(skewed.end(), 8, 51);
  const std::vector<Batch> batches = {{"skewed", skewed},
                                      {"uniform", std::vector<int64_t>(8, 115)}};
  std::vector<double> ratios;
  for (const Batch& batch : batches) {
    const ForwardRequest request = MakeRequest(batch.lengths, init.vocab);
    const std::vector<double> tps = TokensPerSecond(runtimes, request, reps);
    if (tps.empty()) return false;
    int64_t tokens = 0, longest = 0;
    for (int64_t length : batch.lengths) {
      tokens += length;
      longest = std::max(longest, length);
    }
    ratios.push_back(tps[1] / tps[0]);
    std::printf("%-8s %-14s %6ld %10ld %12.0f %16.0f %10.2f\n", batch.name,
                LengthsString(batch.lengths).c_str(), static_cast<long>(tokens),
                static_cast<long>(longest * static_cast<int64_t>(batch.lengths.size())), tps[0],
                tps[1], ratios.back());
  }
  const double skewed_ratio = ratios[0];
  const bool ok = skewed_ratio >= min_skewed_ratio;
  std::printf("sglang_bench: %s skewed sglang/hf %.2f %s %.2f\n", ok ? "OK" : "FAIL", skewed_ratio,
              ok ? ">=" : "<", min_skewed_ratio);
  return ok;
}

// MoE: the sglang runtime on a random mixtral checkpoint at TP 1, TP 2 with
// EP 1 (every rank holds every expert's half intermediate, one all-reduce)
// and TP 2 with EP 2 (each rank holds half the experts whole, all-to-all
// dispatch and combine), TP ranks as worker processes as `--tp 2 [--ep 2]`
// starts them. The TP 1 run is the baseline;
// fails on an error or when a layout's captures differ from TP 1 (1e-4
// relative), never on speed (EP's all-to-all traffic on two shared cores
// says little about GPUs).
bool MoeSection(const std::string& dir, const std::string& teacher_bin, int reps) {
  const auto written = WriteBenchModel("mixtral", dir + "/moe", 512, /*experts=*/8, /*top_k=*/2);
  if (!written) return false;
  const specstream::teacher::InitRandomOptions& init = *written;
  struct Layout {
    const char* name;
    int tp, ep;
  };
  const std::vector<Layout> layouts = {{"tp1", 1, 1}, {"tp2 ep1", 2, 1}, {"tp2 ep2", 2, 2}};
  std::vector<std::unique_ptr<specstream::teacher::LaunchedRuntime>> launched;
  std::vector<TargetRuntime*> runtimes;
  for (const Layout& layout : layouts) {
    specstream::teacher::RuntimeSpec spec;
    spec.runtime = "sglang";
    spec.model_dir = init.out;
    spec.dtype = "float32";
    spec.capture_layer_ids = {0, 1, 2};
    spec.devices.assign(layout.tp, "cpu");
    spec.ep_size = layout.ep;
    spec.worker_executable = teacher_bin;
    auto runtime = specstream::teacher::LaunchRuntime(spec);
    if (!runtime.ok()) {
      std::fprintf(stderr, "sglang_bench: %s: %s\n", layout.name,
                   runtime.status().ToString().c_str());
      return false;
    }
    runtimes.push_back(&(*runtime)->runtime());
    launched.push_back(std::move(*runtime));
  }
  const ForwardRequest request = MakeRequest(std::vector<int64_t>(8, 256), init.vocab);
  // Same captures in every layout before timing them.
  std::vector<std::vector<specstream::teacher::SequenceCapture>> captures;
  for (TargetRuntime* runtime : runtimes) {
    auto out = runtime->Forward(request);
    if (!out.ok()) {
      std::fprintf(stderr, "sglang_bench: MoE forward: %s\n", out.status().ToString().c_str());
      return false;
    }
    captures.push_back(std::move(*out));
  }
  std::vector<double> differences = {0.0};
  for (size_t i = 1; i < captures.size(); ++i) {
    double worst = 0;
    for (size_t s = 0; s < request.sequences.size(); ++s) {
      const torch::Tensor& want = captures[0][s].aux_hidden;
      const double scale = std::max(want.abs().max().item<double>(), 1.0);
      worst =
          std::max(worst, (captures[i][s].aux_hidden - want).abs().max().item<double>() / scale);
    }
    differences.push_back(worst);
  }
  const std::vector<double> tps = TokensPerSecond(runtimes, request, reps);
  if (tps.empty()) return false;
  std::printf(
      "\nsglang_bench: MoE mixtral, %ld layers, hidden %ld, %ld experts of %ld, top-%ld, fp32, "
      "8x256 tokens, one thread per TP rank, best of %d\n",
      static_cast<long>(init.layers), static_cast<long>(init.hidden),
      static_cast<long>(init.experts), static_cast<long>(init.intermediate),
      static_cast<long>(init.top_k), reps);
  std::printf("%-8s %12s %10s %22s\n", "layout", "tokens/s", "vs tp1", "max rel diff vs tp1");
  bool ok = true;
  for (size_t i = 0; i < layouts.size(); ++i) {
    std::printf("%-8s %12.0f %10.2f %22.2e\n", layouts[i].name, tps[i], tps[i] / tps[0],
                differences[i]);
    ok = ok && differences[i] <= 1e-4;
  }
  std::printf("sglang_bench: MoE EP2 / EP1 at tp2: %.2f\n", tps[2] / tps[1]);
  for (auto& runtime : launched) {
    if (absl::Status s = runtime->Shutdown(); !s.ok()) {
      std::fprintf(stderr, "sglang_bench: shutdown: %s\n", s.ToString().c_str());
      ok = false;
    }
  }
  if (!ok) std::printf("sglang_bench: FAIL MoE layouts disagree\n");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  // One compute thread per process (TP workers inherit it), so that TP 2 is
  // two cores against TP 1's one. OpenBLAS sizes its pool when it loads, so
  // the variables must be set before the process starts: re-exec once.
  if (getenv("SPECSTREAM_SGLANG_BENCH_CHILD") == nullptr) {
    setenv("SPECSTREAM_SGLANG_BENCH_CHILD", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
    std::perror("sglang_bench: re-exec");
    return 1;
  }
  int reps = 5;
  double min_skewed_ratio = 2.0;
  std::string teacher_bin = SPECSTREAM_TEACHER_PATH;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--teacher-bin")) teacher_bin = argv[i + 1];
    if (!std::strcmp(argv[i], "--min-skewed-ratio")) min_skewed_ratio = std::atof(argv[i + 1]);
  }
  specstream::LoggingOptions logging;
  logging.role = "bench";
  logging.level = "warn";
  specstream::InitLogging(logging);
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("specstream-sglang-bench-", getpid()))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  const bool dense = DenseSection(dir, reps, min_skewed_ratio);
  const bool moe = MoeSection(dir, teacher_bin, reps);
  const bool ok = dense && moe;
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
