// The system on a CUDA GPU (label gpu; tests/gpu/run.sh runs them on a GPU
// machine, and each skips without a CUDA device). With one GPU, multi-rank
// checks run several processes on it, each claiming an NCCL host of its own
// (tests/testing/nccl_peer.h), as NCCL before 2.30 refuses two ranks of a
// communicator on one device.
//
//   * runtimes: hf and sglang on cuda against the same forward on CPU, and
//     against Hugging Face transformers' own model on the GPU;
//   * TP 2 against TP 1 over NCCL, MoE EP 2 against EP 1;
//   * the draft's gradients on cuda against CPU;
//   * DDP 2 against one rank with the double batch, CP 2 (ring, Ulysses)
//     against CP 1, over NCCL, as `specstream-student train` processes;
//   * online: a teacher on the GPU streams to a trainer on the GPU over NCCL
//     (device to device), inline and shm, and each run equals the offline
//     run from the same teacher's store.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "common/torch/tensor_util.h"
#include "common/vocab_map.h"
#include "nlohmann/json.hpp"
#include "services/student/grpc_teacher_connection.h"
#include "student/data_source.h"
#include "student/draft_model.h"
#include "student/trainer.h"
#include "teacher/tp_launcher.h"
#include "tests/testing/nccl_peer.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

extern char** environ;

namespace specstream {
namespace {

using specstream::testing::TempDir;

#define SKIP_WITHOUT_CUDA()                                                        \
  if (!torch::cuda::is_available()) {                                              \
    GTEST_SKIP() << "no CUDA device: tests/gpu/run.sh runs this on a GPU machine"; \
  }

// max |a - b| / max |b|, in float64 on the host.
double RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kCPU, torch::kFloat64);
  const torch::Tensor y = b.to(torch::kCPU, torch::kFloat64);
  return (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-30);
}

int CudaDevices() { return static_cast<int>(torch::cuda::device_count()); }

// `cuda:<rank % visible devices>`: ranks share a GPU when there is one.
std::string RankDevice(int rank) { return absl::StrCat("cuda:", rank % CudaDevices()); }

// Starts `argv` with this environment plus `env`; output appended to `log`.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& log) {
  // `env` overrides: a variable set twice reads as its first copy.
  auto name = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> all = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (std::none_of(env.begin(), env.end(),
                     [&](const std::string& o) { return name(o) == name(entry); })) {
      all.push_back(entry);
    }
  }
  std::vector<char*> envp, args;
  for (std::string& e : all) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> copy = argv;
  for (std::string& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int RunProcess(const std::vector<std::string>& argv, const std::string& log,
               const std::vector<std::string>& env = {}) {
  const pid_t pid = Spawn(argv, env, log);
  return pid > 0 ? Wait(pid) : -1;
}

std::string ReadLog(const std::string& path) {
  return std::filesystem::exists(path) ? testing::ReadFile(path) : "(no log)";
}

// NAME=value entries of one rank of a process pair on this machine
// (NcclPeerEnv: NCCL_HOSTID when the GPU is shared).
std::vector<std::string> PeerEnv(const std::string& tag) {
  std::vector<std::string> env;
  for (const auto& [name, value] : testing::NcclPeerEnv(CudaDevices(), tag)) {
    env.push_back(name + "=" + value);
  }
  return env;
}

teacher::ForwardRequest Request(int vocab) {
  teacher::ForwardRequest request;
  request.want_target_ids = true;
  request.sequences = {testing::RandomTokens(300, vocab, 1), testing::RandomTokens(97, vocab, 2)};
  return request;
}

std::vector<teacher::SequenceCapture> Captures(const std::string& runtime, const std::string& dir,
                                               const std::string& dtype, const std::string& device,
                                               const teacher::ForwardRequest& request) {
  teacher::TargetRuntimeOptions options;
  options.model_dir = dir;
  options.dtype = dtype;
  options.device = device;
  auto target = teacher::CreateTargetRuntime(runtime, options);
  EXPECT_TRUE(target.ok()) << target.status();
  if (!target.ok()) return {};
  auto captures = (*target)->Forward(request);
  EXPECT_TRUE(captures.ok()) << captures.status();
  return captures.ok() ? *captures : std::vector<teacher::SequenceCapture>{};
}

void ExpectClose(const std::vector<teacher::SequenceCapture>& got,
                 const std::vector<teacher::SequenceCapture>& want, double tolerance,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < want.size(); ++s) {
    const double aux = RelDiff(got[s].aux_hidden, want[s].aux_hidden);
    const double last = RelDiff(got[s].last_hidden, want[s].last_hidden);
    EXPECT_LE(aux, tolerance) << what << ", sequence " << s << ": aux_hidden";
    EXPECT_LE(last, tolerance) << what << ", sequence " << s << ": last_hidden";
    std::printf("%s, sequence %zu: aux_hidden %.2e, last_hidden %.2e relative\n", what.c_str(), s,
                aux, last);
  }
}

