// Draft training throughput and peak memory against sequence length, for a
// draft with hidden 1024 (8 heads of 128, MLP 2816) trained from a synthetic
// store. Each length runs in a fresh child process so peak RSS (VmHWM) is
// its own. Reports tokens/s, the training step's FLOPs per CPU-second as a
// fraction of plain bf16 matmul's FLOPs per CPU-second measured in the same
// run (CPU time, not wall: CI runs this beside other tests, and a core the
// other process holds stops neither clock's baseline nor the step's), and
// the extra memory over the process baseline; fails when that fraction
// exceeds 1 (a wrong FLOP count or baseline) or memory grows super-linearly
// (the longest length's extra memory over the shortest's > 1.5 × their
// length ratio).
//
// --draft eagle3 (default) trains EAGLE-3 with K TTT steps and a draft
// vocab; dflash / dspark train one-layer block drafts (blocks of 16 / 7,
// 512 anchors, the target's full 32000-token vocab). A block draft's work
// is mostly its N·bs block tokens (fixed once a sequence has 512 anchors)
// plus attention to the context before each anchor (growing with length).
//
//   student_bench [--draft eagle3|dflash|dspark] [--lengths 1024,2048,4096,8192] [--ttt 2]
//                 [--draft-vocab 8000]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/offline_store.h"
#include "common/torch/tensor_util.h"
#include "student/trainer.h"
#include "teacher/dump.h"
#include "teacher/init_random.h"
#include "tests/bench/bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kHidden = 1024, kVocab = 32000, kLayers = 8, kIntermediate = 2816;
constexpr int64_t kDflashBlock = 16, kDsparkBlock = 7, kAnchors = 512, kMarkovRank = 256;

// Child: set up, train 2 steps on one sample of `length` tokens, print
// "length tokens_per_s extra_mib".
int RunChild(const std::string& dir, int64_t length, int ttt, int64_t draft_vocab,
             const std::string& draft) {
  specstream::student::TrainerConfig c;
  if (draft != "eagle3") {
    c.draft_type = draft;
    c.block.block_size = draft == "dflash" ? kDflashBlock : kDsparkBlock;
    c.block.loss_decay_gamma = draft == "dflash" ? 7 : 4;
    c.block.num_anchors = kAnchors;
    c.block.target_layer_ids = {1, 3, 4};
    c.mask_token_id = kVocab - 1;
  }
  c.store = dir + "/store-" + std::to_string(length);
  c.target_dir = dir + "/target";
  c.draft_vocab_size = draft_vocab;
  c.intermediate_size = kIntermediate;
  c.max_steps = 2;
  c.batch_size = 1;
  c.ttt_steps = ttt;
  c.dtype = specstream::bench::CpuHasBf16Matmul() ? torch::kBFloat16 : torch::kFloat32;
  c.log_every = 0;
  c.progress_terminal = 0;
  auto trainer = specstream::student::Trainer::Create(c, 0, 1, {});
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str());
    return 1;
  }
  const int64_t base_kb = specstream::bench::StatusKb("VmRSS:");
  if (!(*trainer)->RunSteps(1).ok()) return 1;  // warm-up
  const auto start = Clock::now();
  const double cpu_start = specstream::bench::ProcessCpuSeconds();
  if (!(*trainer)->RunSteps(1).ok()) return 1;
  const double cpu_seconds = specstream::bench::ProcessCpuSeconds() - cpu_start;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%ld %.1f %.1f %.3f %.3f\n", static_cast<long>(length), length / seconds,
              (specstream::bench::StatusKb("VmHWM:") - base_kb) / 1024.0, seconds, cpu_seconds);
  return 0;
}

// A store of one sample of `length` tokens with random hidden states.
bool WriteStore(const std::string& path, int64_t length) {
  return specstream::bench::WriteSyntheticStore(path, {kHidden, kVocab, kLayers, {1, 3, 4}},
                                                length);
}

// Plain matmul FLOPs per second of wall time and per CPU-second: the best of
// three rounds of an MLP-sized and a head-sized product (oneDNN reaches
// about 1.6x the MLP's rate on the larger one, and a step's vocab-wide
// heads are that large).
struct MatmulRate {
  double per_second = 0;
  double per_cpu_second = 0;
};

