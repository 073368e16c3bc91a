// Speculative decoding's acceptance, against target-only decoding, with a
// table target (the next token's logits depend on the last two tokens) and
// table drafts that differ from it.
#include "common/torch/speculative.h"

#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace specstream::spec {
namespace {

// logits[a * V + b] are the next-token logits after tokens a, b.
torch::Tensor Table(int64_t vocab, int seed, double spread) {
  torch::manual_seed(seed);
  return torch::randn({vocab * vocab, vocab}, torch::kFloat64) * spread;
}

class TableTarget final : public Target {
 public:
  explicit TableTarget(torch::Tensor table) : table_(std::move(table)) {}
  absl::StatusOr<Rows> Extend(const std::vector<int32_t>& ids, int64_t logit_rows) override {
    EXPECT_GE(logit_rows, 1);
    EXPECT_LE(logit_rows, static_cast<int64_t>(ids.size()));
    logit_rows_.push_back({static_cast<int64_t>(ids.size()), logit_rows});
    const int64_t v = table_.size(1);
    std::vector<torch::Tensor> rows;
    for (int32_t id : ids) {
      const int32_t before = seq_.empty() ? 0 : seq_.back();
      seq_.push_back(id);
      rows.push_back(table_[before * v + id]);
    }
    ++forwards_;
    Rows out;
    out.logits = torch::stack(rows)
                     .to(torch::kFloat32)
                     .narrow(0, static_cast<int64_t>(ids.size()) - logit_rows, logit_rows);
    // One feature per row: its position, so the test sees which rows the
    // decoder hands the draft.
    out.aux_hidden = torch::arange(static_cast<int64_t>(seq_.size() - ids.size()),
                                   static_cast<int64_t>(seq_.size()), torch::kFloat32)
                         .unsqueeze(1);
    return out;
  }
  void Truncate(int64_t length) override { seq_.resize(length); }
  void Reset() override { seq_.clear(); }
  int64_t forwards() const { return forwards_; }
  // (ids, logit rows) of every Extend.
  const std::vector<std::pair<int64_t, int64_t>>& logit_rows() const { return logit_rows_; }

 private:
  torch::Tensor table_;
  std::vector<std::pair<int64_t, int64_t>> logit_rows_;
  std::vector<int32_t> seq_;
  int64_t forwards_ = 0;
};

// Proposes from its own table (the target's plus noise), chained on its own
// picks; every `wrong`-th proposal (when > 0) is replaced by another token.
class TableDraft final : public Draft {
 public:
  TableDraft(torch::Tensor table, int64_t k, int wrong = 0)
      : table_(std::move(table)), k_(k), wrong_(wrong) {}
  int64_t max_proposal() const override { return k_; }
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, TokenChooser& chooser,
                       std::vector<int32_t>* tokens) override {
    // The decoder's contract: captures of every row but the last id's.
    EXPECT_EQ(aux.size(0), static_cast<int64_t>(ids.size()) - 1);
    EXPECT_EQ(aux[-1].item<float>(), static_cast<float>(ids.size() - 2));
    const int64_t v = table_.size(1);
    int32_t a = ids[ids.size() - 2], b = ids.back();
    for (int64_t i = 0; i < std::min(k_, max_tokens); ++i) {
      int32_t token = chooser.Choose(table_[a * v + b].to(torch::kFloat32));
      if (wrong_ > 0 && ++calls_ % wrong_ == 0) token = (token + 1) % static_cast<int32_t>(v);
      tokens->push_back(token);
      a = b;
      b = token;
    }
    return absl::OkStatus();
  }

 private:
  torch::Tensor table_;
  int64_t k_;
  int wrong_;
  int64_t calls_ = 0;
};

TEST(SpeculativeTest, GreedyOutputEqualsTargetOnlyAndCountsAddUp) {
  const int64_t vocab = 11;
  const torch::Tensor target_table = Table(vocab, 1, 2.0);
  for (int wrong : {0, 2, 3}) {
    SCOPED_TRACE(wrong);
    TableTarget target(target_table);
    // The same table as the target: only the planted errors are rejected.
    TableDraft draft(target_table, 4, wrong);
    DecodeOptions options;
    options.max_new_tokens = 40;
    for (int prompt_seed = 0; prompt_seed < 5; ++prompt_seed) {
      const std::vector<int32_t> prompt = {prompt_seed, (prompt_seed * 7) % 11, 3};
      auto base = Decode(target, nullptr, prompt, options);
      auto spec = Decode(target, &draft, prompt, options);
      ASSERT_TRUE(base.ok() && spec.ok());
      EXPECT_EQ(spec->tokens, base->tokens);
      ASSERT_EQ(spec->tokens.size(), 40u);
      const DecodeStats& s = spec->stats;
      EXPECT_EQ(base->stats.forwards, 40);
      EXPECT_EQ(s.forwards_saved(), s.new_tokens - s.forwards);
      // Every token after the prefill's came from a round or a plain step.
      int64_t from_rounds = 0;
      for (int32_t length : spec->round_lengths) from_rounds += length;
      EXPECT_EQ(from_rounds, s.round_tokens);
      EXPECT_EQ(s.new_tokens - 1 - s.round_tokens, s.forwards - 1 - s.rounds);
      // τ = 1 + Σ_k P(first k+1 accepted) when no round is cut short.
      double sum = 1;
      for (size_t k = 0; k < s.reached.size(); ++k) {
        EXPECT_LE(s.reached[k], s.proposed[k]);
        sum += static_cast<double>(s.reached[k]) / s.rounds;
      }
      if (wrong == 0) {
        // A perfect draft: every round commits K + 1 but the last ones.
        EXPECT_EQ(s.reached[3], s.proposed[3]);
        EXPECT_GE(s.tau(), 4.5);
      } else {
        EXPECT_LT(s.tau(), 4.0);
        EXPECT_LT(s.reached[1], s.proposed[1]);
      }
      EXPECT_NEAR(s.tau(), sum, 0.5);
    }
  }
}

