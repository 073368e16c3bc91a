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
// A second pair of runs serves the same streams from a teacher with spare
// capacity (StoreReplayRuntime: the target's captures replayed from the
// store, so its forward takes nothing from the shared cores), which is what
// the goal assumes. Fails below 0.5 (live target) or 0.8 (spare
// capacity); goal 0.95, printed.
//
//   online_bench [--steps 12]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/offline_store.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "services/student/grpc_teacher_connection.h"
#include "services/teacher/teacher_service.h"
#include "student/trainer.h"
#include "teacher/dump.h"
#include "teacher/hf_runtime.h"
#include "teacher/init_random.h"
#include "tests/bench/bench_util.h"

namespace {

constexpr int64_t kHidden = 512, kVocab = 8000, kBatch = 4, kLength = 512;

specstream::student::TrainerConfig Config(const std::string& dir, int64_t steps) {
  specstream::student::TrainerConfig c;
  c.target_dir = dir + "/target";
  c.draft_vocab_size = 4000;
  c.intermediate_size = 1408;
  c.max_steps = steps;
  c.batch_size = kBatch;
  c.ttt_steps = 3;
  c.dtype = specstream::bench::CpuHasBf16Matmul() ? torch::kBFloat16 : torch::kFloat32;
  c.log_every = 0;
  c.progress_terminal = 0;
  c.in_flight = 8;
  return c;
}

// The median over the steps after the first (warm-up) of each step's
// tokens/s, or -1 on failure. A step's time includes any wait for its
// samples; the median keeps a step slowed by the other process on the two
// cores from moving the ratio (runs of the same source differed by 10 %).
double Train(const specstream::student::TrainerConfig& config, int64_t steps) {
  auto trainer = specstream::student::Trainer::Create(config, 0, 1, {});
  if (!trainer.ok()) {
    std::fprintf(stderr, "online_bench: %s\n", trainer.status().ToString().c_str());
    return -1;
  }
  if (absl::Status s = (*trainer)->RunSteps(steps); !s.ok()) {
    std::fprintf(stderr, "online_bench: %s\n", s.ToString().c_str());
    return -1;
  }
  std::vector<double> rates;
  for (size_t i = 1; i < (*trainer)->history().size(); ++i) {
    rates.push_back((*trainer)->history()[i].tokens_per_second);
  }
  if (rates.empty()) return -1;
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// A teacher with capacity to spare: answers Forward with the captures the
// same target wrote to the store (looked up by the token ids), so the shared
// cores go to the student and to streaming (serialising, checksums, copies,
// decoding) as they would with the target on its own devices. Bench-only.
class StoreReplayRuntime final : public specstream::teacher::TargetRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<StoreReplayRuntime>> Open(
      const std::string& store, const specstream::teacher::ModelDescription& description) {
    std::unique_ptr<StoreReplayRuntime> replay(new StoreReplayRuntime());
    replay->description_ = description;
    ASSIGN_OR_RETURN(auto reader, specstream::StoreReader::Open(store));
    for (int64_t id : reader->sample_ids()) {
      ASSIGN_OR_RETURN(std::vector<specstream::TensorView> views, reader->Get(id));
      std::string key;
      specstream::teacher::SequenceCapture capture;
      for (const specstream::TensorView& view : views) {
        if (view.name == "input_ids")
          key.assign(reinterpret_cast<const char*>(view.data), view.nbytes);
        if (view.name == "aux_hidden") {
          ASSIGN_OR_RETURN(capture.aux_hidden, specstream::TensorFromView(view, description.dtype));
        }
        if (view.name == "last_hidden") {
          ASSIGN_OR_RETURN(capture.last_hidden,
                           specstream::TensorFromView(view, description.dtype));
        }
        if (view.name == "target_ids") {
          ASSIGN_OR_RETURN(capture.target_ids, specstream::TensorFromView(view));
        }
      }
      replay->captures_[key] = std::move(capture);
    }
    return replay;
  }

  const specstream::teacher::ModelDescription& Describe() const override { return description_; }

  absl::StatusOr<std::vector<specstream::teacher::SequenceCapture>> Forward(
      const specstream::teacher::ForwardRequest& request) override {
    std::vector<specstream::teacher::SequenceCapture> out;
    for (const auto& sequence : request.sequences) {
      auto it = captures_.find(std::string(reinterpret_cast<const char*>(sequence.data()),
                                           sequence.size() * sizeof(int32_t)));
      if (it == captures_.end()) return absl::NotFoundError("sequence not in the store");
      out.push_back(it->second);
    }
    return out;
  }

 private:
  StoreReplayRuntime() = default;
  specstream::teacher::ModelDescription description_;
  absl::flat_hash_map<std::string, specstream::teacher::SequenceCapture> captures_;
};

// Online tokens/s from a TeacherServer over `target` with `transport`, or -1.
double TrainOnline(specstream::teacher::TargetRuntime& target, const std::string& dir,
                   const std::string& transport, int64_t steps) {
  specstream::services::TeacherServerOptions server_options;
  server_options.service.payload_dtype = "bfloat16";
  server_options.service.keep_target_ids = true;
  auto server = specstream::services::TeacherServer::Start(target, server_options);
  if (!server.ok()) {
    std::fprintf(stderr, "online_bench: %s\n", server.status().ToString().c_str());
    return -1;
  }
  specstream::student::TrainerConfig online = Config(dir, steps);
  online.tokenized = dir + "/data.jsonl";
  online.teachers = {(*server)->address()};
  online.teacher_connector = std::make_shared<specstream::services::GrpcTeacherConnector>();
  online.transport = transport;
  const double tps = Train(online, steps);
  (*server)->Shutdown(absl::Seconds(5));
  return tps;
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
    // Twice the samples the steps train on: what the prefetch reads ahead
    // is there too.
    const int64_t samples = 2 * kBatch * steps;
    for (int64_t i = 0; i < samples; ++i) {
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
  runtime_options.dtype = specstream::bench::BenchDtypeName();
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

  std::printf(
      "online_bench: target hidden %ld (4 layers), draft vocab 4000, K=3, bf16, batch 4 x "
      "%ld tokens, %ld steps\n",
      static_cast<long>(kHidden), static_cast<long>(kLength), static_cast<long>(steps));
  std::printf("%-10s %12s %10s   (each row against a store run just before it)\n", "source",
              "tokens/s", "vs store");
  double worst = 1e9, worst_spare = 1e9;
  // Each online row is divided by a store run right before it, so that a
  // slow stretch of the shared machine falls on both sides of its ratio;
  // the first of those is the store row.
  bool store_row = true;
  auto store_run = [&]() {
    const double tps = Train(offline, steps);
    if (store_row && tps > 0) std::printf("%-10s %12.0f %10.2f\n", "store", tps, 1.0);
    store_row = false;
    return tps;
  };
  for (const char* transport : {"inline", "shm"}) {
    const double store_tps = store_run();
    const double tps = TrainOnline(**runtime, dir, transport, steps);
    if (tps <= 0 || store_tps <= 0) return 1;
    std::printf("%-10s %12.0f %10.2f\n", transport, tps, tps / store_tps);
    worst = std::min(worst, tps / store_tps);
  }
  // The same streams from a teacher whose forward costs the shared cores
  // nothing (its captures replayed from the store).
  auto replay = StoreReplayRuntime::Open(dir + "/store", (*runtime)->Describe());
  if (!replay.ok()) {
    std::fprintf(stderr, "online_bench: %s\n", replay.status().ToString().c_str());
    return 1;
  }
  for (const char* transport : {"inline", "shm"}) {
    const double store_tps = store_run();
    const double tps = TrainOnline(**replay, dir, transport, steps);
    if (tps <= 0 || store_tps <= 0) return 1;
    std::printf("%-10s %12.0f %10.2f   (teacher with spare capacity)\n", transport, tps,
                tps / store_tps);
    worst_spare = std::min(worst_spare, tps / store_tps);
  }
  std::filesystem::remove_all(dir);
  std::printf(
      "online_bench: online / offline >= %.2f with the target computing on the student's cores "
      "(floor 0.5), >= %.2f with a teacher of spare capacity (goal 0.95, floor 0.8)\n",
      worst, worst_spare);
  if (worst < 0.5 || worst_spare < 0.8) {
    std::printf("online_bench: FAIL\n");
    return 1;
  }
  std::printf("online_bench: OK\n");
  return 0;
}
