// Starts a tensor-parallel target runtime ("hf" or "sglang") over `--devices`: one process per
// device. The calling process is rank 0 (the leader, which callers use as a
// TargetRuntime); ranks 1..N-1 are child processes running
// `specstream-teacher tp-worker`, which load their shard and follow the
// leader's broadcasts.
//
// Devices: every rank loads its shard straight to its device; on CUDA
// devices the TP all-reduces and EP all-to-alls run over an NCCL group (in
// native bf16), next to the Gloo group that carries the leader's requests.
// A GPU listed twice (`cuda:0,cuda:0`, a one-GPU machine) runs two ranks on
// it: each then claims an NCCL host of its own (NCCL_HOSTID, unless set;
// the leader's holds for its NCCL payload channels too), since NCCL before
// 2.30 refuses two ranks of a communicator on one device.
//
// Rendezvous: the leader hosts a TCPStore on a free loopback port. Each worker
// reports "ready/<rank>" or "failed/<rank>" (with the reason) in the store
// after loading, so a load error in any rank surfaces in the leader as a
// status, not a hang. Destroying the LaunchedRuntime releases the followers
// and reaps the children.
#ifndef SPECSTREAM_TEACHER_TP_LAUNCHER_H_
#define SPECSTREAM_TEACHER_TP_LAUNCHER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/torch/process_group.h"
#include "teacher/tp_runtime.h"

namespace specstream::teacher {

// The runtime named by `--runtime` ("hf" or "sglang"); InvalidArgument
// naming the flag for any other name.
absl::StatusOr<std::unique_ptr<TensorParallelRuntime>> CreateTargetRuntime(
    const std::string& runtime, TargetRuntimeOptions options);

struct RuntimeSpec {
  std::string runtime = "hf";  // hf | sglang
  std::string model_dir;
  std::string dtype = "auto";
  CaptureLayerIds capture_layer_ids;
  std::vector<std::string> devices = {"cpu"};  // "cpu" or "cuda:N"; one TP rank each
  int ep_size = 1;                             // expert parallelism within the TP group
  std::string log_level;                       // workers' --log-level; empty: their default
  std::string worker_executable;               // the specstream-teacher binary (for tp-worker)
  std::chrono::milliseconds setup_timeout{std::chrono::minutes(10)};
};

class LaunchedRuntime final {
 public:
  ~LaunchedRuntime();
  TensorParallelRuntime& runtime() { return *runtime_; }
  // Releases followers and waits for the workers; idempotent.
  absl::Status Shutdown();

 private:
  friend absl::StatusOr<std::unique_ptr<LaunchedRuntime>> LaunchRuntime(const RuntimeSpec&);
  LaunchedRuntime() = default;
  ProcessGroupHandle group_;
  std::unique_ptr<TensorParallelRuntime> runtime_;
  std::vector<pid_t> workers_;
  bool shut_down_ = false;
};

absl::StatusOr<std::unique_ptr<LaunchedRuntime>> LaunchRuntime(const RuntimeSpec& spec);

// Parses "cpu,cpu" / "cuda:0,cuda:1"; refuses unknown or unavailable devices,
// cpu and CUDA ranks mixed, and several CUDA ranks in a build without NCCL
// process groups. CUDA ranks run their activations' collectives over NCCL
// (TargetRuntimeOptions::device_group), the leader's requests over Gloo.
// `check_machine` false checks the names and the layout only, not that
// this machine and build have the devices (serve --check-config).
absl::StatusOr<std::vector<std::string>> ParseDevices(const std::string& devices,
                                                      bool check_machine = true);

struct WorkerOptions {
  std::string runtime = "hf";
  std::string model_dir;
  std::string dtype = "auto";
  CaptureLayerIds capture_layer_ids;
  int rank = 1;
  int world_size = 2;
  int ep_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string device = "cpu";  // this rank's entry of the leader's --devices
};

// The body of `specstream-teacher tp-worker`: load, report, follow.
absl::Status RunTpWorker(const WorkerOptions& options);

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_TP_LAUNCHER_H_
