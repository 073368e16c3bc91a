// The EAGLE-3 alignment contract (shared/DESIGN.md §3, "Alignment" and
// "Valid positions") as plain tensor functions, so that it is pinned by tests
// of its own (tests/unit/student/alignment_test.cc) and not only through the
// draft's loss.
//
// At TTT step k (0-based) the row of global position t takes token x[t+k+1]
// as its input embedding and is trained towards the teacher at t+k+1. It
// counts iff
//   t+k+1 < len (the sample's whole length),
//   loss_mask[t+k] = 1 (the mask shifts with the step, unshifted at k = 0),
//   the teacher's full-vocab argmax at t+k+1 is in the draft vocab.
//
// Under context parallelism a batch is one shard: `offset` is the global
// position of its row 0, and the per-position inputs carry a halo of at
// least k+1 rows past the shard's own `rows` (zeros past the data count as
// masked).
#ifndef SPECSTREAM_STUDENT_EAGLE3_ALIGNMENT_H_
#define SPECSTREAM_STUDENT_EAGLE3_ALIGNMENT_H_

#include <cstdint>

#include <torch/torch.h>

namespace specstream::student {

// Rows [s, s + rows) of x along dim 1 (out[:, i] = x[:, i + s]), zeros where
// i + s is past x's rows. Same dtype and device as x.
torch::Tensor Ahead(const torch::Tensor& x, int64_t s, int64_t rows);

// [B, rows] bool: which of the batch's own rows count at step k.
//   lengths    int64 [B]: each sample's whole (global) length
//   loss_mask  bool or integer [B, rows + halo]
//   in_vocab   bool [B, rows + halo]: the teacher argmax at that row is in
//              the draft vocab
// On the device of `lengths`; nothing is read back to the host.
torch::Tensor Eagle3ValidMask(const torch::Tensor& lengths, int64_t offset,
                              const torch::Tensor& loss_mask, const torch::Tensor& in_vocab, int k,
                              int64_t rows);

// int64 [K]: the count of Eagle3ValidMask over the batch at k = 0 .. K-1.
torch::Tensor Eagle3ValidCounts(const torch::Tensor& lengths, int64_t offset,
                                const torch::Tensor& loss_mask, const torch::Tensor& in_vocab,
                                int ttt_steps, int64_t rows);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_EAGLE3_ALIGNMENT_H_
