#include "student/cod_sampling.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "student/step_rng.h"

namespace specstream::student {

std::vector<int64_t> CodDepthSizes(int64_t n, const CodOptions& options) {
  std::vector<int64_t> sizes(std::max<int64_t>(options.depths, 0), 0);
  if (sizes.empty()) return sizes;
  sizes[0] = n;
  for (int64_t k = 1; k < options.depths; ++k) {
    const double share =
        std::max(std::pow(options.ratio, static_cast<double>(k)), options.ratio_min);
    sizes[k] =
        static_cast<int64_t>(std::floor(static_cast<double>(std::max<int64_t>(n - k, 0)) * share));
    if (sizes[k] <= 0) break;  // every deeper depth stays empty
  }
  return sizes;
}

torch::Tensor CodSample(const torch::Tensor& loss_mask, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& sample_keys, uint64_t seed, int64_t step,
                        const CodOptions& options) {
  const torch::Tensor mask = loss_mask.to(torch::kCPU).to(torch::kUInt8).contiguous();
  const int64_t b = mask.size(0), t = mask.size(1), depths = options.depths;
  torch::Tensor keep = torch::zeros({depths, b, t}, torch::kBool);
  auto out = keep.accessor<bool, 3>();
  for (int64_t row = 0; row < b; ++row) {
    const uint8_t* m = mask.data_ptr<uint8_t>() + row * t;
    const int64_t len = std::min(lengths[row], t);
    auto valid = [&](int64_t p, int64_t k) { return p + k + 1 < len && m[p + k] != 0; };
    std::vector<int64_t> kept;
    for (int64_t p = 0; p < len; ++p) {
      if (valid(p, 0)) kept.push_back(p);
    }
    const std::vector<int64_t> sizes = CodDepthSizes(static_cast<int64_t>(kept.size()), options);
    std::mt19937_64 rng = StepRng(seed, step, sample_keys[row]);
    for (int64_t k = 0; k < depths; ++k) {
      if (k > 0) {
        std::vector<int64_t> pool;
        for (int64_t p : kept) {
          if (valid(p, k)) pool.push_back(p);
        }
        kept = UniformSubset(std::move(pool), sizes[k], rng);
      }
      for (int64_t p : kept) out[k][row][p] = true;
    }
  }
  return keep;
}

}  // namespace specstream::student
