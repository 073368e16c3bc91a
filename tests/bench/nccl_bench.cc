// NCCL payload transport throughput (common/transport/nccl_channel.h): a teacher
// process sends payloads of 4096 tokens x 32 KiB (128 MiB, the sample
// size) to this process over a two-rank communicator; reported against
// memcpy of the same size measured in the same run. Needs a CUDA device; says
// so and exits 0 without one. With one device both ranks share it and NCCL
// moves the bytes through its socket transport over loopback (each process
// claims its own host, tests/testing/nccl_peer.h), which is the path two
// machines without InfiniBand take; with two devices NCCL picks P2P/NVLink.
//
// Then the same payloads device to device (SendDevice from GPU memory,
// RecvDevice into it: what a GPU teacher and a GPU student do), reported
// against cudaMemcpy device-to-device of the same size on the receiving
// device (one-way bytes per second). The summary line of tests/gpu/run.sh
// ("SUMMARY nccl ...") carries both ratios.
//
// Fails when NCCL reaches less than kFloor of memcpy (a loose floor: it
// catches a transport that stalls or serialises, not tuning regressions);
// the device-to-device ratio is reported, not asserted (with one GPU the
// two ranks talk over sockets, far below the GPU's own copy).
#include <sys/types.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/nccl_channel.h"
#include "common/transport/nccl_util.h"
#include "cuda_runtime_api.h"
#include "tests/testing/nccl_peer.h"

