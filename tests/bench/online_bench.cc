// Online vs offline training throughput: the same draft trained for the same
// steps from a store dumped by a random target, and live from that target
// served in-process by TeacherServer (inline and shared-memory payloads).
// Reports tokens/s of each and the online/offline ratio.
//
// On a dedicated setup the teacher runs on its own devices; here teacher and
// student share two cores, so the target is kept small next to the draft
// (the teacher's forward is a fraction of the student's step) and the ratio
// measures what streaming costs the student: receiving, checking and
// decoding payloads, and waiting for samples the prefetch did not cover.
// Fails below a 0.5 floor (goal 0.95, printed).
//
//   online_bench [--steps 12]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "student/trainer.h"
#include "teacher/dump.h"
#include "teacher/hf_runtime.h"
#include "teacher/init_random.h"
#include "teacher/teacher_service.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kHidden = 512, kVocab = 8000, kSamples = 96, kLength = 512;

specstream::student::TrainerConfig Config(const std::string& dir, int64_t steps) {
  specstream::student::TrainerConfig c;
  c.target_dir = dir + "/target";
  c.draft_vocab_size = 4000;
  c.intermediate_size = 1408;
  c.max_steps = steps;
  c.batch_size = 4;
  c.ttt_steps = 3;
  c.dtype = torch::kBFloat16;
  c.log_every = 0;
  c.progress_terminal = 0;
  c.in_flight = 8;
  return c;
}

// Tokens/s over all steps but the first (warm-up), or -1 on failure.
double Train(const specstream::student::TrainerConfig& config, int64_t steps) {
  auto trainer = specstream::student::Trainer::Create(config, 0, 1, {});
  if (!trainer.ok()) {
    std::fprintf(stderr, "online_bench: %s\n", trainer.status().ToString().c_str());
    return -1;
  }
  if (!(*trainer)->RunSteps(1).ok()) return -1;
  const auto start = Clock::now();
  if (absl::Status s = (*trainer)->RunSteps(steps - 1); !s.ok()) {
    std::fprintf(stderr, "online_bench: %s\n", s.ToString().c_str());
    return -1;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t tokens = 0;
  for (size_t i = 1; i < (*trainer)->history().size(); ++i)
    tokens += (*trainer)->history()[i].tokens;
  return static_cast<double>(tokens) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 12;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--steps") steps = std::atoll(argv[i + 1]);
  }
  specstream::LoggingOptions logging;
  logging.role = "bench";
  logging.level = "warn";
  specstream::InitLogging(logging);
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("specstream-online-bench-", getpid()))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  specstream::teacher::InitRandomOptions init;
  init.arch = "llama";
  init.layers = 4;
  init.hidden = kHidden;
  init.heads = 8;
  init.kv_heads = 8;
  init.intermediate = 512;
  init.vocab = kVocab;
  init.out = dir + "/target";
  if (!specstream::teacher::WriteRandomCheckpoint(init).ok()) return 1;
  {
    std::FILE* data = std::fopen((dir + "/data.jsonl").c_str(), "w");
    uint64_t state = 3;
    for (int64_t i = 0; i < kSamples; ++i) {
      std::string ids;
      for (int64_t t = 0; t < kLength; ++t) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        absl::StrAppend(&ids, t ? "," : "", (state >> 33) % kVocab);
      }
      std::fprintf(data, "{\"input_ids\":[%s]}\n", ids.c_str());
    }
    std::fclose(data);
  }
  specstream::teacher::HfRuntimeOptions runtime_options;
  runtime_options.model_dir = dir + "/target";
  runtime_options.dtype = "bfloat16";
  runtime_options.capture_layer_ids = {0, 1, 2};
  auto runtime = specstream::teacher::HfRuntime::Create(runtime_options);
  if (!runtime.ok()) return 1;
  specstream::teacher::DumpOptions dump;
  dump.data = dir + "/data.jsonl";
  dump.out = dir + "/store";
  dump.keep_target_ids = true;
  dump.progress_terminal = 0;
  if (!specstream::teacher::RunDump(**runtime, dump).ok()) return 1;

  specstream::student::TrainerConfig offline = Config(dir, steps);
  offline.store = dir + "/store";
  const double offline_tps = Train(offline, steps);
  if (offline_tps <= 0) return 1;

  std::printf(
      "online_bench: target hidden %ld (4 layers), draft vocab 4000, K=3, bf16, batch 4 x "
      "%ld tokens, %ld steps\n",
      static_cast<long>(kHidden), static_cast<long>(kLength), static_cast<long>(steps));
  std::printf("%-10s %12s %10s\n", "source", "tokens/s", "vs store");
  std::printf("%-10s %12.0f %10.2f\n", "store", offline_tps, 1.0);
  double worst = 1e9;
  for (const char* transport : {"inline", "shm"}) {
    specstream::teacher::TeacherServerOptions server_options;
    server_options.service.payload_dtype = "bfloat16";
    server_options.service.keep_target_ids = true;
    auto server = specstream::teacher::TeacherServer::Start(**runtime, server_options);
    if (!server.ok()) return 1;
    specstream::student::TrainerConfig online = Config(dir, steps);
    online.tokenized = dir + "/data.jsonl";
    online.teachers = {(*server)->address()};
    online.transport = transport;
    const double tps = Train(online, steps);
    (*server)->Shutdown(absl::Seconds(5));
    if (tps <= 0) return 1;
    std::printf("%-10s %12.0f %10.2f\n", transport, tps, tps / offline_tps);
    worst = std::min(worst, tps / offline_tps);
  }
  std::filesystem::remove_all(dir);
  std::printf(
      "online_bench: online / offline >= %.2f (goal 0.95 with dedicated teacher devices; "
      "floor 0.5 with teacher and student on the same two cores)\n",
      worst);
  if (worst < 0.5) {
    std::printf("online_bench: FAIL\n");
    return 1;
  }
  std::printf("online_bench: OK\n");
  return 0;
}
