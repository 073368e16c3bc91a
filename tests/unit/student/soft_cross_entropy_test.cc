#include "student/soft_cross_entropy.h"

#include "gtest/gtest.h"

namespace specstream::student {
namespace {

TEST(FusedSoftCrossEntropyTest, MatchesNaiveLossGradientsAndArgmax) {
  torch::manual_seed(3);
  for (int64_t chunk : {1, 4, 1024}) {
    torch::Tensor hidden = torch::randn({2, 9, 6}, torch::requires_grad());
    torch::Tensor weight = torch::randn({11, 6}, torch::requires_grad());
    torch::Tensor target_logp = torch::log_softmax(torch::randn({2, 9, 11}), -1);
    torch::Tensor target_argmax = target_logp.argmax(-1);
    torch::Tensor row_weight = (torch::rand({2, 9}) > 0.3).to(torch::kFloat32);

    auto fused =
        FusedSoftCrossEntropy(hidden, weight, target_logp, target_argmax, row_weight, chunk);
    auto [gh, gw] = [&] {
      auto g = torch::autograd::grad({fused.loss * 1.7}, {hidden, weight});
      return std::make_pair(g[0], g[1]);
    }();

    torch::Tensor logits = torch::matmul(hidden, weight.t());
    torch::Tensor naive =
        (-(target_logp.exp() * torch::log_softmax(logits, -1)).sum(-1) * row_weight).sum();
    auto g = torch::autograd::grad({naive * 1.7}, {hidden, weight});
    EXPECT_NEAR(fused.loss.item<double>(), naive.item<double>(), 1e-4) << chunk;
    EXPECT_LE((gh - g[0]).abs().max().item<double>(), 1e-5) << chunk;
    EXPECT_LE((gw - g[1]).abs().max().item<double>(), 1e-5) << chunk;
    int64_t correct =
        ((logits.argmax(-1) == target_argmax) & (row_weight > 0)).sum().item<int64_t>();
    EXPECT_EQ(fused.correct.item<int64_t>(), correct) << chunk;
  }
}

TEST(FusedSoftCrossEntropyTest, ZeroWeightRowsContributeNothing) {
  torch::Tensor hidden = torch::randn({1, 4, 3}, torch::requires_grad());
  torch::Tensor weight = torch::randn({5, 3}, torch::requires_grad());
  torch::Tensor target = torch::log_softmax(torch::randn({1, 4, 5}), -1);
  auto out =
      FusedSoftCrossEntropy(hidden, weight, target, target.argmax(-1), torch::zeros({1, 4}), 2);
  EXPECT_EQ(out.loss.item<double>(), 0.0);
  EXPECT_EQ(out.correct.item<int64_t>(), 0);
  auto g = torch::autograd::grad({out.loss}, {hidden, weight});
  EXPECT_EQ(g[0].abs().sum().item<double>(), 0.0);
}

}  // namespace
}  // namespace specstream::student
