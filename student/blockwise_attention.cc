#include "student/blockwise_attention.h"

#include <limits>

namespace specstream::student {

GroupedDims GroupedDimsOf(const torch::Tensor& q, const torch::Tensor& k) {
  return GroupedDims{q.size(0), q.size(1), k.size(1), q.size(1) / k.size(1), q.size(2), q.size(3)};
}

torch::ScalarType AttentionComputeType(torch::ScalarType input) {
  return input == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::Tensor FlatRows(const torch::Tensor& x5, int64_t start, int64_t len,
                       const GroupedDims& dims, torch::ScalarType type) {
  return x5.narrow(3, start, len)
      .to(type)
      .reshape({dims.batch, dims.kv_heads, dims.group * len, dims.d});
}

torch::Tensor FlatRowStats(const torch::Tensor& x4, int64_t start, int64_t len,
                           const GroupedDims& dims) {
  return x4.narrow(3, start, len).reshape({dims.batch, dims.kv_heads, dims.group * len, 1});
}

torch::Tensor CausalHidden(int64_t q_begin, int64_t q_len, int64_t k_begin, int64_t k_len,
                           torch::Device device) {
  const auto options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  torch::Tensor rows = torch::arange(q_begin, q_begin + q_len, options).unsqueeze(1);
  torch::Tensor cols = torch::arange(k_begin, k_begin + k_len, options).unsqueeze(0);
  return cols > rows;
}

torch::Tensor CausalBlockScores(const torch::Tensor& qb, const torch::Tensor& kb, int64_t qs,
                                int64_t len, int64_t ks, int64_t lk, double scale,
                                const GroupedDims& dims) {
  torch::Tensor s = torch::matmul(qb, kb.transpose(-1, -2)).mul_(scale);
  if (ks + lk - 1 > qs) {  // some key lies after the block's first query
    s.view({dims.batch, dims.kv_heads, dims.group, len, lk})
        .masked_fill_(CausalHidden(qs, len, ks, lk, s.device()),
                      -std::numeric_limits<double>::infinity());
  }
  return s;
}

}  // namespace specstream::student
