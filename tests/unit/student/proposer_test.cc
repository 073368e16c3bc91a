// The drafts' inference path (speculative decoding) against their training
// forward: a proposal is what the training forward's argmax would draft at
// that position, for EAGLE-3 (step 0 at every row) and for DFlash and DSpark
// (a whole block, the Markov head fed the proposed tokens).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/hf_config.h"
#include "common/torch/speculative.h"
#include "common/vocab_map.h"
#include "student/block_draft.h"
#include "student/draft_model.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::student {
namespace {

class ProposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.layers = 4;
    model_.vocab = 96;
    testing::WriteTinyModel(tmp_.path(), model_);
    auto config = LoadHfConfig(tmp_.path());
    ASSERT_TRUE(config.ok()) << config.status();
    shape_ = TargetDraftShape(*config, 2);
  }

  std::vector<int32_t> Ids(int n, int seed) const {
    return testing::RandomTokens(n, model_.vocab - 1, seed);
  }

  testing::TempDir tmp_;
  testing::TinyModelOptions model_;
  DraftShape shape_;
};

TEST_F(ProposerTest, Eagle3FirstTokenIsTheTrainingForwardsArgmaxAtEveryRow) {
  // A draft vocab of half the target's, so the id mapping is exercised.
  TokenCounter counter(model_.vocab);
  std::vector<int32_t> all(model_.vocab);
  for (int32_t i = 0; i < model_.vocab; ++i) all[i] = i;
  ASSERT_TRUE(counter.Add(all, std::vector<uint8_t>(all.size(), 1)).ok());
  auto map = BuildVocabMap(counter, 48);
  ASSERT_TRUE(map.ok()) << map.status();
  DraftShape shape = shape_;
  shape.draft_vocab_size = 48;
  auto created = Eagle3Draft::Create(shape, tmp_.path(), *map, 3, false);
  ASSERT_TRUE(created.ok()) << created.status();
  Eagle3Draft& draft = **created;

  const int64_t t = 12, h = shape.hidden_size;
  torch::manual_seed(4);
  const std::vector<int32_t> ids = Ids(t, 9);
  const torch::Tensor aux = torch::randn({t, 2 * h});
  // The first drafted token after each prefix ids[0..p+1], from aux[0..p].
  std::mt19937_64 rng(0);
  spec::TokenChooser chooser(0, &rng);
  std::vector<int64_t> first(t - 1);
  for (int64_t p = 0; p + 1 < t; ++p) {
    std::vector<int32_t> prefix(ids.begin(), ids.begin() + p + 2), tokens;
    ASSERT_TRUE(draft.Propose(prefix, aux.narrow(0, 0, p + 1), 3, chooser, &tokens).ok());
    ASSERT_EQ(tokens.size(), 3u);
    ASSERT_EQ(map->t2d[tokens[0]], 1) << "a proposal outside the draft vocab";
    first[p] = tokens[0];
  }
  // Training step 0: row p predicts the teacher's argmax at p + 1. A
  // teacher whose argmax there is the proposal makes every valid row
  // correct exactly when the two paths agree.
  auto lm = LoadTargetEmbeddings(tmp_.path(), model_.vocab, h, torch::kCPU);
  ASSERT_TRUE(lm.ok()) << lm.status();
  DraftBatch batch;
  batch.input_ids = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end())).unsqueeze(0);
  batch.loss_mask = torch::ones({1, t}, torch::kUInt8);
  batch.aux_hidden = aux.unsqueeze(0);
  batch.last_hidden = torch::zeros({1, t, h});
  for (int64_t p = 0; p + 1 < t; ++p) batch.last_hidden[0][p + 1] = lm->second[first[p]] * 50;
  batch.target_ids = torch::zeros({1, t}, torch::kInt64);
  for (int64_t p = 0; p + 1 < t; ++p) batch.target_ids[0][p + 1] = first[p];
  batch.lengths = torch::tensor({t});
  batch.host_lengths = {t};
  torch::NoGradGuard no_grad;
  const torch::Tensor valid = draft.CountValid(batch, 1);
  auto out = draft.Forward(batch, 1, valid, torch::kFloat32);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->valid[0].item<int64_t>(), t - 1);
  EXPECT_EQ(out->correct[0].item<int64_t>(), t - 1);
}