namespace specstream {
namespace {

constexpr uint64_t kPayloadBytes = uint64_t{4096} * (32 << 10);
constexpr int kSamples = 16;  // timed, after one warm-up sample
constexpr double kFloor = 0.05;

int RunSender() {
  NcclChannelOptions options;
  options.rank = 0;
  options.device = std::atoi(std::getenv("SPECSTREAM_NCCL_DEVICE"));
  auto channel = NcclChannel::Join(testing::HexDecode(std::getenv("SPECSTREAM_NCCL_ID")), options);
  if (!channel.ok()) {
    fprintf(stderr, "sender: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  std::string payload(kPayloadBytes, '\0');
  testing::FillPattern(0, 0, payload.size(), payload.data());
  for (int i = 0; i <= kSamples; ++i) {
    absl::Status sent = (*channel)->Send(payload.size(), [&](uint64_t offset, uint64_t n, char* d) {
      std::memcpy(d, payload.data() + offset, n);
    });
    if (!sent.ok()) {
      fprintf(stderr, "sender: %s\n", sent.ToString().c_str());
      return 1;
    }
  }
  // The same payloads from device memory.
  void* device = nullptr;
  if (cudaMalloc(&device, payload.size()) != cudaSuccess ||
      cudaMemcpy(device, payload.data(), payload.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
    fprintf(stderr, "sender: cannot stage the payload on the device\n");
    return 1;
  }
  for (int i = 0; i <= kSamples; ++i) {
    absl::Status sent = (*channel)->SendDevice(device, payload.size());
    if (!sent.ok()) {
      fprintf(stderr, "sender: device payload: %s\n", sent.ToString().c_str());
      return 1;
    }
  }
  cudaFree(device);
  return 0;
}

// cudaMemcpy device-to-device of `bytes` on the current device: the best of
// five, one-way GB/s.
double DeviceMemcpyGBps(void* dst, const void* src, uint64_t bytes) {
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    cudaDeviceSynchronize();
    const absl::Time start = absl::Now();
    cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    best = std::max(best, bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
  }
  return best;
}

double MemcpyGBps(std::string& a, std::string& b) {
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    std::memcpy(b.data(), a.data(), a.size());
    best = std::max(best, a.size() / absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
  }
  return best;
}

int Run() {
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    printf("nccl_bench: skipped, no CUDA device (the NCCL transport needs one per side)\n");
    return 0;
  }
  testing::ApplyEnv(testing::NcclPeerEnv(devices, "specstream-bench-student"));
  auto version = NcclVersion();
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  if (!id.ok() || !version.ok()) {
    fprintf(stderr, "nccl_bench: %s\n", id.status().ToString().c_str());
    return 1;
  }
  auto env = testing::NcclPeerEnv(devices, "specstream-bench-teacher");
  env.emplace_back("SPECSTREAM_NCCL_ID", testing::HexEncode(*id));
  env.emplace_back("SPECSTREAM_NCCL_DEVICE", std::to_string(testing::NcclPeerDevice(devices, 0)));
  const pid_t sender = testing::SpawnSelf({"--sender"}, env);

  NcclChannelOptions options;
  options.rank = 1;
  options.device = testing::NcclPeerDevice(devices, 1);
  auto channel = NcclChannel::Join(*id, options);
  if (!channel.ok()) {
    fprintf(stderr, "nccl_bench: join: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  std::string payload(kPayloadBytes, '\0');
  // Warm-up sample, checked byte for byte.
  absl::Status received = (*channel)->Recv(payload.data(), payload.size());
  if (!received.ok() || testing::FirstMismatch(0, payload.data(), payload.size()) != -1) {
    fprintf(stderr, "nccl_bench: warm-up payload: %s\n",
            received.ok() ? "bytes differ" : received.ToString().c_str());
    return 1;
  }
  const absl::Time start = absl::Now();
  for (int i = 0; i < kSamples; ++i) {
    received = (*channel)->Recv(payload.data(), payload.size());
    if (!received.ok()) {
      fprintf(stderr, "nccl_bench: payload %d: %s\n", i, received.ToString().c_str());
      return 1;
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double nccl_gbps = kSamples * kPayloadBytes / seconds / 1e9;

  // Device to device: a warm-up payload checked byte for byte, then timed.
  void* device = nullptr;
  void* device_copy = nullptr;
  if (cudaSetDevice(options.device) != cudaSuccess ||
      cudaMalloc(&device, kPayloadBytes) != cudaSuccess ||
      cudaMalloc(&device_copy, kPayloadBytes) != cudaSuccess) {
    fprintf(stderr, "nccl_bench: cannot allocate device buffers\n");
    return 1;
  }
  received = (*channel)->RecvDevice(device, kPayloadBytes);
  std::fill(payload.begin(), payload.end(), '\0');
  if (!received.ok() ||
      cudaMemcpy(payload.data(), device, kPayloadBytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
      testing::FirstMismatch(0, payload.data(), payload.size()) != -1) {
    fprintf(stderr, "nccl_bench: device warm-up payload: %s\n",
            received.ok() ? "bytes differ" : received.ToString().c_str());
    return 1;
  }
  const absl::Time device_start = absl::Now();
  for (int i = 0; i < kSamples; ++i) {
    received = (*channel)->RecvDevice(device, kPayloadBytes);
    if (!received.ok()) {
      fprintf(stderr, "nccl_bench: device payload %d: %s\n", i, received.ToString().c_str());
      return 1;
    }
  }
  const double device_gbps =
      kSamples * kPayloadBytes / absl::ToDoubleSeconds(absl::Now() - device_start) / 1e9;
  const double d2d_gbps = DeviceMemcpyGBps(device_copy, device, kPayloadBytes);
  cudaFree(device);
  cudaFree(device_copy);
  const int sender_exit = testing::WaitChild(sender, absl::Seconds(60));
  std::string copy(kPayloadBytes, '\0');
  const double memcpy_gbps = MemcpyGBps(payload, copy);
  const double ratio = nccl_gbps / memcpy_gbps;
  printf("nccl_bench: NCCL %d.%d.%d, %d device(s), %s\n", *version / 10000, *version / 100 % 100,
         *version % 100, devices,
         devices >= 2 ? "ranks on devices 0 and 1" : "both ranks on device 0 (socket transport)");
  printf("| path | GB/s | vs memcpy |\n|---|---|---|\n");
  printf("| memcpy, %d MiB | %.2f | 1.00 |\n", static_cast<int>(kPayloadBytes >> 20), memcpy_gbps);
  printf("| NCCL payload, %d x %d MiB | %.2f | %.3f |\n", kSamples,
         static_cast<int>(kPayloadBytes >> 20), nccl_gbps, ratio);
  printf("| cudaMemcpy device to device, %d MiB | %.2f | |\n",
         static_cast<int>(kPayloadBytes >> 20), d2d_gbps);
  printf("| NCCL payload device to device, %d x %d MiB | %.2f | %.3f of cudaMemcpy D2D |\n",
         kSamples, static_cast<int>(kPayloadBytes >> 20), device_gbps, device_gbps / d2d_gbps);
  printf(
      "SUMMARY nccl: host payloads %.2f GB/s = %.3f x memcpy; device to device %.2f GB/s = "
      "%.4f x cudaMemcpy D2D (%.0f GB/s), NCCL %d.%d.%d, %d device(s)\n",
      nccl_gbps, ratio, device_gbps, device_gbps / d2d_gbps, d2d_gbps, *version / 10000,
      *version / 100 % 100, *version % 100, devices);
  if (sender_exit != 0) {
    fprintf(stderr, "nccl_bench: sender exited with %d\n", sender_exit);
    return 1;
  }
  if (ratio < kFloor) {
    fprintf(stderr, "nccl_bench: FAIL: NCCL/memcpy %.3f < %.2f\n", ratio, kFloor);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace specstream

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--sender") return specstream::RunSender();
  return specstream::Run();
}
