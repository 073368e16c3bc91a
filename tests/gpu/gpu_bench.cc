// GPU throughput (labels gpu, bench; tests/gpu/run.sh). Every figure is a
// ratio to a baseline measured in the same run on the same GPU:
//   * the peak: a bf16 8192 x 8192 x 8192 matmul (TFLOP/s), the denominator
//     of every MFU below;
//   * the teacher's forward (hf runtime, bf16, captures and target ids, one
//     sequence of 1k and of 4k tokens) against Hugging Face transformers on
//     the same checkpoint, eager and SDPA attention (tests/gpu/hf_reference.py
//     speed; skipped where transformers is not importable), and its MFU;
//   * one EAGLE-3 training step (K = 7, bf16, a draft with Llama-3.1-8B's
//     shapes: hidden 4096, 32/8 heads, MLP 14336, target vocab 128256, draft
//     vocab 32000, 2048 tokens) and its MFU.
// FLOPs are counted from the shapes: 2 per multiply-add of every matmul,
// causal attention at half the score matrix, backward twice the forward.
// Goals (printed, not asserted): teacher >= 1.0 x transformers' best,
// teacher MFU >= 0.4, student MFU >= 0.3. Fails only on an error. Exits 0
// saying "skipped" without a CUDA device.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "common/vocab_map.h"
#include "student/data_source.h"
#include "student/draft_model.h"
#include "student/optimizer.h"
#include "teacher/hf_runtime.h"
#include "tests/testing/tiny_model.h"

