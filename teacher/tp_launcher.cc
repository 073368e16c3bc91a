#include "teacher/tp_launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/hf_config.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "common/torch/tensor_util.h"
#include "teacher/hf_runtime.h"
#include "teacher/model_weights.h"
#include "teacher/sglang_runtime.h"

namespace specstream::teacher {
namespace {

constexpr std::chrono::seconds kWorkerExitDeadline{30};

std::string ReadyKey(int rank) { return absl::StrCat("ready/", rank); }
std::string FailedKey(int rank) { return absl::StrCat("failed/", rank); }

// Starts `args` with this process's environment plus `extra` ("NAME=value").
// A worker never outlives its leader's launching thread (SIGTERM).
absl::StatusOr<pid_t> SpawnWorker(const std::vector<std::string>& args,
                                  const std::vector<std::string>& extra) {
  SubprocessOptions options;
  options.argv = args;
  options.env = extra;
  options.parent_death_signal = SIGTERM;
  absl::StatusOr<SpawnedProcess> child = Spawn(options);
  if (!child.ok()) return Annotate(child.status(), "TP worker");
  return child->pid;
}

// Waits until every worker has reported ready; a failure report or a worker
// exiting early becomes the returned status.
absl::Status AwaitWorkers(c10d::Store& store, std::vector<pid_t>& workers,
                          std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> ready(workers.size() + 1, false);
  size_t remaining = workers.size();
  while (remaining > 0) {
    for (size_t i = 0; i < workers.size(); ++i) {
      const int rank = static_cast<int>(i) + 1;
      if (ready[rank]) continue;
      if (store.check({FailedKey(rank)})) {
        std::vector<uint8_t> reason = store.get(FailedKey(rank));
        return absl::FailedPreconditionError(
            absl::StrCat("TP rank ", rank, ": ", std::string(reason.begin(), reason.end())));
      }
      if (store.check({ReadyKey(rank)})) {
        ready[rank] = true;
        --remaining;
        continue;
      }
      int wstatus = 0;
      if (waitpid(workers[i], &wstatus, WNOHANG) == workers[i]) {
        workers[i] = -1;  // reaped: never signal or wait on this pid again
        return absl::InternalError(
            absl::StrCat("TP rank ", rank, " exited during setup (status ", wstatus, ")"));
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("TP workers did not report ready in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::OkStatus();
}

// Ranks on one GPU (`--devices cuda:0,cuda:0`: a machine with one GPU, or
// tests) must look like separate hosts to NCCL before 2.30, which refuses
// two ranks of a communicator on one device; each such rank then gets an
// NCCL_HOSTID of its own (and NCCL talks between them over its socket
// transport, as between two hosts). Empty when NCCL_HOSTID is set or no
// GPU is shared.
std::string SharedGpuHostId(const std::vector<std::string>& devices, int rank) {
  if (std::getenv("NCCL_HOSTID") != nullptr) return "";
  const std::string& mine = devices[rank];
  if (!absl::StartsWith(mine, "cuda")) return "";
  if (std::count(devices.begin(), devices.end(), mine) < 2) return "";
  return absl::StrCat(LocalHostname(), "-", getpid(), "-tp", rank);
}

// TP rank `rendezvous.rank`'s group for its activations on `device`: NCCL
// over its own prefix of the TP store for a CUDA device; none on cpu (the
// Gloo group serves).
absl::StatusOr<c10::intrusive_ptr<CommGroup>> ActivationGroupOn(
    const std::string& device, const RendezvousOptions& rendezvous,
    const c10::intrusive_ptr<c10d::Store>& store) {
  ASSIGN_OR_RETURN(torch::Device parsed, ParseDevice(device, "--devices"));
  if (!parsed.is_cuda()) return c10::intrusive_ptr<CommGroup>();
  return CreateNcclGroup(rendezvous, c10::make_intrusive<c10d::PrefixStore>("activations", store),
                         parsed);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorParallelRuntime>> CreateTargetRuntime(
    const std::string& runtime, TargetRuntimeOptions options) {
  if (runtime == "hf") {
    ASSIGN_OR_RETURN(auto hf, HfRuntime::Create(std::move(options)));
    return std::unique_ptr<TensorParallelRuntime>(std::move(hf));
  }
  if (runtime == "sglang") {
    ASSIGN_OR_RETURN(auto sglang, SglangRuntime::Create(std::move(options)));
    return std::unique_ptr<TensorParallelRuntime>(std::move(sglang));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--runtime \"", runtime, "\" (available: hf, sglang)"));
}

absl::StatusOr<std::vector<std::string>> ParseDevices(const std::string& devices,
                                                      bool check_machine) {
  std::vector<std::string> out;
  for (absl::string_view d : absl::StrSplit(devices, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(d));
  }
  if (out.empty()) return absl::InvalidArgumentError("--devices is empty");
  const auto cuda_ranks = std::count_if(
      out.begin(), out.end(), [](const std::string& d) { return absl::StartsWith(d, "cuda"); });
  if (cuda_ranks > 0 && cuda_ranks < static_cast<int64_t>(out.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices ", absl::StrJoin(out, ","),
                     ": the TP ranks of a teacher are all cpu or all CUDA devices"));
  }
  for (std::string& device : out) {
    if (device == "meta") {  // a test device, not one to serve on
      return absl::InvalidArgumentError(
          "--devices: unknown device \"meta\" (expected cpu, cuda or cuda:N)");
    }
    ASSIGN_OR_RETURN(torch::Device parsed, check_machine ? ParseDevice(device, "--devices")
                                                         : ParseDeviceName(device, "--devices"));
    device = parsed.str();
  }
  if (check_machine && cuda_ranks > 1 && !SPECSTREAM_WITH_TORCH_NCCL) {
    // Gloo would stage every all-reduce of CUDA activations through the host.
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices ", absl::StrJoin(out, ","),
        ": tensor parallelism across CUDA devices runs over NCCL process groups, and this "
        "build's LibTorch has none (SPECSTREAM_WITH_TORCH_NCCL=0); serve on one CUDA device"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<LaunchedRuntime>> LaunchRuntime(const RuntimeSpec& spec) {
  std::unique_ptr<LaunchedRuntime> launched(new LaunchedRuntime());
  const int world = static_cast<int>(spec.devices.size());
  TargetRuntimeOptions options;
  options.model_dir = spec.model_dir;
  options.dtype = spec.dtype;
  options.capture_layer_ids = spec.capture_layer_ids;
  options.tp_size = world;
  options.ep_size = spec.ep_size;
  options.device = spec.devices[0];
  if (world == 1) {
    ASSIGN_OR_RETURN(launched->runtime_, CreateTargetRuntime(spec.runtime, options));
    return launched;
  }
  // Refused before any worker is spawned or weight read: an unknown runtime,
  // a family it does not serve, an impossible TP/EP layout.
  if (spec.runtime != "hf" && spec.runtime != "sglang") {
    return CreateTargetRuntime(spec.runtime, options).status();
  }
  ASSIGN_OR_RETURN(HfModelConfig config, LoadHfConfig(spec.model_dir));
  RETURN_IF_ERROR(CheckRuntimeServes(config, spec.runtime, spec.runtime == "sglang",
                                     ParallelLayout{0, world, spec.ep_size}));
  if (spec.worker_executable.empty()) {
    return absl::InvalidArgumentError("tensor parallelism needs the worker executable");
  }
  RendezvousOptions rendezvous;
  rendezvous.world_size = world;
  int port = 0;
  ASSIGN_OR_RETURN(auto store, CreateTcpStore(rendezvous, &port));
  for (int rank = 1; rank < world; ++rank) {
    std::vector<std::string> args = {spec.worker_executable};
    if (!spec.log_level.empty()) {
      args.push_back("--log-level");
      args.push_back(spec.log_level);
    }
    args.insert(args.end(),
                {"tp-worker", "--runtime", spec.runtime, "--model", spec.model_dir, "--dtype",
                 spec.dtype, "--rank", std::to_string(rank), "--world-size", std::to_string(world),
                 "--ep", std::to_string(spec.ep_size), "--master-port", std::to_string(port),
                 "--device", spec.devices[rank]});
    if (!spec.capture_layer_ids.empty()) {
      args.push_back("--capture-layers");
      args.push_back(absl::StrJoin(spec.capture_layer_ids, ","));
    }
    std::vector<std::string> env;
    if (const std::string id = SharedGpuHostId(spec.devices, rank); !id.empty()) {
      env.push_back("NCCL_HOSTID=" + id);
    }
    ASSIGN_OR_RETURN(pid_t pid, SpawnWorker(args, env));
    launched->workers_.push_back(pid);
  }
  SS_LOG_INFO("tp: started {} worker process(es), rendezvous on 127.0.0.1:{}", world - 1, port);
  // The leader loads its shard while the workers load theirs.
  ASSIGN_OR_RETURN(launched->runtime_, CreateTargetRuntime(spec.runtime, options));
  RETURN_IF_ERROR(AwaitWorkers(*store, launched->workers_, spec.setup_timeout));
  ASSIGN_OR_RETURN(launched->group_, CreateGlooGroup(rendezvous, store));
  if (const std::string id = SharedGpuHostId(spec.devices, 0); !id.empty()) {
    setenv("NCCL_HOSTID", id.c_str(), /*overwrite=*/0);  // before this process's first NCCL call
  }
  ASSIGN_OR_RETURN(auto activations, ActivationGroupOn(spec.devices[0], rendezvous, store));
  launched->runtime_->AttachGroup(launched->group_.group, std::move(activations));
  return launched;
}

absl::Status LaunchedRuntime::Shutdown() {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  absl::Status status;
  // Without a group the workers were never released into RunFollower (setup
  // failed): stop them instead of waiting.
  const bool set_up = runtime_ && group_.group;
  if (set_up) status = runtime_->StopFollowers();
  for (pid_t pid : workers_) {
    if (pid <= 0) continue;  // already reaped during setup
    if (!set_up || !status.ok()) kill(pid, SIGTERM);
    // A follower that does not exit within the deadline is killed, so a hung
    // worker can never hang the leader's shutdown.
    int wstatus = 0;
    const auto deadline = std::chrono::steady_clock::now() + kWorkerExitDeadline;
    while (waitpid(pid, &wstatus, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &wstatus, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (set_up && status.ok() && !(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)) {
      status =
          absl::InternalError(absl::StrCat("TP worker ", pid, " exited with status ", wstatus));
    }
  }
  return status;
}

LaunchedRuntime::~LaunchedRuntime() {
  absl::Status status = Shutdown();
  if (!status.ok()) SS_LOG_WARN("tp shutdown: {}", std::string(status.message()));
}

absl::Status RunTpWorker(const WorkerOptions& o) {
  // A worker never outlives its leader (e.g. a leader killed with -9).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // Ctrl-C reaches the whole process group; only the leader acts on it (a
  // serving leader drains in-flight samples, which needs its followers), and
  // it stops the workers itself.
  signal(SIGINT, SIG_IGN);
  RendezvousOptions rendezvous;
  rendezvous.rank = o.rank;
  rendezvous.world_size = o.world_size;
  rendezvous.master_addr = o.master_addr;
  rendezvous.master_port = o.master_port;
  ASSIGN_OR_RETURN(auto store, CreateTcpStore(rendezvous));
  // Load before joining the group so a bad checkpoint is reported, not hung
  // on; the group is attached once every rank has loaded.
  TargetRuntimeOptions options;
  options.model_dir = o.model_dir;
  options.dtype = o.dtype;
  options.capture_layer_ids = o.capture_layer_ids;
  options.tp_rank = o.rank;
  options.tp_size = o.world_size;
  options.ep_size = o.ep_size;
  options.device = o.device;
  auto runtime = CreateTargetRuntime(o.runtime, options);
  if (!runtime.ok()) {
    std::string reason(runtime.status().message());
    store->set(FailedKey(o.rank), std::vector<uint8_t>(reason.begin(), reason.end()));
    return runtime.status();
  }
  store->set(ReadyKey(o.rank), std::vector<uint8_t>{1});
  ASSIGN_OR_RETURN(auto group, CreateGlooGroup(rendezvous, store));
  ASSIGN_OR_RETURN(auto activations, ActivationGroupOn(o.device, rendezvous, store));
  (*runtime)->AttachGroup(group.group, std::move(activations));
  return (*runtime)->RunFollower();
}

}  // namespace specstream::teacher
