// A tiny EAGLE-3 draft over a random target, for tests of the draft model
// itself (eagle31_test, peagle_test): a 6-layer target of vocab 96, a draft
// vocab of its 48 even ids (so the vocab map's offsets are exercised),
// drafts whose norm weights are moved off their init of ones (a norm applied
// with the wrong weight shows), and one-sample batches with random captures
// and teacher states.
#ifndef SPECSTREAM_TESTS_TESTING_EAGLE3_DRAFT_FIXTURE_H_
#define SPECSTREAM_TESTS_TESTING_EAGLE3_DRAFT_FIXTURE_H_

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/hf_config.h"
#include "common/vocab_map.h"
#include "student/draft_model.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::testing {

class Eagle3DraftFixture : public ::testing::Test {
 public:
  static constexpr int64_t kDraftVocab = 48;

 protected:
  void SetUp() override {
    model_.layers = 6;
    model_.vocab = 96;
    WriteTinyModel(tmp_.path(), model_);
    auto config = LoadHfConfig(tmp_.path());
    ASSERT_TRUE(config.ok()) << config.status();
    target_ = *config;
    shape_ = student::TargetDraftShape(*config, 3);
    shape_.draft_vocab_size = kDraftVocab;
    TokenCounter counter(model_.vocab);
    std::vector<int32_t> even;
    for (int32_t i = 0; i < model_.vocab; i += 2) even.push_back(i);
    ASSERT_TRUE(counter.Add(even, std::vector<uint8_t>(even.size(), 1)).ok());
    auto map = BuildVocabMap(counter, kDraftVocab);
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
  }

  // A draft with `options` (seeded), its norms drawn from U(0.5, 1.5).
  std::unique_ptr<student::Eagle3Draft> Draft(const student::Eagle3Options& options,
                                              uint64_t seed = 3) {
    auto created = student::Eagle3Draft::Create(shape_, tmp_.path(), map_, seed,
                                                /*need_full_lm_head=*/true, torch::kCPU, options);
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return nullptr;
    torch::NoGradGuard no_grad;
    torch::manual_seed(seed);
    for (auto& [name, p] : (*created)->parameters()) {
      if (name.find("norm") != std::string::npos) p.uniform_(0.5, 1.5);
    }
    return std::move(*created);
  }

  // One sample of `t` tokens with random captures, teacher states and a
  // loss mask with a hole at 3.
  student::DraftBatch Batch(int64_t t, int seed) const {
    torch::manual_seed(seed);
    const int64_t h = shape_.hidden_size;
    student::DraftBatch b;
    const std::vector<int32_t> ids = RandomTokens(t, model_.vocab - 1, seed);
    b.input_ids = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end())).unsqueeze(0);
    b.loss_mask = torch::ones({1, t}, torch::kUInt8);
    b.loss_mask[0][3] = 0;
    b.aux_hidden = torch::randn({1, t, 3 * h});
    b.last_hidden = torch::randn({1, t, h}) * 3;
    b.lengths = torch::tensor({t});
    b.host_lengths = {t};
    return b;
  }

  // The draft's parameters as float64 leaves for a reference to
  // differentiate.
  static std::map<std::string, torch::Tensor> Float64Leaves(const student::Eagle3Draft& draft) {
    std::map<std::string, torch::Tensor> w;
    for (const auto& [name, p] : draft.parameters()) {
      w[name] = p.detach().to(torch::kFloat64).requires_grad_(true);
    }
    return w;
  }

  // Every parameter's gradient within 2e-4 of the reference's (relative to
  // the reference's largest entry).
  static void ExpectGradientsMatch(const student::Eagle3Draft& draft,
                                   const std::map<std::string, torch::Tensor>& reference) {
    for (const auto& [name, p] : draft.parameters()) {
      const torch::Tensor ref = reference.at(name).grad();
      ASSERT_TRUE(ref.defined()) << name;
      const double scale = std::max(ref.abs().max().item<double>(), 1e-6);
      EXPECT_LE((p.grad().to(torch::kFloat64) - ref).abs().max().item<double>() / scale, 2e-4)
          << name;
    }
  }

  TempDir tmp_;
  TinyModelOptions model_;
  HfModelConfig target_;
  student::DraftShape shape_;
  VocabMap map_;
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_EAGLE3_DRAFT_FIXTURE_H_
