#include "student/eagle3_alignment.h"

#include <algorithm>
#include <vector>

namespace specstream::student {

torch::Tensor Ahead(const torch::Tensor& x, int64_t s, int64_t rows) {
  const int64_t available = std::clamp<int64_t>(x.size(1) - s, 0, rows);
  if (available == rows) return s == 0 && x.size(1) == rows ? x : x.narrow(1, s, rows);
  std::vector<int64_t> pad_shape(x.sizes().begin(), x.sizes().end());
  pad_shape[1] = rows - available;
  torch::Tensor zeros = torch::zeros(pad_shape, x.options());
  if (available == 0) return zeros;
  return torch::cat({x.narrow(1, s, available), zeros}, 1);
}

torch::Tensor Eagle3ValidMask(const torch::Tensor& lengths, int64_t offset,
                              const torch::Tensor& loss_mask, const torch::Tensor& in_vocab, int k,
                              int64_t rows) {
  torch::Tensor positions = torch::arange(offset, offset + rows, lengths.options()).unsqueeze(0);
  torch::Tensor in_range = (positions + k + 1) < lengths.unsqueeze(1);
  torch::Tensor mask = Ahead(loss_mask.to(torch::kBool), k, rows);
  return in_range & mask & Ahead(in_vocab, k + 1, rows);
}

torch::Tensor Eagle3ValidCounts(const torch::Tensor& lengths, int64_t offset,
                                const torch::Tensor& loss_mask, const torch::Tensor& in_vocab,
                                int ttt_steps, int64_t rows) {
  std::vector<torch::Tensor> counts;
  for (int k = 0; k < ttt_steps; ++k) {
    counts.push_back(Eagle3ValidMask(lengths, offset, loss_mask, in_vocab, k, rows).sum());
  }
  return torch::stack(counts);
}

}  // namespace specstream::student