testing::TinyModelOptions MidModel(const std::string& arch) {
  testing::TinyModelOptions model;
  model.arch = arch;
  model.layers = 8;
  model.hidden = 256;
  model.heads = 8;
  model.kv_heads = 4;
  model.intermediate = 512;
  model.vocab = 1024;
  return model;
}

// --- Runtimes -----------------------------------------------------------------

TEST(GpuRuntimeTest, HfAndSglangOnCudaMatchCpu) {
  SKIP_WITHOUT_CUDA();
  for (const std::string arch : {"llama", "qwen3"}) {
    TempDir dir;
    const testing::TinyModelOptions model = MidModel(arch);
    testing::WriteTinyModel(dir.path(), model);
    const teacher::ForwardRequest request = Request(model.vocab);
    for (const std::string runtime : {"hf", "sglang"}) {
      for (const auto& [dtype, tolerance] :
           {std::pair<std::string, double>{"float32", 1e-4}, {"bfloat16", 2e-2}}) {
        const std::string what = absl::StrCat(arch, " ", runtime, " ", dtype);
        ExpectClose(Captures(runtime, dir.path(), dtype, "cuda:0", request),
                    Captures(runtime, dir.path(), dtype, "cpu", request), tolerance, what);
      }
    }
  }
}

// The captures against transformers' own model (output_hidden_states) on
// the same GPU: id k is the output of layer k, hidden_states[k + 1]; the
// last entry is the final norm's output.
TEST(GpuRuntimeTest, CapturesMatchTransformersOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  TempDir dir;
  const testing::TinyModelOptions model = MidModel("llama");
  testing::WriteTinyModel(dir.path(), model);
  const std::vector<int32_t> ids = testing::RandomTokens(200, model.vocab, 3);
  const std::string out = dir.Join("reference.safetensors");
  const std::string command = absl::StrCat(
      SPECSTREAM_GPU_PYTHON, " ", testing::SourceDir(),
      "/tests/gpu/hf_reference.py hidden --model ", dir.path(), " --ids ", absl::StrJoin(ids, ","),
      " --device cuda --dtype float32 --out ", out, " >", dir.Join("hf.log"), " 2>&1");
  const int status = std::system(command.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77) GTEST_SKIP() << "transformers is not importable: " << ReadLog(dir.Join("hf.log"));
  ASSERT_EQ(code, 0) << ReadLog(dir.Join("hf.log"));
  auto reference = SafetensorsFile::Open(out);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto hidden = [&](int i) {
    auto view = (*reference)->Get(absl::StrCat("hidden.", i));
    EXPECT_TRUE(view.ok()) << view.status();
    return view.ok() ? *TensorFromView(*view) : torch::Tensor();
  };
  teacher::ForwardRequest request;
  request.sequences = {ids};
  const auto ours = Captures("hf", dir.path(), "float32", "cuda:0", request);
  ASSERT_EQ(ours.size(), 1u);
  // Default capture ids for 8 layers: 1, L/2 - 1, L - 4.
  std::vector<torch::Tensor> parts;
  for (int k : {1, model.layers / 2 - 1, model.layers - 4}) parts.push_back(hidden(k + 1));
  const double aux = RelDiff(ours[0].aux_hidden, torch::cat(parts, -1));
  const double last = RelDiff(ours[0].last_hidden, hidden(model.layers));
  std::printf("against transformers on cuda: aux_hidden %.2e, last_hidden %.2e relative\n", aux,
              last);
  EXPECT_LE(aux, 1e-4);
  EXPECT_LE(last, 1e-4);
}