namespace specstream {
namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `reps` runs of `fn` after `warmup`, each ended by a
// device sync.
template <typename Fn>
double MedianSeconds(int warmup, int reps, Fn fn) {
  std::vector<double> times;
  for (int i = 0; i < warmup + reps; ++i) {
    torch::cuda::synchronize();
    const auto start = Clock::now();
    fn();
    torch::cuda::synchronize();
    if (i >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double PeakTflops() {
  const auto options = torch::TensorOptions(torch::kBFloat16).device(torch::kCUDA);
  const int64_t n = 8192;
  torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  const double seconds = MedianSeconds(3, 10, [&] { torch::matmul(a, b); });
  return 2.0 * n * n * n / seconds / 1e12;
}

int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// tokens/s of transformers on the checkpoint, or 0 where it cannot run.
double TransformersTokensPerSecond(const std::string& model, int64_t tokens,
                                   const std::string& attention, const std::string& log) {
  const std::string command =
      absl::StrCat(SPECSTREAM_GPU_PYTHON, " ", SPECSTREAM_SOURCE_DIR,
                   "/tests/gpu/hf_reference.py speed --model ", model, " --tokens ", tokens,
                   " --device cuda --dtype bfloat16 --attn ", attention, " >", log, " 2>&1");
  if (Shell(command) != 0) return 0;
  std::FILE* f = std::fopen(log.c_str(), "r");
  double value = 0;
  char line[256];
  while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
    std::sscanf(line, "tokens_per_s %lf", &value);
  }
  if (f != nullptr) std::fclose(f);
  return value;
}

struct TeacherShape {
  int64_t layers = 16, hidden = 2048, heads = 16, kv_heads = 8, intermediate = 5632, vocab = 32000;
};

// FLOPs of the teacher's forward of one sequence of t tokens: every layer's
// projections and MLP, causal attention, and the full-vocab head (target
// ids, as transformers computes its logits).
double TeacherFlops(const TeacherShape& s, int64_t t) {
  const double h = s.hidden, d = s.hidden / s.heads;
  const double qkvo = h * (s.heads * d) * 2 + h * (s.kv_heads * d) * 2;
  const double mlp = 3.0 * h * s.intermediate;
  const double attention = 2.0 * (t / 2.0) * s.heads * d;  // QK^T and PV over half the keys
  return 2.0 * t * (s.layers * (qkvo + mlp + attention) + h * s.vocab);
}

int TeacherBench(double peak, const std::string& dir) {
  const TeacherShape s;
  const std::string model = dir + "/teacher";
  const int init =
      Shell(absl::StrCat(SPECSTREAM_TEACHER_PATH, " init-random --arch llama --layers ", s.layers,
                         " --hidden ", s.hidden, " --heads ", s.heads, " --kv-heads ", s.kv_heads,
                         " --intermediate ", s.intermediate, " --vocab ", s.vocab,
                         " --dtype bfloat16 --out ", model, " >", dir, "/init.log 2>&1"));
  if (init != 0) {
    std::fprintf(stderr, "gpu_bench: init-random failed (%s/init.log)\n", dir.c_str());
    return 1;
  }
  teacher::HfRuntimeOptions options;
  options.model_dir = model;
  options.dtype = "bfloat16";
  options.device = "cuda:0";
  auto runtime = teacher::HfRuntime::Create(options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", runtime.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "\nTeacher forward, %ld layers, hidden %ld, bf16, one sequence, captures + target "
      "ids:\n",
      static_cast<long>(s.layers), static_cast<long>(s.hidden));
  std::printf("%8s %14s %14s %14s %10s %8s\n", "tokens", "ours tok/s", "hf eager", "hf sdpa",
              "vs best", "MFU");
  for (int64_t t : {1024, 4096}) {
    teacher::ForwardRequest request;
    request.want_target_ids = true;
    request.sequences = {testing::RandomTokens(static_cast<int>(t), static_cast<int>(s.vocab), 9)};
    bool ok = true;
    const double seconds =
        MedianSeconds(2, 5, [&] { ok = (*runtime)->Forward(request).ok() && ok; });
    if (!ok) return 1;
    const double ours = t / seconds;
    const double eager = TransformersTokensPerSecond(model, t, "eager", dir + "/hf-eager.log");
    const double sdpa = TransformersTokensPerSecond(model, t, "sdpa", dir + "/hf-sdpa.log");
    const double best = std::max(eager, sdpa);
    const double mfu = TeacherFlops(s, t) / seconds / 1e12 / peak;
    std::printf("%8ld %14.0f %14.0f %14.0f %10.2f %8.3f\n", static_cast<long>(t), ours, eager, sdpa,
                best > 0 ? ours / best : 0.0, mfu);
    std::printf(
        "SUMMARY teacher %ld tokens: %.0f tok/s = %.2f x transformers' best (eager %.0f, "
        "sdpa %.0f; 0: not importable), MFU %.3f (goal >= 1.0 x, MFU >= 0.4)\n",
        static_cast<long>(t), ours, best > 0 ? ours / best : 0.0, eager, sdpa, mfu);
  }
  return 0;
}

struct DraftDims {
  int64_t hidden = 4096, heads = 32, kv_heads = 8, intermediate = 14336, target_vocab = 128256,
          draft_vocab = 32000, tokens = 2048;
  int ttt = 7;
};

// FLOPs of one EAGLE-3 step: per TTT step and token, the projections of the
// 2H-wide attention input, o, the MLP, the draft head and the teacher head
// (fp32, no backward); fc once; TTT attention over half the keys plus the
// diagonals; backward twice the trained forward.
double DraftStepFlops(const DraftDims& s) {
  const double h = s.hidden, d = s.hidden / s.heads, t = s.tokens;
  const double qkv = 2.0 * h * (s.heads + 2 * s.kv_heads) * d;
  const double per_step = qkv + h * h + 3.0 * h * s.intermediate + h * s.draft_vocab;
  double trained = 2.0 * t * (3.0 * h * h);  // fc
  for (int k = 0; k < s.ttt; ++k) {
    trained += 2.0 * t * (per_step + 2.0 * (t / 2.0 + k) * s.heads * d);
  }
  const double teacher_head = 2.0 * t * h * s.draft_vocab;
  return 3.0 * trained + teacher_head;
}

int StudentBench(double peak, const std::string& dir) {
  const DraftDims s;
  // The target checkpoint only lends the draft its embeddings (tied head).
  const int init = Shell(absl::StrCat(
      SPECSTREAM_TEACHER_PATH, " init-random --arch llama --layers 1 --hidden ", s.hidden,
      " --heads ", s.heads, " --kv-heads ", s.kv_heads, " --intermediate 256 --vocab ",
      s.target_vocab, " --dtype bfloat16 --tie-embeddings --out ", dir, "/target >", dir,
      "/init-target.log 2>&1"));
  if (init != 0) {
    std::fprintf(stderr, "gpu_bench: init-random failed (%s/init-target.log)\n", dir.c_str());
    return 1;
  }
  TokenCounter counter(s.target_vocab);
  std::vector<int32_t> ids(s.target_vocab);
  for (int64_t i = 0; i < s.target_vocab; ++i) ids[i] = static_cast<int32_t>(i);
  if (!counter.Add(ids, std::vector<uint8_t>(ids.size(), 1)).ok()) return 1;
  auto map = BuildVocabMap(counter, s.draft_vocab);
  if (!map.ok()) return 1;
  student::DraftShape shape;
  shape.hidden_size = shape.target_hidden_size = s.hidden;
  shape.intermediate_size = s.intermediate;
  shape.num_attention_heads = s.heads;
  shape.num_key_value_heads = s.kv_heads;
  shape.head_dim = s.hidden / s.heads;
  shape.draft_vocab_size = s.draft_vocab;
  shape.target_vocab_size = s.target_vocab;
  shape.max_position_embeddings = 8192;
  const torch::Device cuda("cuda:0");
  auto draft = student::Eagle3Draft::Create(shape, dir + "/target", *map, 1, false, cuda);
  if (!draft.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", draft.status().ToString().c_str());
    return 1;
  }
  for (auto& [name, p] : (*draft)->parameters()) p.mutable_grad() = torch::zeros_like(p);
  student::AdamW optimizer((*draft)->parameters(), student::AdamWOptions{});
  student::TrainingSample sample;
  sample.length = s.tokens;
  sample.input_ids = torch::randint(s.target_vocab, {s.tokens}, torch::kInt64);
  sample.loss_mask = torch::ones({s.tokens}, torch::kUInt8);
  sample.aux_hidden = torch::randn({s.tokens, 3 * s.hidden}).to(torch::kBFloat16);
  sample.last_hidden = torch::randn({s.tokens, s.hidden}).to(torch::kBFloat16);
  sample.target_ids = torch::randint(s.target_vocab, {s.tokens}, torch::kInt64);
  const student::DraftBatch batch = student::ToDevice(student::Collate({sample}, 0), cuda);
  bool ok = true;
  const double seconds = MedianSeconds(2, 5, [&] {
    const torch::Tensor valid = (*draft)->CountValid(batch, s.ttt);
    auto out = (*draft)->Forward(batch, s.ttt, valid, torch::kBFloat16);
    if (!out.ok()) {
      ok = false;
      return;
    }
    out->weighted_loss.backward();
    student::ClipGradNorm((*draft)->parameters(), 0.5);
    optimizer.Step(1e-4);
  });
  if (!ok) return 1;
  const double mfu = DraftStepFlops(s) / seconds / 1e12 / peak;
  std::printf("\nEAGLE-3 step, Llama-3.1-8B shapes, K=%d, %ld tokens, bf16: %.0f tok/s, MFU %.3f\n",
              s.ttt, static_cast<long>(s.tokens), s.tokens / seconds, mfu);
  std::printf(
      "SUMMARY student step (Llama-3.1-8B shapes, K=%d, %ld tokens): %.0f tok/s, MFU %.3f "
      "(goal >= 0.3)\n",
      s.ttt, static_cast<long>(s.tokens), s.tokens / seconds, mfu);
  return 0;
}

int Run() {
  if (!torch::cuda::is_available()) {
    std::printf("gpu_bench: skipped, no CUDA device (tests/gpu/run.sh runs it on a GPU machine)\n");
    return 0;
  }
  const std::string dir = absl::StrCat("/tmp/specstream-gpu-bench-", getpid());
  std::system(absl::StrCat("mkdir -p ", dir).c_str());
  const double peak = PeakTflops();
  std::printf("gpu_bench: bf16 matmul 8192^3: %.0f TFLOP/s (the MFU denominator)\n", peak);
  std::printf("SUMMARY peak: bf16 matmul 8192^3 %.0f TFLOP/s\n", peak);
  int failed = 0;
  {
    torch::NoGradGuard no_grad;
    failed |= TeacherBench(peak, dir);
  }
  failed |= StudentBench(peak, dir);
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  return failed;
}

}  // namespace
}  // namespace specstream

int main() { return specstream::Run(); }
