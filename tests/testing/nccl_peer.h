// Two-process NCCL checks on one machine (tests and benchmarks of the NCCL
// transport): the test process is one rank of a two-rank communicator, a
// child process (the same executable, re-executed) the other. LibTorch- and
// gRPC-free, so these binaries run on a GPU machine that lacks the project's
// other libraries.
#ifndef SPECSTREAM_TESTS_TESTING_NCCL_PEER_H_
#define SPECSTREAM_TESTS_TESTING_NCCL_PEER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace specstream::testing {

// Environment for one rank of a loopback pair. NCCL_SOCKET_IFNAME=lo (unless
// already set) keeps bootstrap and socket traffic on loopback. With a single
// visible CUDA device both ranks share it, which NCCL refuses for two ranks
// of one communicator on one host (before 2.30: "Duplicate GPU detected"), so
// each process then claims a host of its own (NCCL_HOSTID=<tag>) and the pair
// talks over NCCL's socket transport, as two machines would. Returns the
// variables to set; `device_count` is what CudaDeviceCount() says.
std::vector<std::pair<std::string, std::string>> NcclPeerEnv(int device_count,
                                                             absl::string_view tag);
// Sets them in this process (before its first NCCL call).
void ApplyEnv(const std::vector<std::pair<std::string, std::string>>& env);
// The device rank `rank` uses: its own when there are two or more, else 0.
int NcclPeerDevice(int device_count, int rank);

std::string HexEncode(absl::string_view bytes);
std::string HexDecode(absl::string_view hex);

// Starts this executable (/proc/self/exe) with `args` and `env` added to the
// environment; returns the child's pid.
pid_t SpawnSelf(const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& env);
// The child's exit code, 128 + signal when it was killed, or -1 when it did
// not end within `timeout` (it is then killed).
int WaitChild(pid_t pid, absl::Duration timeout);

// A deterministic byte pattern: byte k of payload `seed` (k counted from the
// payload's start), written for [offset, offset + n).
void FillPattern(uint64_t seed, uint64_t offset, uint64_t n, char* dest);
// Index of the first byte of `data` that differs from the pattern, or -1.
int64_t FirstMismatch(uint64_t seed, const char* data, uint64_t n);

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_NCCL_PEER_H_