// TP 2 over NCCL against TP 1 (hf, dense); EP 2 against EP 1 (sglang,
// qwen3_moe). Workers are `specstream-teacher tp-worker` processes.
TEST(GpuRuntimeTest, TensorAndExpertParallelOverNcclMatchOneRank) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    std::string name, runtime;
    testing::TinyModelOptions model;
    int ep;
  };
  testing::TinyModelOptions moe = MidModel("qwen3_moe");
  moe.experts = 8;
  moe.top_k = 2;
  moe.intermediate = 128;
  for (const Case& c :
       {Case{"TP 2", "hf", MidModel("llama"), 1}, Case{"TP 2 EP 2", "sglang", moe, 2}}) {
    TempDir dir;
    testing::WriteTinyModel(dir.path(), c.model);
    const teacher::ForwardRequest request = Request(c.model.vocab);
    const auto one = Captures(c.runtime, dir.path(), "float32", "cuda:0", request);
    teacher::RuntimeSpec spec;
    spec.runtime = c.runtime;
    spec.model_dir = dir.path();
    spec.dtype = "float32";
    spec.devices = {RankDevice(0), RankDevice(1)};
    spec.ep_size = c.ep;
    spec.worker_executable = SPECSTREAM_TEACHER_PATH;
    auto launched = teacher::LaunchRuntime(spec);
    ASSERT_TRUE(launched.ok()) << c.name << ": " << launched.status();
    auto two = (*launched)->runtime().Forward(request);
    ASSERT_TRUE(two.ok()) << c.name << ": " << two.status();
    ExpectClose(*two, one, 1e-4, c.name + " over NCCL against 1 rank");
    EXPECT_TRUE((*launched)->Shutdown().ok());
  }
}

// --- Student ------------------------------------------------------------------

// One EAGLE-3 step's gradients on cuda against CPU (fp32).
TEST(GpuStudentTest, DraftGradientsOnCudaMatchCpu) {
  SKIP_WITHOUT_CUDA();
  TempDir dir;
  const testing::TinyModelOptions model = MidModel("llama");
  testing::WriteTinyModel(dir.path(), model);
  TokenCounter counter(model.vocab);
  const std::vector<int32_t> all = testing::RandomTokens(4096, model.vocab, 4);
  ASSERT_TRUE(counter.Add(all, std::vector<uint8_t>(all.size(), 1)).ok());
  auto map = BuildVocabMap(counter, 512);
  ASSERT_TRUE(map.ok()) << map.status();
  student::DraftShape shape;
  shape.hidden_size = shape.target_hidden_size = model.hidden;
  shape.intermediate_size = model.intermediate;
  shape.num_attention_heads = model.heads;
  shape.num_key_value_heads = model.kv_heads;
  shape.head_dim = model.hidden / model.heads;
  shape.draft_vocab_size = map->draft_vocab();
  shape.target_vocab_size = model.vocab;
  shape.max_position_embeddings = 4096;
  std::vector<student::TrainingSample> samples;
  for (int64_t length : {300, 211}) {
    student::TrainingSample s;
    s.length = length;
    s.input_ids = torch::randint(model.vocab, {length}, torch::kInt64);
    s.loss_mask = torch::ones({length}, torch::kUInt8);
    s.aux_hidden = torch::randn({length, 3 * model.hidden});
    s.last_hidden = torch::randn({length, model.hidden});
    samples.push_back(std::move(s));
  }
  const student::DraftBatch host = student::Collate(samples, 0);
  std::map<std::string, torch::Tensor> grads[2];
  int d = 0;
  for (const torch::Device device : {torch::Device(torch::kCPU), torch::Device("cuda:0")}) {
    auto draft = student::Eagle3Draft::Create(shape, dir.path(), *map, 7, true, device);
    ASSERT_TRUE(draft.ok()) << draft.status();
    const student::DraftBatch batch = student::ToDevice(host, device);
    const torch::Tensor valid = (*draft)->CountValid(batch, 7);
    auto out = (*draft)->Forward(batch, 7, valid, torch::kFloat32);
    ASSERT_TRUE(out.ok()) << out.status();
    out->weighted_loss.backward();
    for (const auto& [name, p] : (*draft)->parameters()) grads[d][name] = p.grad().cpu();
    ++d;
  }
  for (const auto& [name, cpu] : grads[0]) {
    const double diff = RelDiff(grads[1][name], cpu);
    EXPECT_LE(diff, 1e-5) << name;
    std::printf("gradient %s: %.2e relative\n", name.c_str(), diff);
  }
}