// The prefill asks for its last row's logits only; a verification for every
// row it runs (the correction or bonus can come from any of them).
TEST(SpeculativeTest, PrefillAsksForOneRowOfLogitsAndVerificationForAll) {
  const int64_t vocab = 11;
  const torch::Tensor table = Table(vocab, 1, 2.0);
  TableTarget target(table);
  TableDraft draft(table, 4, 3);
  DecodeOptions options;
  options.max_new_tokens = 20;
  const std::vector<int32_t> prompt = {1, 7, 3, 5, 2};
  auto spec = Decode(target, &draft, prompt, options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_GE(target.logit_rows().size(), 3u);
  EXPECT_EQ(target.logit_rows()[0], (std::pair<int64_t, int64_t>{5, 1}));
  int64_t verified = 0;
  for (size_t i = 1; i < target.logit_rows().size(); ++i) {
    EXPECT_EQ(target.logit_rows()[i].second, target.logit_rows()[i].first);
    verified += target.logit_rows()[i].first > 1;
  }
  EXPECT_GT(verified, 2);
}

TEST(SpeculativeTest, StopsAfterAStopTokenLikeTargetOnly) {
  const int64_t vocab = 7;
  const torch::Tensor table = Table(vocab, 5, 1.0);
  TableTarget target(table);
  TableDraft draft(table, 5);
  DecodeOptions options;
  options.max_new_tokens = 200;
  auto plain = Decode(target, nullptr, {1, 2}, options);
  ASSERT_TRUE(plain.ok());
  // Stop at the 7th greedy token's value: both end at its first occurrence.
  options.stop_ids = {plain->tokens[6]};
  auto base = Decode(target, nullptr, {1, 2}, options);
  auto spec = Decode(target, &draft, {1, 2}, options);
  ASSERT_TRUE(base.ok() && spec.ok());
  EXPECT_EQ(spec->tokens, base->tokens);
  EXPECT_LE(base->tokens.size(), 7u);
  EXPECT_EQ(base->tokens.back(), options.stop_ids[0]);
}

// At temperature 1 the committed tokens are distributed as the target's own
// samples: the joint law of the first three tokens after the prompt, by
// chi-square over the 27 outcomes against the exact target probabilities.
TEST(SpeculativeTest, SampledOutputHasTheTargetsDistribution) {
  const int64_t vocab = 3;
  const torch::Tensor target_table = Table(vocab, 2, 1.5);
  // A draft far from the target, so that wrong acceptance would show.
  const torch::Tensor draft_table = Table(vocab, 9, 1.5);
  auto chi_square = [&](Draft* draft, int draws) {
    TableTarget target(target_table);
    std::map<std::vector<int32_t>, int> counts;
    DecodeOptions options;
    options.max_new_tokens = 3;
    options.temperature = 1.0;
    for (int i = 0; i < draws; ++i) {
      options.seed = static_cast<uint64_t>(i);
      auto out = Decode(target, draft, {0, 1}, options);
      EXPECT_TRUE(out.ok());
      ++counts[out->tokens];
    }
    const torch::Tensor p = torch::softmax(target_table, -1);
    double chi2 = 0;
    for (int a = 0; a < vocab; ++a) {
      for (int b = 0; b < vocab; ++b) {
        for (int c = 0; c < vocab; ++c) {
          const double prob = p[0 * vocab + 1][a].item<double>() *
                              p[1 * vocab + a][b].item<double>() *
                              p[a * vocab + b][c].item<double>();
          const double expected = prob * draws;
          const double got = counts[{a, b, c}];
          chi2 += (got - expected) * (got - expected) / expected;
        }
      }
    }
    return chi2;
  };
  // 26 degrees of freedom: P(chi2 > 70) < 1e-5 when the law is right.
  TableDraft draft(draft_table, 2);
  const double spec = chi_square(&draft, 12000);
  EXPECT_LT(spec, 70.0) << "speculative sampling";
  EXPECT_LT(chi_square(nullptr, 12000), 70.0) << "target-only sampling";
  std::cout << "chi-square over 27 outcomes, 12000 draws: " << spec << "\n";
}

}  // namespace
}  // namespace specstream::spec
