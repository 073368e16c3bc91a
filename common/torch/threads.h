// LibTorch's intra-op thread count for a process of ours.
//
// LibTorch's own default is the physical core count that cpuinfo reports.
// On some virtual machines that is fewer than the CPUs the process may use:
// on the 2-vCPU machines this project runs on, cpuinfo counts one core, so
// every op (and every bf16 GEMM, which oneDNN runs on OpenMP threads) used
// one CPU of two (docs/operations.md, "CPU threads"). OpenBLAS, which runs
// fp32 GEMMs, counts its own threads and is not affected.
#ifndef SPECSTREAM_COMMON_TORCH_THREADS_H_
#define SPECSTREAM_COMMON_TORCH_THREADS_H_

namespace specstream {

// The CPUs this process may run on: its affinity mask, capped by a cgroup v2
// CPU quota (/sys/fs/cgroup/cpu.max, a Kubernetes CPU limit) rounded up; at
// least 1.
int AvailableCpus();

// Sets LibTorch's intra-op threads, unless OMP_NUM_THREADS is set (then
// LibTorch already follows it), to AvailableCpus() divided by the local
// ranks sharing the machine (LOCAL_WORLD_SIZE, as torchrun and `train
// --nproc` set it; 1 when unset), at least 1. Call once, early in main,
// before any parallel work. Returns the threads in use.
int ConfigureComputeThreads();

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TORCH_THREADS_H_