// The runs of the next tests: one target, its fp32 store (dumped on the GPU,
// one sequence per forward, as the teacher servers below run them) and the
// tokenized data.
class GpuTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) return;
    testing::TinyModelOptions model;
    model.layers = 8;
    model.hidden = 64;
    model.heads = 4;
    model.kv_heads = 2;
    model.intermediate = 128;
    model.vocab = 256;
    testing::WriteTinyModel(dir_.Join("target"), model);
    testing::WriteTokenizedSamples(dir_.Join("data.jsonl"), 24, 11, 7, model.vocab);
    ASSERT_EQ(RunProcess({SPECSTREAM_TEACHER_PATH, "dump", "--model", dir_.Join("target"), "--data",
                          dir_.Join("data.jsonl"), "--out", dir_.Join("store"), "--devices",
                          "cuda:0", "--dtype", "float32", "--store-dtype", "float32",
                          "--keep-target-ids", "--batch-tokens", "1"},
                         dir_.Join("dump.log")),
              0)
        << ReadLog(dir_.Join("dump.log"));
  }

  // A job YAML: `steps` steps, batch `batch`, float32, metrics in
  // <name>.metrics.jsonl.
  std::string Job(const std::string& name, int batch, const std::string& extra) {
    const std::string path = dir_.Join(name + ".yaml");
    testing::WriteFile(
        path, absl::StrCat("name: ", name, "\ndata:\n  store: ", dir_.Join("store"),
                           "\nmodel:\n  target: ", dir_.Join("target"),
                           "\n  draft:\n    draft_vocab_size: 128\n"
                           "optimizer:\n  lr: 3.0e-3\n"
                           "training:\n  max_steps: 6\n  batch_size: ",
                           batch, "\n  ttt_steps: 3\n  dtype: float32\n",
                           "metrics:\n  jsonl: ", dir_.Join(name + ".metrics.jsonl"), "\n", extra));
    return path;
  }

  // `world` ranks of the job as processes on this machine's GPU(s).
  bool TrainRanks(const std::string& name, const std::string& config, int world) {
    const int port = 29700 + next_port_++;
    std::vector<pid_t> pids;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<std::string> env = PeerEnv(absl::StrCat("gpu-test-", name, "-", rank));
      env.insert(env.end(),
                 {absl::StrCat("RANK=", rank), absl::StrCat("WORLD_SIZE=", world), "LOCAL_RANK=0",
                  "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)});
      pids.push_back(Spawn(
          {SPECSTREAM_STUDENT_PATH, "train", "--config", config, "--device", RankDevice(rank)}, env,
          dir_.Join(absl::StrCat(name, "-rank", rank, ".log"))));
    }
    bool ok = true;
    for (pid_t pid : pids) ok = Wait(pid) == 0 && ok;
    return ok;
  }

  std::vector<double> Losses(const std::string& name) {
    std::vector<double> losses;
    std::istringstream lines(testing::ReadFile(dir_.Join(name + ".metrics.jsonl")));
    for (std::string line; std::getline(lines, line);) {
      losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    }
    return losses;
  }

  void ExpectSameLosses(const std::string& a, const std::string& b, double tolerance) {
    const std::vector<double> la = Losses(a), lb = Losses(b);
    ASSERT_EQ(la.size(), lb.size()) << a << " vs " << b;
    ASSERT_FALSE(la.empty());
    for (size_t i = 0; i < la.size(); ++i) {
      EXPECT_NEAR(la[i], lb[i], tolerance * std::abs(lb[i]))
          << a << " vs " << b << ", step " << i + 1;
    }
    std::printf("%s vs %s: last loss %.8f / %.8f\n", a.c_str(), b.c_str(), la.back(), lb.back());
  }

  TempDir dir_;
  int next_port_ = 0;
};

