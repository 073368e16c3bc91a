// P-EAGLE's COD sampling (arXiv 2602.01469; docs/peagle.md): which rows of
// a sample train at each depth of the parallel draft. Depth 0 keeps every
// valid row; depth k keeps a geometrically shrinking share, drawn from the
// rows depth k-1 kept, so that each kept row's rollout is whole up to its
// depth (the attention of depth k reads depths 1..k of the same row).
//
// In the EAGLE-3 alignment (student/eagle3_alignment.h), row p at depth k
// is trained towards the teacher at p+k+1 and is loss-valid iff
//   L_k(p):  p + k + 1 < len  and  loss_mask[p + k] = 1.
// Then, for one sample:
//   S_0 = {p : L_0(p)},  n = |S_0|;
//   size_k = floor(max(0, n - k) · max(ratio^k, ratio_min))   (k >= 1);
//   S_k = a uniform subset of size_k of {p ∈ S_{k-1} : L_k(p)} (all of
//         them when fewer), and S_j = ∅ for j >= k once size_k is 0.
// The draw uses StepRng(seed, step, sample key) only (student/step_rng.h):
// the same on every rank (a CP rank plans on the whole sample) and after a
// resume. The draft's own in-vocab condition is applied on top, per row.
#ifndef SPECSTREAM_STUDENT_COD_SAMPLING_H_
#define SPECSTREAM_STUDENT_COD_SAMPLING_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace specstream::student {

struct CodOptions {
  int64_t depths = 7;      // K, the draft's tokens per round (depth 0 included)
  double ratio = 0.7;      // down_sample_ratio, in (0, 1)
  double ratio_min = 0.2;  // down_sample_ratio_min, in [0, 1]
};

// size_k for k = 0 .. depths-1 of a sample with n valid rows (size_0 = n).
std::vector<int64_t> CodDepthSizes(int64_t n, const CodOptions& options);

// keep: bool [depths, B, T] on the host, keep[k][b][p] iff p ∈ S_k of
// sample b. `loss_mask` [B, T] holds whole samples (any integer or bool
// dtype, on the host); `lengths` their lengths; `sample_keys` their keys.
torch::Tensor CodSample(const torch::Tensor& loss_mask, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& sample_keys, uint64_t seed, int64_t step,
                        const CodOptions& options);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_COD_SAMPLING_H_
