// Online training across hosts under a slow, lossy network: the student on
// one namespace host (tests/testing/hosts.h), the teacher on another, each
// with one CPU thread (OMP_NUM_THREADS=1: two processes on two cores, so
// neither steals the other's core and runs compare). The same run is
// measured on a clean link, with 20 ms added to every packet the teacher's
// host receives (so to every round trip), and with 1 % loss each way on top,
// in alternating rounds; the delayed runs are reported as ratios of the clean
// one. Prefetch (credits ahead of the training step) should hide the
// latency: goal >= 0.9x; the benchmark fails below 0.6x. Needs root (network
// namespaces); exits 77 (skipped) without it.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/testing/hosts.h"

namespace {

constexpr int kSteps = 40;
constexpr int kWarmupSteps = 5;  // connect, first requests, allocator growth
// The last steps run after the teacher has computed everything (the student
// then has both cores) and are left out too.
constexpr int kDrainSteps = 4;
constexpr int kRounds = 3;                      // clean, delayed and lossy runs, alternating
constexpr int kBatch = 2, kSampleTokens = 128;  // every step trains kBatch x kSampleTokens

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Tokens/s over the steps between warm-up and drain (their tokens over the
// sum of their times: each step trains the same tokens, so its time is
// those over its rate), from a metrics.jsonl file.
double TokensPerSecond(const std::string& metrics) {
  std::istringstream lines(ReadAll(metrics));
  double tokens = 0, seconds = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto m = nlohmann::json::parse(line, nullptr, false);
    if (!m.is_object()) continue;
    const int step = m.value("step", 0);
    const double rate = m.value("tokens_per_s", 0.0);
    if (step > kWarmupSteps && step <= kSteps - kDrainSteps && rate > 0) {
      tokens += kBatch * kSampleTokens;
      seconds += kBatch * kSampleTokens / rate;
    }
  }
  return seconds > 0 ? tokens / seconds : 0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main() {
  auto hosts = specstream::testing::TestHosts::Create(2);
  if (!hosts.ok()) {
    std::cout << "multihost_bench: skipped: " << hosts.status() << "\n";
    return 77;
  }
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("specstream-multihost-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};

  // A target whose forward and draft step take long enough that per-sample
  // latency matters (tens of ms per step on one core each).
  if (Shell(std::string(SPECSTREAM_TEACHER_PATH) +
            " init-random --arch llama --layers 8 --hidden 128 --heads 4 --kv-heads 2"
            " --intermediate 256 --vocab 2048 --dtype bfloat16 --out " +
            dir + "/target >" + dir + "/init.log 2>&1") != 0) {
    std::cerr << ReadAll(dir + "/init.log");
    return 1;
  }
  {
    std::ofstream data(dir + "/data.jsonl");
    for (int i = 0; i < 64; ++i) {
      data << "{\"input_ids\":[";
      for (int t = 0; t < kSampleTokens; ++t) data << (t ? "," : "") << (i * 131 + t * 17) % 2048;
      data << "]}\n";
    }
  }
  const pid_t teacher = (*hosts)->Spawn(
      0,
      {SPECSTREAM_TEACHER_PATH, "serve", "--model", dir + "/target", "--devices", "cpu", "--host",
       "0.0.0.0", "--port", "7100", "--keep-target-ids", "--port-file", dir + "/teacher.port",
       "--insecure-no-auth"},  // hosts of this benchmark's own; it measures links, not auth
      {"OMP_NUM_THREADS=1"}, dir + "/teacher.log");
  for (int i = 0;
       i < 600 && !std::filesystem::exists(dir + "/teacher.port") && (*hosts)->Poll(teacher) == -1;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!std::filesystem::exists(dir + "/teacher.port")) {
    std::cerr << ReadAll(dir + "/teacher.log");
    return 1;
  }

  auto run = [&](const std::string& name) -> double {
    const std::string config = dir + "/" + name + ".yaml";
    std::ofstream(config) << "name: " << name << "\ndata:\n  tokenized: " << dir
                          << "/data.jsonl\n  teachers: [\"host0:7100\"]\n  ledger_dir: " << dir
                          << "/ledger-" << name << "\nmodel:\n  target: " << dir
                          << "/target\n  draft:\n    draft_vocab_size: 512\n"
                             "optimizer:\n  lr: 1.0e-3\n"
                             "training:\n  max_steps: "
                          << kSteps << "\n  batch_size: " << kBatch << "\n  ttt_steps: 4\n"
                          << "metrics:\n  jsonl: " << dir << "/" << name << ".metrics.jsonl\n";
    const auto start = std::chrono::steady_clock::now();
    const int code = (*hosts)->Run(1, {SPECSTREAM_STUDENT_PATH, "train", "--config", config},
                                   {"OMP_NUM_THREADS=1"}, dir + "/" + name + ".log");
    std::printf("  %s: %d steps in %.1f s\n", name.c_str(), kSteps,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
    if (code != 0) {
      std::cerr << name << " failed (" << code << "):\n" << ReadAll(dir + "/" + name + ".log");
      return -1;
    }
    return TokensPerSecond(dir + "/" + name + ".metrics.jsonl");
  };

  // Rounds of three runs (clean, +20 ms, +20 ms and 1 % loss), so that the
  // machine's slower and faster minutes fall on every kind; each kind's
  // figure is its median, each ratio the median of the rounds' ratios.
  std::vector<double> clean, delayed, lossy, delayed_ratio, lossy_ratio;
  for (int round = 0; round < kRounds; ++round) {
    const std::string suffix = "-" + std::to_string(round);
    bool ok = (*hosts)->SetDelay(0, absl::ZeroDuration()).ok() && (*hosts)->SetLoss(0, 0).ok();
    clean.push_back(run("clean" + suffix));
    ok = ok && (*hosts)->SetDelay(0, absl::Milliseconds(20)).ok();
    delayed.push_back(run("delay-20ms" + suffix));
    ok = ok && (*hosts)->SetLoss(0, 1).ok();
    lossy.push_back(run("delay-20ms-loss-1pct" + suffix));
    if (!ok) {
      std::cerr << "multihost_bench: cannot delay or drop the teacher's packets\n";
      return 1;
    }
    if (clean.back() <= 0 || delayed.back() <= 0 || lossy.back() <= 0) {
      std::cerr << "multihost_bench: no tokens/s measured in round " << round << "\n";
      return 1;
    }
    delayed_ratio.push_back(delayed.back() / clean.back());
    lossy_ratio.push_back(lossy.back() / clean.back());
  }
  (*hosts)->Kill(teacher, SIGTERM);
  (*hosts)->Wait(teacher);
  const double ratio = Median(lossy_ratio);
  std::printf(
      "\nmultihost_bench: online training, student and teacher on separate hosts "
      "(median of %d rounds)\n",
      kRounds);
  std::printf("  %-38s %12s %8s\n", "link (teacher's host)", "tokens/s", "ratio");
  std::printf("  %-38s %12.0f %8.2f\n", "clean", Median(clean), 1.0);
  std::printf("  %-38s %12.0f %8.2f\n", "+20 ms round trip", Median(delayed),
              Median(delayed_ratio));
  std::printf("  %-38s %12.0f %8.2f   (goal >= 0.90, fails < 0.60)\n",
              "+20 ms round trip, 1 % loss each way", Median(lossy), ratio);
  return ratio >= 0.6 ? 0 : 1;
}
