// The draft's training step keeps to its device: on the meta device under a
// DeviceAudit (tests/testing/device_audit.h), the draft and its frozen
// tensors load there, the host batch is moved there, and no op of the valid
// counts, the TTT forward, the fused loss, the backward, the clipping or the
// optimizer meets a tensor made on the host (positions, masks, rotary
// tables, loss scales, accumulators). The step reads nothing back, so the
// whole of it runs on meta.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include "common/hf_config.h"
#include "common/torch/compat.h"
#include "common/vocab_map.h"
#include "student/data_source.h"
#include "student/draft_model.h"
#include "student/optimizer.h"
#include "tests/testing/device_audit.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::student {
namespace {

using specstream::testing::DeviceAudit;

// Two samples of `lengths` tokens from a target of `model`'s shape, on the
// host, with or without the teacher's target ids.
DraftBatch HostBatch(const specstream::testing::TinyModelOptions& model, bool with_target_ids) {
  std::vector<TrainingSample> samples;
  int64_t id = 0;
  for (int64_t length : {11, 7}) {
    TrainingSample s;
    s.id = id++;
    s.length = length;
    s.input_ids = torch::randint(model.vocab, {length}, torch::kInt64);
    s.loss_mask = torch::ones({length}, torch::kUInt8);
    s.aux_hidden = torch::randn({length, 3 * model.hidden});
    s.last_hidden = torch::randn({length, model.hidden});
    if (with_target_ids) s.target_ids = torch::randint(model.vocab, {length}, torch::kInt64);
    samples.push_back(std::move(s));
  }
  return Collate(samples, 0);
}

TEST(DraftDeviceTest, TrainingStepOnMetaMakesNothingOnTheHost) {
  if (!SPECSTREAM_TORCH_2) {
    GTEST_SKIP() << "LibTorch 1.13 has no meta kernel for index_select (the embedding lookup); "
                    "this check runs on LibTorch 2.x (tests/torch2.sh)";
  }
  specstream::testing::TempDir dir;
  specstream::testing::TinyModelOptions model;
  specstream::testing::WriteTinyModel(dir.path(), model);
  auto config = LoadHfConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  TokenCounter counter(model.vocab);
  std::vector<int32_t> ids(model.vocab);
  for (int32_t i = 0; i < model.vocab; ++i) ids[i] = i;
  ASSERT_TRUE(counter.Add(ids, std::vector<uint8_t>(ids.size(), 1)).ok());
  auto map = BuildVocabMap(counter, 48);
  ASSERT_TRUE(map.ok()) << map.status();
  DraftShape shape;
  shape.hidden_size = shape.target_hidden_size = config->hidden_size;
  shape.intermediate_size = config->intermediate_size;
  shape.num_attention_heads = config->num_attention_heads;
  shape.num_key_value_heads = config->num_key_value_heads;
  shape.head_dim = config->head_dim;
  shape.draft_vocab_size = map->draft_vocab();
  shape.target_vocab_size = config->vocab_size;
  shape.max_position_embeddings = config->max_position_embeddings;
  const torch::Device meta(torch::kMeta);
  // With target ids from the teacher, and without (the full lm_head then
  // computes the teacher's argmax on the device).
  for (bool with_target_ids : {true, false}) {
    SCOPED_TRACE(with_target_ids ? "with target ids" : "argmax from last_hidden");
    auto draft = Eagle3Draft::Create(shape, dir.path(), *map, 1, !with_target_ids, meta);
    ASSERT_TRUE(draft.ok()) << draft.status();
    for (const auto& [name, p] : (*draft)->parameters()) EXPECT_TRUE(p.is_meta()) << name;
    for (auto& [name, p] : (*draft)->parameters()) p.mutable_grad() = torch::zeros_like(p);
    AdamW optimizer((*draft)->parameters(), AdamWOptions{});
    const DraftBatch batch = ToDevice(HostBatch(model, with_target_ids), meta);
    ASSERT_TRUE(batch.input_ids.is_meta() && batch.lengths.is_meta());
    for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
      DeviceAudit audit;
      const torch::Tensor valid = (*draft)->CountValid(batch, 3);
      auto out = (*draft)->Forward(batch, 3, valid, dtype);
      ASSERT_TRUE(out.ok()) << out.status();
      out->weighted_loss.backward();
      const torch::Tensor norm = ClipGradNorm((*draft)->parameters(), 0.5);
      optimizer.Step(1e-3);
      EXPECT_GT(audit.ops(), 200);
      EXPECT_TRUE(audit.mixed().empty())
          << audit.mixed().size() << " ops mix devices, first " << audit.mixed()[0];
      EXPECT_TRUE(valid.is_meta() && out->loss_sum.is_meta() && out->correct.is_meta() &&
                  norm.is_meta());
      EXPECT_EQ(out->loss_sum.sizes(), (std::vector<int64_t>{3}));
    }
  }
}

}  // namespace
}  // namespace specstream::student