// DDP 2 (batch 2 each) against one rank with batch 4, and CP 2 (ring,
// Ulysses) against CP 1, each rank a process training on the GPU, their
// gradients and metrics all-reduced over NCCL.
TEST_F(GpuTrainingTest, DataAndContextParallelOverNcclMatchOneRank) {
  SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(TrainRanks("one", Job("one", 4, ""), 1)) << ReadLog(dir_.Join("one-rank0.log"));
  ASSERT_TRUE(TrainRanks("ddp", Job("ddp", 2, "parallel:\n  dp_size: 2\n"), 2))
      << ReadLog(dir_.Join("ddp-rank0.log")) << ReadLog(dir_.Join("ddp-rank1.log"));
  ExpectSameLosses("ddp", "one", 1e-5);
  for (const std::string mode : {"ring", "ulysses"}) {
    const std::string name = "cp-" + mode;
    ASSERT_TRUE(TrainRanks(
        name, Job(name, 4, "parallel:\n  dp_size: 1\n  cp_size: 2\n  cp_mode: " + mode + "\n"), 2))
        << ReadLog(dir_.Join(name + "-rank0.log")) << ReadLog(dir_.Join(name + "-rank1.log"));
    ExpectSameLosses(name, "one", 1e-5);
  }
  EXPECT_NE(ReadLog(dir_.Join("ddp-rank0.log")).find("NCCL group: rank 0/2"), std::string::npos)
      << ReadLog(dir_.Join("ddp-rank0.log"));
}

// A teacher process on the GPU streams to a trainer on the GPU: over NCCL
// device to device, inline and shm; each run equals the offline run from
// the same teacher's store.
TEST_F(GpuTrainingTest, OnlineFromAGpuTeacherTrainsLikeOffline) {
  SKIP_WITHOUT_CUDA();
  const std::string port_file = dir_.Join("teacher.port");
  const pid_t teacher =
      Spawn({SPECSTREAM_TEACHER_PATH, "serve", "--model", dir_.Join("target"), "--devices",
             "cuda:0", "--port", "0", "--port-file", port_file, "--dtype", "float32",
             "--payload-dtype", "float32", "--keep-target-ids", "--batch-tokens", "1",
             "--nccl-device", std::to_string(CudaDevices() - 1)},
            PeerEnv("gpu-test-teacher"), dir_.Join("teacher.log"));
  ASSERT_GT(teacher, 0);
  testing::ApplyEnv(testing::NcclPeerEnv(CudaDevices(), "gpu-test-student"));
  const int port = testing::WaitForPortFile(port_file);
  ASSERT_GT(port, 0) << ReadLog(dir_.Join("teacher.log"));
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto config = [&](const std::string& transport) {
    student::TrainerConfig c;
    c.target_dir = dir_.Join("target");
    c.draft_vocab_size = 128;
    c.lr = 3e-3;
    c.max_steps = 8;
    c.batch_size = 4;
    c.ttt_steps = 3;
    c.seed = 5;
    c.dtype = torch::kFloat32;
    c.progress_terminal = 0;
    c.log_every = 0;
    c.device = torch::Device("cuda:0");
    if (transport.empty()) {
      c.store = dir_.Join("store");
    } else {
      c.tokenized = dir_.Join("data.jsonl");
      c.teachers = {address};
      c.teacher_connector = std::make_shared<services::GrpcTeacherConnector>();
      c.transport = transport;
    }
    return c;
  };
  auto offline = student::Trainer::Create(config(""), 0, 1, {});
  ASSERT_TRUE(offline.ok()) << offline.status();
  ASSERT_TRUE((*offline)->Run().ok());
  for (const std::string transport : {"nccl", "inline", "shm"}) {
    auto online = student::Trainer::Create(config(transport), 0, 1, {});
    ASSERT_TRUE(online.ok()) << transport << ": " << online.status();
    const absl::Status run = (*online)->Run();
    ASSERT_TRUE(run.ok()) << transport << ": " << run << ReadLog(dir_.Join("teacher.log"));
    const auto& a = (*online)->history();
    const auto& b = (*offline)->history();
    ASSERT_EQ(a.size(), b.size()) << transport;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i].loss, b[i].loss, 1e-6 * std::abs(b[i].loss))
          << transport << ", step " << i + 1;
    }
    double worst = 0;
    for (size_t i = 0; i < (*online)->draft().parameters().size(); ++i) {
      worst = std::max(worst, RelDiff((*online)->draft().parameters()[i].second,
                                      (*offline)->draft().parameters()[i].second));
    }
    EXPECT_LE(worst, 1e-5) << transport;
    std::printf("online over %s against offline, both on cuda: weights within %.2e relative\n",
                transport.c_str(), worst);
  }
  kill(teacher, SIGTERM);
  EXPECT_EQ(Wait(teacher), 0) << ReadLog(dir_.Join("teacher.log"));
}

}  // namespace
}  // namespace specstream
