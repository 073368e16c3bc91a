// Idle OpenMP workers that sleep instead of spinning, for binaries that run
// LibTorch's CPU kernels next to other such processes on the same cores.
//
// libgomp (LibTorch's OpenMP on Linux) lets idle workers spin for a while
// after every parallel region unless OMP_WAIT_POLICY=PASSIVE. One process
// alone barely notices; a teacher, student ranks and TP workers sharing a
// host's cores burn them spinning for each other. Measured with pip torch
// 2.13 on two cores: MultiHostTest.CoordinatorUnreachableForTenSecondsJob-
// KeepsTraining took 201 s spinning and 22 s passive.
//
// libgomp reads the policy once, as it loads, before main runs; so the policy
// is set by re-executing the binary:
//
//   int main(int argc, char** argv) {
//     specstream::PreferPassiveOpenMpWait(argv);  // first, before any thread
//
// A user who sets OMP_WAIT_POLICY (ACTIVE, say) keeps it.
#ifndef SPECSTREAM_COMMON_OPENMP_WAIT_H_
#define SPECSTREAM_COMMON_OPENMP_WAIT_H_

namespace specstream {

// When OMP_WAIT_POLICY is unset: sets it to PASSIVE and execv's `exe`
// (default: this binary) with `argv`, so does not return. Returns when the
// variable was already set, or when the exec failed (the variable is then
// set for child processes all the same).
void PreferPassiveOpenMpWait(char** argv, const char* exe = "/proc/self/exe");

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_OPENMP_WAIT_H_