MatmulRate MeasureMatmul() {
  torch::NoGradGuard no_grad;
  const auto dtype = specstream::bench::CpuHasBf16Matmul() ? torch::kBFloat16 : torch::kFloat32;
  MatmulRate rate;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2048, kIntermediate}, {4096, 8192}}) {
    torch::Tensor a = torch::randn({rows, kHidden}).to(dtype);
    torch::Tensor b = torch::randn({cols, kHidden}).to(dtype);
    torch::linear(a, b);
    const double flops = 2.0 * static_cast<double>(rows * kHidden * cols);
    for (int r = 0; r < 3; ++r) {
      const auto start = Clock::now();
      const double cpu_start = specstream::bench::ProcessCpuSeconds();
      for (int i = 0; i < 2; ++i) torch::linear(a, b);
      const double cpu = (specstream::bench::ProcessCpuSeconds() - cpu_start) / 2;
      const double wall = std::chrono::duration<double>(Clock::now() - start).count() / 2;
      rate.per_cpu_second = std::max(rate.per_cpu_second, flops / cpu);
      rate.per_second = std::max(rate.per_second, flops / wall);
    }
  }
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {1024, 2048, 4096, 8192};
  int ttt = 2;
  int64_t draft_vocab = 8000;
  std::string child_dir;
  std::string draft = "eagle3";
  int64_t child_length = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--lengths") {
      lengths.clear();
      for (absl::string_view p : absl::StrSplit(value, ',')) {
        int64_t v;
        if (absl::SimpleAtoi(p, &v)) lengths.push_back(v);
      }
    }
    if (flag == "--ttt") ttt = std::atoi(value.c_str());
    if (flag == "--draft") draft = value;
    if (flag == "--draft-vocab") draft_vocab = std::atoll(value.c_str());
    if (flag == "--child-dir") child_dir = value;
    if (flag == "--child-length") child_length = std::atoll(value.c_str());
  }
  specstream::LoggingOptions logging;
  logging.role = "bench";
  logging.level = "warn";
  specstream::InitLogging(logging);
  if (draft != "eagle3" && draft != "dflash" && draft != "dspark") {
    std::fprintf(stderr, "student_bench: --draft %s (available: eagle3, dflash, dspark)\n",
                 draft.c_str());
    return 2;
  }
  if (!child_dir.empty()) return RunChild(child_dir, child_length, ttt, draft_vocab, draft);

  // Per process: CI runs the three drafts' benchmarks side by side.
  std::string dir = (std::filesystem::temp_directory_path() /
                     absl::StrCat("specstream-student-bench-", getpid()))
                        .string();
  std::filesystem::remove_all(dir);
  specstream::teacher::InitRandomOptions init;
  init.arch = "llama";
  init.layers = kLayers;
  init.hidden = kHidden;
  init.heads = 8;
  init.kv_heads = 8;
  init.intermediate = 64;  // the target's MLPs are never run here
  init.vocab = kVocab;
  init.max_position = 16384;
  init.out = dir + "/target";
  if (!specstream::teacher::WriteRandomCheckpoint(init).ok()) return 1;
  for (int64_t length : lengths) {
    if (!WriteStore(dir + "/store-" + std::to_string(length), length)) return 1;
  }
  const MatmulRate matmul = MeasureMatmul();
  // Training FLOPs per token: forward + backward (3×) of the draft layer
  // (q/k/v from 2H, o, MLP) and lm_head per TTT step, plus the teacher
  // logits once; attention terms are left out (a lower bound).
  const double layer = 2.0 * (2 * kHidden * 3 * kHidden + kHidden * kHidden + 3.0 * kHidden * 2816);
  const double head = 2.0 * kHidden * draft_vocab;
  const double flops_per_token = 3.0 * ttt * (layer + head) + head;
  // Block drafts, per step of a sequence of `length` tokens with N·bs block
  // tokens: forward + backward (3×) of fc over the context, the context's
  // k/v projections, the layer over the block tokens, attention (each block
  // query against its own block and, on average, half the context), and
  // the full-vocab head (plus DSpark's Markov head); DSpark's teacher
  // logits once (a lower bound: norms, softmaxes and the L1 left out).
  auto block_flops = [&](int64_t length) {
    const double bs = draft == "dflash" ? kDflashBlock : kDsparkBlock;
    const double m = static_cast<double>(std::min<int64_t>(kAnchors, length - 1)) * bs;
    const double s = static_cast<double>(length);
    const double h = kHidden, v = kVocab;
    const double context = 2.0 * s * (3 * h * h) + 2.0 * s * 2 * h * h;
    const double block_layer = 2.0 * m * (4 * h * h + 3 * h * kIntermediate);
    const double attention = 4.0 * m * h * (s / 2 + bs);
    double heads = 2.0 * m * h * v;
    if (draft == "dspark") heads += 2.0 * m * kMarkovRank * v + 2.0 * m * h * v / 3.0;
    return 3.0 * (context + block_layer + attention + heads);
  };

  const std::string exe = specstream::bench::SelfExe();
  if (draft == "eagle3") {
    std::printf(
        "student_bench: eagle3 draft hidden %ld, draft vocab %ld, K=%d, %s; matmul %.1f GFLOP/s\n",
        static_cast<long>(kHidden), static_cast<long>(draft_vocab), ttt,
        specstream::bench::BenchDtypeName(), matmul.per_second / 1e9);
  } else {
    std::printf(
        "student_bench: %s draft hidden %ld, 1 layer, block %ld, %ld anchors, vocab %ld, %s; "
        "matmul %.1f GFLOP/s\n",
        draft.c_str(), static_cast<long>(kHidden),
        static_cast<long>(draft == "dflash" ? kDflashBlock : kDsparkBlock),
        static_cast<long>(kAnchors), static_cast<long>(kVocab), specstream::bench::BenchDtypeName(),
        matmul.per_second / 1e9);
  }
  std::printf("%8s %12s %14s %10s %12s\n", "tokens", "tokens/s", "step seconds", "fraction",
              "extra MiB");
  std::vector<double> extra;
  for (int64_t length : lengths) {
    std::string command = exe + " --child-dir " + dir + " --child-length " +
                          std::to_string(length) + " --ttt " + std::to_string(ttt) +
                          " --draft-vocab " + std::to_string(draft_vocab) + " --draft " + draft;
    FILE* pipe = popen(command.c_str(), "r");
    long len = 0;
    double tps = 0, mib = 0, seconds = 0, cpu_seconds = 0;
    if (pipe == nullptr ||
        std::fscanf(pipe, "%ld %lf %lf %lf %lf", &len, &tps, &mib, &seconds, &cpu_seconds) != 5) {
      std::fprintf(stderr, "student_bench: child for %ld tokens failed\n",
                   static_cast<long>(length));
      if (pipe) pclose(pipe);
      return 1;
    }
    pclose(pipe);
    const double step_flops =
        draft == "eagle3" ? flops_per_token * static_cast<double>(len) : block_flops(len);
    const double fraction = step_flops / cpu_seconds / matmul.per_cpu_second;
    std::printf("%8ld %12.0f %14.2f %10.2f %12.0f\n", len, tps, seconds, fraction, mib);
    if (fraction > 1.0) {
      std::printf(
          "student_bench: FAIL a fraction of matmul FLOPs per CPU-second above 1 (the FLOP "
          "count or the baseline is wrong)\n");
      return 1;
    }
    extra.push_back(mib);
  }
  std::filesystem::remove_all(dir);
  if (extra.size() >= 2) {
    const double length_ratio = static_cast<double>(lengths.back()) / lengths.front();
    const double memory_ratio = extra.back() / std::max(extra.front(), 1.0);
    std::printf("student_bench: extra memory x%.2f for length x%.0f\n", memory_ratio, length_ratio);
    if (memory_ratio > 1.5 * length_ratio) {
      std::printf("student_bench: FAIL memory grows super-linearly\n");
      return 1;
    }
  }
  std::printf("student_bench: OK memory grows linearly\n");
  return 0;
}