TEST_F(ProposerTest, BlockProposalIsTheTrainingForwardsArgmaxAtTheLastPosition) {
  for (BlockDraftKind kind : {BlockDraftKind::kDFlash, BlockDraftKind::kDSpark}) {
    SCOPED_TRACE(BlockDraftKindName(kind));
    BlockDraftOptions o;
    o.kind = kind;
    o.num_layers = 2;
    o.block_size = 5;
    o.mask_token_id = model_.vocab - 1;
    o.target_layer_ids = {1, 2};
    o.markov_rank = 6;
    auto created = BlockDraft::Create(shape_, o, tmp_.path(), 5);
    ASSERT_TRUE(created.ok()) << created.status();
    BlockDraft& draft = **created;
    {
      // W2 away from its zero init, so the Markov term decides tokens.
      torch::NoGradGuard no_grad;
      if (kind == BlockDraftKind::kDSpark) {
        draft.parameter("markov_head.markov_w2.weight").normal_(0, 0.5);
      }
    }
    const int64_t n = 9, h = shape_.hidden_size;
    torch::manual_seed(6);
    const std::vector<int32_t> ids = Ids(n, 4);
    const torch::Tensor aux = torch::randn({n - 1, 2 * h});
    std::mt19937_64 rng(0);
    spec::TokenChooser chooser(0, &rng);
    std::vector<int32_t> proposal;
    ASSERT_TRUE(draft.Propose(ids, aux, 100, chooser, &proposal).ok());
    ASSERT_EQ(static_cast<int64_t>(proposal.size()), draft.proposal_length());
    std::vector<int32_t> shorter;
    ASSERT_TRUE(draft.Propose(ids, aux, 2, chooser, &shorter).ok());
    EXPECT_EQ(shorter, std::vector<int32_t>(proposal.begin(), proposal.begin() + 2));

    // Teacher forcing with the proposal as the continuation: the block at
    // anchor n-1 has every trained slot's label equal to its proposal, so
    // each is counted correct iff the forward's argmax is the proposal.
    std::vector<int64_t> sequence(ids.begin(), ids.end());
    sequence.insert(sequence.end(), proposal.begin(), proposal.end());
    const int64_t len = static_cast<int64_t>(sequence.size());
    DraftBatch batch;
    batch.input_ids = torch::tensor(sequence).unsqueeze(0);
    batch.loss_mask = torch::ones({1, len}, torch::kUInt8);
    // Rows from the anchor on are outside the block's context.
    batch.aux_hidden = torch::cat({aux, torch::randn({len - (n - 1), 2 * h})}).unsqueeze(0);
    batch.last_hidden = torch::randn({1, len, h});
    batch.lengths = torch::tensor({len});
    batch.host_lengths = {len};
    BlockAnchors anchors;
    anchors.anchors = torch::tensor({n - 1}).view({1, 1});
    anchors.keep = torch::ones({1, 1}, torch::kBool);
    torch::NoGradGuard no_grad;
    auto out = draft.Forward(batch, anchors, draft.WeightSum(batch, anchors), torch::kFloat32);
    ASSERT_TRUE(out.ok()) << out.status();
    const int64_t first = kind == BlockDraftKind::kDSpark ? 0 : 1;
    for (int64_t k = first; k < o.block_size; ++k) {
      EXPECT_EQ(out->counted[k].item<int64_t>(), 1) << "slot " << k;
      EXPECT_EQ(out->correct[k].item<int64_t>(), 1) << "slot " << k;
    }
  }
}

TEST_F(ProposerTest, RefusesCapturesThatDoNotMatchTheIds) {
  BlockDraftOptions o;
  o.block_size = 4;
  o.target_layer_ids = {1, 2};
  auto draft = BlockDraft::Create(shape_, o, tmp_.path(), 5);
  ASSERT_TRUE(draft.ok()) << draft.status();
  std::mt19937_64 rng(0);
  spec::TokenChooser chooser(0, &rng);
  std::vector<int32_t> tokens;
  const absl::Status status =
      (*draft)->Propose(Ids(6, 1), torch::zeros({6, 2 * shape_.hidden_size}), 3, chooser, &tokens);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("n-1"), std::string::npos) << status;
  EXPECT_TRUE(tokens.empty());
}

}  // namespace
}  // namespace specstream::student
