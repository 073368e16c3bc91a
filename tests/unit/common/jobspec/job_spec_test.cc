#include "common/jobspec/job_spec.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream::jobspec {
namespace {

using ::testing::HasSubstr;

// A complete, valid spec; refusal tests edit one line of it.
constexpr char kValid[] = R"(name: llama-eagle3
data:
  store: /data/store
  max_length: 2048
model:
  target: /models/llama
  draft:
    draft_vocab_size: 32000
optimizer:
  lr: 1.0e-4
  betas: [0.9, 0.95]
  weight_decay: 0.0
  grad_clip: 0.5
  warmup_ratio: 0.02
  schedule: cosine
  min_lr_ratio: 0.1
training:
  epochs: 10
  batch_size: 1
  ttt_steps: 7
  seed: 42
  dtype: bfloat16
  log_every: 10
checkpoint:
  dir: /ckpt
  every_steps: 1000
  keep_last: 3
export:
  dir: /export
parallel:
  cp_size: 2
  cp_mode: ring
metrics:
  jsonl: /logs/metrics.jsonl
)";

std::string Edit(const std::string& from, const std::string& to) {
  std::string text = kValid;
  EXPECT_NE(text.find(from), std::string::npos) << from;
  return absl::StrReplaceAll(text, {{from, to}});
}

TEST(JobConfigTest, FullValidExample) {
  auto spec = ParseJobSpecYaml(kValid);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "llama-eagle3");
  EXPECT_EQ(spec->data().store(), "/data/store");
  EXPECT_EQ(spec->data().max_length(), 2048);
  EXPECT_EQ(spec->model().target(), "/models/llama");
  EXPECT_EQ(spec->model().draft().draft_vocab_size(), 32000);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 1e-4);
  ASSERT_EQ(spec->optimizer().betas_size(), 2);
  EXPECT_DOUBLE_EQ(spec->optimizer().betas(1), 0.95);
  EXPECT_DOUBLE_EQ(spec->optimizer().warmup_ratio(), 0.02);
  EXPECT_EQ(spec->training().epochs(), 10);
  EXPECT_EQ(spec->training().seed(), 42u);
  EXPECT_EQ(spec->checkpoint().keep_last(), 3);
  EXPECT_EQ(spec->parallel().cp_size(), 2);
  EXPECT_EQ(spec->metrics().jsonl(), "/logs/metrics.jsonl");
}

TEST(JobConfigTest, CheckedInExampleIsValid) {
  auto spec = LoadJobSpec(testing::SourceDir() + "/deploy/local/example-job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->model().target().empty());
}

TEST(JobConfigTest, DefaultsAreFilled) {
  auto spec = ParseJobSpecYaml(R"(
data: {store: /s}
model: {target: /t, draft: {vocab_map: /m.safetensors}}
optimizer: {lr: 0.001}
training: {max_steps: 100, batch_tokens: 8192}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->optimizer().betas_size(), 2);
  EXPECT_DOUBLE_EQ(spec->optimizer().betas(0), 0.9);
  EXPECT_DOUBLE_EQ(spec->optimizer().betas(1), 0.95);
  EXPECT_DOUBLE_EQ(spec->optimizer().eps(), 1e-8);
  EXPECT_EQ(spec->optimizer().schedule(), "cosine");
  EXPECT_EQ(spec->training().ttt_steps(), 7);
  EXPECT_EQ(spec->training().dtype(), "bfloat16");
  EXPECT_EQ(spec->training().log_every(), 1);
  EXPECT_EQ(spec->training().device(), "auto");
  EXPECT_EQ(spec->parallel().cp_size(), 1);
  EXPECT_EQ(spec->parallel().cp_mode(), "ring");
  EXPECT_EQ(spec->parallel().rendezvous_timeout_s(), 120);
  // Validation is idempotent on a valid spec.
  v1::JobSpec again = *spec;
  ASSERT_TRUE(ValidateJobSpec(again).ok());
  EXPECT_EQ(again.SerializeAsString(), spec->SerializeAsString());
}

TEST(JobConfigTest, UlyssesDegreeDefaultsToCpSizeUnderUlysses) {
  auto spec = ParseJobSpecYaml(Edit("cp_mode: ring", "cp_mode: ulysses"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel().ulysses_degree(), 2);
  spec = ParseJobSpecYaml(
      Edit("cp_size: 2\n  cp_mode: ring", "cp_size: 4\n  cp_mode: usp\n  ulysses_degree: 2"));
  ASSERT_TRUE(spec.ok()) << spec.status();
}

struct Refusal {
  std::string from;
  std::string to;
  std::string field;  // must appear in the message
};

TEST(JobConfigTest, TrainingDevicesAccepted) {
  for (const std::string device : {"auto", "cpu", "cuda", "cuda:0", "cuda:12"}) {
    auto spec =
        ParseJobSpecYaml(Edit("dtype: bfloat16", "dtype: bfloat16\n  device: \"" + device + "\""));
    ASSERT_TRUE(spec.ok()) << device << ": " << spec.status();
    EXPECT_EQ(spec->training().device(), device);
  }
}

TEST(JobConfigTest, EveryRefusalNamesItsField) {
  const std::vector<Refusal> cases = {
      {"  store: /data/store\n", "", "data.store"},
      {"  max_length: 2048", "  max_length: -1", "data.max_length"},
      {"  target: /models/llama\n", "", "model.target"},
      {"  lr: 1.0e-4", "  lr: 0", "optimizer.lr"},
      {"  lr: 1.0e-4", "  lr: -0.1", "optimizer.lr"},
      {"betas: [0.9, 0.95]", "betas: [0.9]", "optimizer.betas"},
      {"betas: [0.9, 0.95]", "betas: [0.9, 0.95, 0.99]", "optimizer.betas"},
      {"betas: [0.9, 0.95]", "betas: [0.9, 1.0]", "optimizer.betas[1]"},
      {"betas: [0.9, 0.95]", "betas: [-0.1, 0.95]", "optimizer.betas[0]"},
      {"  epochs: 10\n", "", "training.epochs"},
      {"  epochs: 10\n", "  epochs: 10\n  max_steps: 5\n", "training.max_steps"},
      {"  epochs: 10\n", "  epochs: -3\n", "training.epochs"},
      {"  batch_size: 1\n", "", "training.batch_size"},
      {"  batch_size: 1\n", "  batch_size: 1\n  batch_tokens: 4096\n", "training.batch_tokens"},
      {"ttt_steps: 7", "ttt_steps: 33", "training.ttt_steps"},
      {"ttt_steps: 7", "ttt_steps: -1", "training.ttt_steps"},
      {"dtype: bfloat16", "dtype: float16", "training.dtype"},
      {"dtype: bfloat16", "dtype: bfloat16\n  device: gpu0", "training.device"},
      {"dtype: bfloat16", "dtype: bfloat16\n  device: \"cuda:\"", "training.device"},
      {"dtype: bfloat16", "dtype: bfloat16\n  device: cuda:x1", "training.device"},
      {"schedule: cosine", "schedule: linear", "optimizer.schedule"},
      {"warmup_ratio: 0.02", "warmup_ratio: 0.02\n  warmup_steps: 10", "optimizer.warmup_ratio"},
      {"warmup_ratio: 0.02", "warmup_ratio: 1.0", "optimizer.warmup_ratio"},
      {"warmup_ratio: 0.02", "warmup_ratio: -0.5", "optimizer.warmup_ratio"},
      {"min_lr_ratio: 0.1", "min_lr_ratio: 1.5", "optimizer.min_lr_ratio"},
      {"min_lr_ratio: 0.1", "min_lr_ratio: -0.1", "optimizer.min_lr_ratio"},
      {"grad_clip: 0.5", "grad_clip: -1", "optimizer.grad_clip"},
      {"weight_decay: 0.0", "weight_decay: -0.1", "optimizer.weight_decay"},
      {"every_steps: 1000", "every_steps: -5", "checkpoint.every_steps"},
      {"  dir: /ckpt\n", "", "checkpoint.every_steps"},
      {"keep_last: 3", "keep_last: -1", "checkpoint.keep_last"},
      {"draft_vocab_size: 32000", "draft_vocab_size: -1", "model.draft.draft_vocab_size"},
      {"draft_vocab_size: 32000", "draft_vocab_size: 32000\n    vocab_map: /m",
       "model.draft.vocab_map"},
      {"    draft_vocab_size: 32000\n", "    hidden_size: 64\n", "model.draft.draft_vocab_size"},
      {"cp_size: 2", "cp_size: -1", "parallel.cp_size"},
      {"cp_mode: ring", "cp_mode: tree", "parallel.cp_mode"},
      {"cp_mode: ring", "cp_mode: usp\n  ulysses_degree: 3", "parallel.ulysses_degree"},
      {"cp_mode: ring", "cp_mode: usp", "parallel.ulysses_degree"},
      {"cp_mode: ring", "cp_mode: ulysses\n  ulysses_degree: 1", "parallel.ulysses_degree"},
      {"cp_mode: ring", "cp_mode: ring\n  ulysses_degree: 2", "parallel.ulysses_degree"},
      {"cp_mode: ring", "cp_mode: ring\n  rendezvous_timeout_s: -1",
       "parallel.rendezvous_timeout_s"},
      {"cp_mode: ring", "cp_mode: ring\n  rendezvous_timeout_s: 1e9",
       "parallel.rendezvous_timeout_s"},
      // Online data: teachers instead of a store.
      {"  store: /data/store\n", "  store: /data/store\n  teachers: [\"t:1\"]\n", "data.store"},
      {"  store: /data/store\n", "  teachers: [\"t:1\"]\n", "data.tokenized"},
      {"  store: /data/store\n", "  store: /data/store\n  tokenized: /d.jsonl\n", "data.tokenized"},
      {"  store: /data/store\n", "  tokenized: /d.jsonl\n  teachers: [\"t:1\", \"nohost\"]\n",
       "data.teachers[1]"},
      {"  store: /data/store\n", "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  transport: udp\n",
       "data.transport"},
      {"  store: /data/store\n", "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  in_flight: -2\n",
       "data.in_flight"},
      // P13 item 16: values that used to wrap when narrowed (credit 0, a
      // negative stored count) are refused before any narrowing.
      {"  store: /data/store\n",
       "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  in_flight: 4294967296\n", "data.in_flight"},
      // P13 item 8: the reconnection grace is bounded and not negative.
      {"  store: /data/store\n",
       "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  teacher_grace_s: -1\n",
       "data.teacher_grace_s"},
      {"  store: /data/store\n",
       "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  teacher_grace_s: 86401\n",
       "data.teacher_grace_s"},
      {"  store: /data/store\n",
       "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  teacher_grace_s: 1e9\n",
       "data.teacher_grace_s"},
      // P19: regeneration is online only, with a budget and a temperature
      // that make sense.
      {"  store: /data/store\n", "  store: /data/store\n  regenerate: {temperature: 0.7}\n",
       "data.regenerate"},
      {"  store: /data/store\n",
       "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  regenerate: {max_new_tokens: -1}\n",
       "data.regenerate.max_new_tokens"},
      {"  store: /data/store\n",
       "  tokenized: /d.jsonl\n  teachers: [\"t:1\"]\n  regenerate: {temperature: -0.5}\n",
       "data.regenerate.temperature"},
      {"metrics:", "max_restarts: 2147483648\nmetrics:", "max_restarts"},
      {"metrics:", "max_restarts: -1\nmetrics:", "max_restarts"},
      {"keep_last: 3", "keep_last: 4294967297", "checkpoint.keep_last"},
  };
  for (const Refusal& c : cases) {
    auto spec = ParseJobSpecYaml(Edit(c.from, c.to));
    ASSERT_FALSE(spec.ok()) << "accepted: " << c.to;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.field + ":"))
        << "edit '" << c.from << "' -> '" << c.to << "'";
  }
}

// Validating a valid spec again changes nothing, and its JSON (as the fuzz
// target prints it) parses back to the same spec.
void ExpectIdempotent(const v1::JobSpec& spec) {
  v1::JobSpec again = spec;
  ASSERT_TRUE(ValidateJobSpec(again).ok()) << spec.ShortDebugString();
  EXPECT_EQ(JobSpecFingerprint(again), JobSpecFingerprint(spec)) << again.ShortDebugString();
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json, print).ok());
  auto reparsed = ParseJobSpecYaml(json);
  ASSERT_TRUE(reparsed.ok()) << reparsed.status() << "\n" << json;
  EXPECT_EQ(JobSpecFingerprint(*reparsed), JobSpecFingerprint(spec)) << json;
}

// kValid as a block-draft job: model.draft holds `type` and `draft_lines`
// (each indented under draft), no ttt_steps, cp_size 1.
std::string BlockSpec(const std::string& type, const std::string& draft_lines = "") {
  std::string text =
      Edit("    draft_vocab_size: 32000\n", "    type: " + type + "\n" + draft_lines);
  text = absl::StrReplaceAll(text, {{"  ttt_steps: 7\n", ""}, {"cp_size: 2", "cp_size: 1"}});
  return text;
}

TEST(JobConfigTest, DraftTypeDefaultsToEagle3AndLeavesBlockFieldsUnset) {
  auto spec = ParseJobSpecYaml(kValid);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::DraftSpec& draft = spec->model().draft();
  EXPECT_EQ(draft.type(), "eagle3");
  EXPECT_EQ(spec->training().ttt_steps(), 7);
  EXPECT_EQ(draft.num_layers(), 0);
  EXPECT_EQ(draft.block_size(), 0);
  EXPECT_FALSE(draft.has_loss_decay_gamma());
  EXPECT_FALSE(draft.has_loss_weights());
  EXPECT_FALSE(draft.has_enable_confidence_head());
  ExpectIdempotent(*spec);
  EXPECT_TRUE(
      ParseJobSpecYaml(Edit("    draft_vocab_size", "    type: eagle3\n    draft_vocab_size"))
          .ok());
}

TEST(JobConfigTest, DflashDefaultsAreFilled) {
  auto spec = ParseJobSpecYaml(BlockSpec("dflash"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::DraftSpec& draft = spec->model().draft();
  EXPECT_EQ(draft.type(), "dflash");
  EXPECT_EQ(draft.num_layers(), 1);
  EXPECT_EQ(draft.block_size(), 16);
  EXPECT_EQ(draft.num_anchors(), 512);
  EXPECT_EQ(draft.loss_decay_gamma(), 7);
  // Resolved at start, against the target.
  EXPECT_FALSE(draft.has_mask_token_id());
  EXPECT_EQ(draft.target_layer_ids_size(), 0);
  // Neither EAGLE-3's nor DSpark's fields are filled.
  EXPECT_EQ(spec->training().ttt_steps(), 0);
  EXPECT_EQ(draft.draft_vocab_size(), 0);
  EXPECT_EQ(draft.markov_rank(), 0);
  EXPECT_EQ(draft.markov_head_type(), "");
  EXPECT_FALSE(draft.has_enable_confidence_head());
  EXPECT_FALSE(draft.has_loss_weights());
  ExpectIdempotent(*spec);
}

TEST(JobConfigTest, DsparkDefaultsAreFilled) {
  auto spec = ParseJobSpecYaml(BlockSpec("dspark"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::DraftSpec& draft = spec->model().draft();
  EXPECT_EQ(draft.num_layers(), 1);
  EXPECT_EQ(draft.block_size(), 7);
  EXPECT_EQ(draft.num_anchors(), 512);
  EXPECT_EQ(draft.loss_decay_gamma(), 4);
  EXPECT_EQ(draft.markov_rank(), 256);
  EXPECT_EQ(draft.markov_head_type(), "vanilla");
  ASSERT_TRUE(draft.has_enable_confidence_head());
  EXPECT_TRUE(draft.enable_confidence_head());
  ASSERT_TRUE(draft.has_confidence_head_with_markov());
  EXPECT_TRUE(draft.confidence_head_with_markov());
  EXPECT_DOUBLE_EQ(draft.loss_weights().ce(), 0.1);
  EXPECT_DOUBLE_EQ(draft.loss_weights().l1(), 0.9);
  EXPECT_DOUBLE_EQ(draft.loss_weights().conf(), 1.0);
  EXPECT_FALSE(draft.has_mask_token_id());
  EXPECT_EQ(spec->training().ttt_steps(), 0);
  EXPECT_EQ(spec->parallel().cp_size(), 1);
  ExpectIdempotent(*spec);
}

TEST(JobConfigTest, DsparkConfidenceHeadAndItsWeightAgree) {
  // Turning the head off zeroes its weight and its Markov input ...
  auto off = ParseJobSpecYaml(BlockSpec("dspark", "    enable_confidence_head: false\n"));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->model().draft().enable_confidence_head());
  EXPECT_FALSE(off->model().draft().confidence_head_with_markov());
  EXPECT_EQ(off->model().draft().loss_weights().conf(), 0);
  ExpectIdempotent(*off);
  // ... and a zero weight turns the head off.
  auto zero = ParseJobSpecYaml(BlockSpec("dspark", "    loss_weights: {conf: 0}\n"));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_FALSE(zero->model().draft().enable_confidence_head());
  EXPECT_DOUBLE_EQ(zero->model().draft().loss_weights().l1(), 0.9);
  ExpectIdempotent(*zero);
  // The head without the Markov input is a choice of its own.
  auto plain = ParseJobSpecYaml(BlockSpec("dspark", "    confidence_head_with_markov: false\n"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->model().draft().enable_confidence_head());
  EXPECT_FALSE(plain->model().draft().confidence_head_with_markov());
  ExpectIdempotent(*plain);
}

TEST(JobConfigTest, BlockDraftValuesAreKept) {
  auto spec = ParseJobSpecYaml(BlockSpec("dspark",
                                         "    num_layers: 5\n"
                                         "    block_size: 1\n"
                                         "    num_anchors: 65536\n"
                                         "    mask_token_id: 0\n"
                                         "    target_layer_ids: [1, 9, 17, 25, 33]\n"
                                         "    loss_decay_gamma: 2.5\n"
                                         "    markov_rank: 4096\n"
                                         "    markov_head_type: vanilla\n"
                                         "    loss_weights: {ce: 0, l1: 1}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::DraftSpec& draft = spec->model().draft();
  EXPECT_EQ(draft.num_layers(), 5);
  EXPECT_EQ(draft.block_size(), 1);  // DSpark trains every slot
  EXPECT_EQ(draft.num_anchors(), 65536);
  ASSERT_TRUE(draft.has_mask_token_id());  // 0 is an id, not "unset"
  EXPECT_EQ(draft.mask_token_id(), 0);
  EXPECT_THAT(draft.target_layer_ids(), ::testing::ElementsAre(1, 9, 17, 25, 33));
  EXPECT_EQ(draft.loss_decay_gamma(), 2.5);
  EXPECT_EQ(draft.markov_rank(), 4096);
  EXPECT_EQ(draft.loss_weights().ce(), 0);
  EXPECT_EQ(draft.loss_weights().l1(), 1);
  EXPECT_EQ(draft.loss_weights().conf(), 1);
  ExpectIdempotent(*spec);

  auto dflash = ParseJobSpecYaml(
      BlockSpec("dflash", "    block_size: 2\n    mask_token_id: 151669\n    num_layers: 64\n"));
  ASSERT_TRUE(dflash.ok()) << dflash.status();
  EXPECT_EQ(dflash->model().draft().block_size(), 2);
  EXPECT_EQ(dflash->model().draft().mask_token_id(), 151669);
  ExpectIdempotent(*dflash);
}

TEST(JobConfigTest, TheDsparkExampleInTheDocsIsValid) {
  const std::string docs = testing::ReadFile(testing::SourceDir() + "/docs/job-config.md");
  const std::string begin = "```yaml\nname: qwen3-8b-dspark\n";
  const size_t at = docs.find(begin);
  ASSERT_NE(at, std::string::npos) << "docs/job-config.md lost its DSpark example";
  const size_t end = docs.find("```\n", at + 8);
  ASSERT_NE(end, std::string::npos);
  auto spec = ParseJobSpecYaml(docs.substr(at + 8, end - at - 8));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().draft().type(), "dspark");
}

TEST(JobConfigTest, BlockDraftsTakeContextParallelismInEveryMode) {
  for (const char* type : {"dflash", "dspark"}) {
    for (const char* parallel : {"cp_size: 2", "cp_size: 4\n  cp_mode: ulysses",
                                 "cp_size: 4\n  cp_mode: usp\n  ulysses_degree: 2"}) {
      auto spec = ParseJobSpecYaml(
          absl::StrReplaceAll(BlockSpec(type), {{"cp_size: 1\n  cp_mode: ring", parallel}}));
      ASSERT_TRUE(spec.ok()) << type << " " << parallel << ": " << spec.status();
      EXPECT_GT(spec->parallel().cp_size(), 1);
    }
  }
}

TEST(JobConfigTest, Eagle31FlagsAreKept) {
  auto spec = ParseJobSpecYaml(Edit("    draft_vocab_size: 32000\n",
                                    "    draft_vocab_size: 32000\n    fc_norm: true\n"
                                    "    norm_output: true\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model().draft().fc_norm());
  EXPECT_TRUE(spec->model().draft().norm_output());
  EXPECT_FALSE(spec->model().draft().norm_before_fc());
  ExpectIdempotent(*spec);
}

TEST(JobConfigTest, PeagleFieldsAreKept) {
  auto spec = ParseJobSpecYaml(Edit("    draft_vocab_size: 32000\n",
                                    "    draft_vocab_size: 32000\n    type: peagle\n"
                                    "    fc_norm: true\n    mask_token_id: 5\n"
                                    "    down_sample_ratio: 0.6\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().draft().type(), "peagle");
  EXPECT_TRUE(spec->model().draft().fc_norm());
  EXPECT_EQ(spec->model().draft().mask_token_id(), 5);
  EXPECT_EQ(spec->model().draft().down_sample_ratio(), 0.6);
  EXPECT_FALSE(spec->model().draft().has_down_sample_ratio_min());
  ExpectIdempotent(*spec);
}

TEST(JobConfigTest, EveryBlockDraftRefusalNamesItsField) {
  struct BlockRefusal {
    std::string spec;
    std::string field;   // must appear in the message, followed by ':'
    std::string reason;  // and this
  };
  auto eagle3 = [](const std::string& line) {
    return Edit("    draft_vocab_size: 32000\n", "    draft_vocab_size: 32000\n    " + line + "\n");
  };
  auto dflash = [](const std::string& line) { return BlockSpec("dflash", "    " + line + "\n"); };
  auto dspark = [](const std::string& line) { return BlockSpec("dspark", "    " + line + "\n"); };
  const std::string block_only = "only for dflash and dspark drafts";
  const std::string dspark_only = "only for dspark drafts";
  const std::vector<BlockRefusal> cases = {
      {BlockSpec("eagle4"), "model.draft.type", "known: eagle3, peagle, dflash, dspark"},
      {BlockSpec("DSpark"), "model.draft.type", "unknown draft type"},
      // EAGLE-3 takes none of the block-draft fields.
      {eagle3("num_layers: 2"), "model.draft.num_layers", block_only},
      {eagle3("block_size: 16"), "model.draft.block_size", block_only},
      {eagle3("num_anchors: 512"), "model.draft.num_anchors", block_only},
      {eagle3("mask_token_id: 0"), "model.draft.mask_token_id",
       "only for peagle, dflash and dspark drafts (model.draft.type is eagle3)"},
      // P-EAGLE takes EAGLE-3's fields, the mask token and its COD shares.
      {eagle3("down_sample_ratio: 0.5"), "model.draft.down_sample_ratio",
       "only for peagle drafts (model.draft.type is eagle3)"},
      {dflash("down_sample_ratio_min: 0.1"), "model.draft.down_sample_ratio_min",
       "only for peagle drafts"},
      {eagle3("type: peagle\n    num_layers: 2"), "model.draft.num_layers", block_only},
      {eagle3("type: peagle\n    down_sample_ratio: 1"), "model.draft.down_sample_ratio",
       "must be in (0, 1), got 1"},
      {eagle3("type: peagle\n    down_sample_ratio_min: 1.5"), "model.draft.down_sample_ratio_min",
       "must be in [0, 1], got 1.5"},
      {eagle3("type: peagle\n    mask_token_id: -2"), "model.draft.mask_token_id", "got -2"},
      {eagle3("target_layer_ids: [1, 2]"), "model.draft.target_layer_ids", block_only},
      {eagle3("loss_decay_gamma: 7"), "model.draft.loss_decay_gamma", block_only},
      {eagle3("type: eagle3\n    block_size: 16"), "model.draft.block_size", block_only},
      {eagle3("markov_rank: 256"), "model.draft.markov_rank", dspark_only},
      {eagle3("markov_head_type: vanilla"), "model.draft.markov_head_type", dspark_only},
      {eagle3("enable_confidence_head: false"), "model.draft.enable_confidence_head", dspark_only},
      {eagle3("confidence_head_with_markov: true"), "model.draft.confidence_head_with_markov",
       dspark_only},
      {eagle3("loss_weights: {ce: 1}"), "model.draft.loss_weights", dspark_only},
      // EAGLE 3.1's flags are EAGLE-3's, and its two norms exclude each other.
      {dflash("fc_norm: true"), "model.draft.fc_norm", "only for eagle3 drafts"},
      {dspark("norm_output: true"), "model.draft.norm_output", "only for eagle3 drafts"},
      {dspark("norm_before_fc: true"), "model.draft.norm_before_fc", "only for eagle3 drafts"},
      {eagle3("fc_norm: true\n    norm_before_fc: true"), "model.draft.fc_norm",
       "together with model.draft.norm_before_fc"},
      // DFlash takes none of DSpark's.
      {dflash("markov_rank: 256"), "model.draft.markov_rank", dspark_only},
      {dflash("markov_head_type: vanilla"), "model.draft.markov_head_type", dspark_only},
      {dflash("enable_confidence_head: true"), "model.draft.enable_confidence_head", dspark_only},
      {dflash("confidence_head_with_markov: false"), "model.draft.confidence_head_with_markov",
       dspark_only},
      {dflash("loss_weights: {}"), "model.draft.loss_weights", dspark_only},
      // Block drafts predict with the target's full-vocab lm_head.
      {dflash("draft_vocab_size: 32000"), "model.draft.draft_vocab_size", "only for eagle3"},
      {dspark("draft_vocab_size: 32000"), "model.draft.draft_vocab_size", "full-vocab lm_head"},
      {dspark("vocab_map: /m.safetensors"), "model.draft.vocab_map", "only for eagle3"},
      // ... have no TTT unroll ...
      {absl::StrReplaceAll(BlockSpec("dflash"), {{"  seed: 42", "  ttt_steps: 7\n  seed: 42"}}),
       "training.ttt_steps", "only for eagle3 drafts (model.draft.type is dflash)"},
      {absl::StrReplaceAll(BlockSpec("dspark"), {{"  seed: 42", "  ttt_steps: -1\n  seed: 42"}}),
       "training.ttt_steps", "only for eagle3"},
      // Ranges.
      {dflash("num_layers: 65"), "model.draft.num_layers", "must be in [1, 64], got 65"},
      {dspark("num_layers: -1"), "model.draft.num_layers", "got -1"},
      {dflash("block_size: 1"), "model.draft.block_size",
       "must be >= 2 for dflash (slot 0 is untrained), got 1"},
      {dflash("block_size: -3"), "model.draft.block_size", "must be >= 2 for dflash"},
      {dflash("block_size: 65"), "model.draft.block_size", "must be in [2, 64], got 65"},
      {dspark("block_size: 65"), "model.draft.block_size", "must be in [1, 64], got 65"},
      {dspark("block_size: -1"), "model.draft.block_size", "must be in [1, 64], got -1"},
      {dflash("num_anchors: 65537"), "model.draft.num_anchors", "must be in [1, 65536]"},
      {dspark("num_anchors: -5"), "model.draft.num_anchors", "got -5"},
      {dflash("mask_token_id: -1"), "model.draft.mask_token_id", "must be >= 0, got -1"},
      {dflash("target_layer_ids: [-1, 4]"), "model.draft.target_layer_ids[0]", "must be >= 0"},
      {dspark("target_layer_ids: [1, 9, 9]"), "model.draft.target_layer_ids[2]",
       "ascending and distinct"},
      {dflash("target_layer_ids: [5, 2]"), "model.draft.target_layer_ids[1]", "got 2 after 5"},
      {dflash("loss_decay_gamma: 0"), "model.draft.loss_decay_gamma", "must be > 0 and finite"},
      {dspark("loss_decay_gamma: -4"), "model.draft.loss_decay_gamma", "got -4"},
      {dspark("loss_decay_gamma: Infinity"), "model.draft.loss_decay_gamma", "finite"},
      {dflash("loss_decay_gamma: NaN"), "model.draft.loss_decay_gamma", "finite"},
      {dspark("markov_rank: 4097"), "model.draft.markov_rank", "must be in [1, 4096], got 4097"},
      {dspark("markov_rank: -1"), "model.draft.markov_rank", "got -1"},
      {dspark("markov_head_type: gated"), "model.draft.markov_head_type", "not built yet"},
      {dspark("markov_head_type: rnn"), "model.draft.markov_head_type", "not built yet"},
      {dspark("markov_head_type: linear"), "model.draft.markov_head_type",
       "known: vanilla; gated and rnn are not built yet"},
      {dspark("loss_weights: {ce: -0.1}"), "model.draft.loss_weights.ce", "finite and >= 0"},
      {dspark("loss_weights: {l1: NaN}"), "model.draft.loss_weights.l1", "finite and >= 0"},
      {dspark("loss_weights: {l1: Infinity}"), "model.draft.loss_weights.l1", "finite"},
      {dspark("loss_weights: {conf: -1}"), "model.draft.loss_weights.conf", "finite and >= 0"},
      {dspark("loss_weights: {ce: 0, l1: 0, conf: 0}"), "model.draft.loss_weights",
       "at least one of ce, l1, conf must be > 0"},
      {dspark("enable_confidence_head: true\n    loss_weights: {conf: 0}"),
       "model.draft.loss_weights.conf", "must be > 0 with enable_confidence_head true"},
      {dspark("enable_confidence_head: false\n    loss_weights: {conf: 0.5}"),
       "model.draft.loss_weights.conf", "must be 0 with enable_confidence_head false"},
      {dspark("enable_confidence_head: false\n    confidence_head_with_markov: true"),
       "model.draft.confidence_head_with_markov", "without a confidence head"},
  };
  for (const BlockRefusal& c : cases) {
    auto spec = ParseJobSpecYaml(c.spec);
    ASSERT_FALSE(spec.ok()) << "accepted:\n" << c.spec;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.field + ": "))
        << c.field << " in:\n"
        << c.spec;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.reason)) << c.field;
  }
}

TEST(JobConfigTest, OnlineDataFillsDefaults) {
  auto spec = ParseJobSpecYaml(
      Edit("  store: /data/store\n", "  tokenized: /d.jsonl\n  teachers: [\"a:1\", \"b:2\"]\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().teachers_size(), 2);
  EXPECT_EQ(spec->data().in_flight(), 8);
  EXPECT_EQ(spec->data().transport(), "auto");
  EXPECT_EQ(spec->data().teacher_grace_s(), 60);
}

// data.regenerate: present (even empty) turns regeneration on, with 256
// answer tokens unless it says otherwise.
TEST(JobConfigTest, RegenerateFillsItsBudget) {
  auto spec = ParseJobSpecYaml(Edit("  store: /data/store\n",
                                    "  tokenized: /d.jsonl\n  teachers: [\"a:1\"]\n"
                                    "  regenerate: {temperature: 0.8, seed: 11}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->data().has_regenerate());
  EXPECT_EQ(spec->data().regenerate().max_new_tokens(), 256);
  EXPECT_EQ(spec->data().regenerate().temperature(), 0.8);
  EXPECT_EQ(spec->data().regenerate().seed(), 11u);
  auto plain = ParseJobSpecYaml(
      Edit("  store: /data/store\n", "  tokenized: /d.jsonl\n  teachers: [\"a:1\"]\n"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->data().has_regenerate());
}

TEST(JobConfigTest, TeacherGraceKeepsZeroAndAcceptsItsBounds) {
  for (const auto& [text, seconds] :
       std::vector<std::pair<std::string, double>>{{"0", 0}, {"2.5", 2.5}, {"86400", 86400}}) {
    auto spec = ParseJobSpecYaml(
        Edit("  store: /data/store\n",
             "  tokenized: /d.jsonl\n  teachers: [\"a:1\"]\n  teacher_grace_s: " + text + "\n"));
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_TRUE(spec->data().has_teacher_grace_s());
    EXPECT_EQ(spec->data().teacher_grace_s(), seconds);  // 0 stays 0: fail at once
  }
}

TEST(JobConfigTest, UnknownKeysAreRefusedByTheSchema) {
  auto spec = ParseJobSpecYaml(Edit("  ttt_steps: 7", "  ttt_stpes: 7"));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("ttt_stpes"));

  spec = ParseJobSpecYaml(std::string(kValid) + "extra_section: {a: 1}\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("extra_section"));
}

TEST(JobConfigTest, WrongTypesAreRefusedNamingTheField) {
  for (const auto& [from, to, field] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"epochs: 10", "epochs: ten", "epochs"},
           {"lr: 1.0e-4", "lr: [1, 2]", "lr"},
           {"  store: /data/store", "  store: {a: 1}", "store"},
           {"betas: [0.9, 0.95]", "betas: 0.9", "betas"},
           {"epochs: 10", "epochs: 1.5", "epochs"},
       }) {
    auto spec = ParseJobSpecYaml(Edit(from, to));
    ASSERT_FALSE(spec.ok()) << "accepted: " << to;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(field)) << spec.status();
  }
}

TEST(JobConfigTest, QuotedScalarsStayStrings) {
  // A quoted number is a string, which an int64 field accepts in proto JSON
  // only when it is a decimal; a quoted store path that looks numeric stays
  // a string.
  auto spec = ParseJobSpecYaml(Edit("store: /data/store", "store: '123'"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().store(), "123");
  auto json = JobYamlToJson("a: '1'\nb: 1\nc: 1.5\nd: true\ne: ~\nf: inf\ng: 0x10\nh: \"true\"\n");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json, R"({"a":"1","b":1,"c":1.5,"d":true,"e":null,"f":"inf","g":"0x10","h":"true"})");
}

TEST(JobConfigTest, YamlSyntaxErrorsCarryLineNumbers) {
  auto spec = ParseJobSpecYaml("data:\n  store: /s\nmodel: [unclosed\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job spec YAML: line "));

  spec = ParseJobSpecYaml("data:\n  store: /s\n   bad: indentation\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("line 3"));
}

// P13 item 15: invalid UTF-8 used to escape as an uncaught JSON exception.
TEST(JobConfigTest, InvalidUtf8IsRefusedNamingTheLine) {
  for (const std::string& bad :
       {std::string("\xff"), std::string("\xc3("), std::string("\xed\xa0\x80")}) {
    auto spec = ParseJobSpecYaml(Edit("dir: /export", "dir: /exp" + bad + "ort"));
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("invalid UTF-8"));
    const std::string text = Edit("dir: /export", "dir: /exp" + bad + "ort");
    const size_t at = text.find("/exp");
    const int line = static_cast<int>(std::count(text.begin(), text.begin() + at, '\n')) + 1;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(absl::StrCat("line ", line, ",")))
        << spec.status();
  }
}

// P13 item 14: 1.7 KB of nested aliases expanded to gigabytes (validate
// aborted, a submit took the coordinator down). Expansion is now bounded.
TEST(JobConfigTest, AnAliasBombIsRefusedBeforeItExpands) {
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 12; ++i) {
    bomb += absl::StrCat("a", i, ": &a", i, " [");
    for (int j = 0; j < 10; ++j) absl::StrAppend(&bomb, j == 0 ? "" : ", ", "*a", i - 1);
    bomb += "]\n";
  }
  ASSERT_LT(bomb.size(), 2000u);
  auto spec = ParseJobSpecYaml(bomb);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("nested aliases"));
}

// Found by job_spec_fuzz: yaml-cpp reads "x\0_y" as "x", 0xA0, "y", and
// the JSON dump of that non-UTF-8 string threw out of ParseJobSpecYaml
// (validate aborted; a submit would take the coordinator down). Control
// characters YAML does not allow are refused up front, naming where.
TEST(JobConfigTest, ControlCharactersAreRefusedNamingTheLineAndColumn) {
  for (const std::string& bad : {std::string("\0_", 2), std::string("\0", 1), std::string("\x01"),
                                 std::string("\x1b"), std::string("\x7f")}) {
    const std::string text = Edit("dir: /export", "dir: /exp" + bad + "ort");
    auto spec = ParseJobSpecYaml(text);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    const size_t at = text.find("/exp") + 4;
    const size_t line_start = text.rfind('\n', at) + 1;
    const int line = static_cast<int>(std::count(text.begin(), text.begin() + at, '\n')) + 1;
    EXPECT_THAT(std::string(spec.status().message()),
                HasSubstr(absl::StrCat("line ", line, ", column ", at - line_start + 1,
                                       ": a control character")))
        << spec.status();
  }
  // Tabs, CRLF line ends and non-ASCII text stay fine.
  std::string crlf = absl::StrReplaceAll(kValid, {{"\n", "\r\n"}});
  EXPECT_TRUE(ParseJobSpecYaml(crlf).ok());
  EXPECT_TRUE(ParseJobSpecYaml(Edit("name: llama-eagle3", "name: \"l\tlama \xc3\xa9\"")).ok());
}

// Found by job_spec_fuzz: an alias inside its own anchor is a cycle in
// yaml-cpp's node graph, and the conversion recursed until the stack
// overflowed (14 bytes crashed validate, or a coordinator's submit).
TEST(JobConfigTest, AnAliasInsideItsOwnAnchorIsRefused) {
  for (const std::string cyclic :
       {"name: &a [*a]\n", "data: &d {store: *d}\n", "model: &m {draft: [1, {x: *m}]}\n"}) {
    auto spec = ParseJobSpecYaml(cyclic);
    ASSERT_FALSE(spec.ok()) << cyclic;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("levels deep")) << spec.status();
  }
  // Deep nesting without aliases is refused the same way.
  std::string deep = "name: " + std::string(100, '[') + std::string(100, ']') + "\n";
  auto spec = ParseJobSpecYaml(deep);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("nest more than 64 levels deep"));
}

// P13 item 17: specs past the limit are refused before parsing.
TEST(JobConfigTest, AnOversizedSpecIsRefusedBeforeParsing) {
  std::string big = std::string(kValid) + "# " + std::string(kMaxSpecBytes, 'x') + "\n";
  auto spec = ParseJobSpecYaml(big);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("more than the limit"));
  // A spec at the limit's order of size but within it still parses.
  std::string fine = std::string(kValid) + "# " + std::string(kMaxSpecBytes / 2, 'x') + "\n";
  EXPECT_TRUE(ParseJobSpecYaml(fine).ok());
}

TEST(JobConfigTest, DuplicateKeysAreRefusedWithTheirLine) {
  auto spec = ParseJobSpecYaml("data:\n  store: /a\n  store: /b\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("line 3"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("duplicate key \"data.store\""));
}

TEST(JobConfigTest, EmptyAndNonMapDocumentsAreRefused) {
  EXPECT_FALSE(ParseJobSpecYaml("").ok());
  EXPECT_FALSE(ParseJobSpecYaml("- a\n- b\n").ok());
  EXPECT_FALSE(ParseJobSpecYaml("just a string").ok());
}

TEST(JobConfigTest, LoadJobSpecPrefixesThePath) {
  testing::TempDir dir;
  std::string path = dir.Join("job.yaml");
  testing::WriteFile(path, Edit("  lr: 1.0e-4", "  lr: 0"));
  auto spec = LoadJobSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("optimizer.lr"));
  EXPECT_EQ(LoadJobSpec(dir.Join("missing.yaml")).status().code(), absl::StatusCode::kNotFound);
}

TEST(JobConfigTest, FingerprintIsStableAndSensitive) {
  auto a = ParseJobSpecYaml(kValid);
  auto b = ParseJobSpecYaml(kValid);
  auto c = ParseJobSpecYaml(Edit("lr: 1.0e-4", "lr: 2.0e-4"));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(JobSpecFingerprint(*a), JobSpecFingerprint(*b));
  EXPECT_NE(JobSpecFingerprint(*a), JobSpecFingerprint(*c));
  EXPECT_EQ(JobSpecFingerprint(*a).size(), 16u);
}

}  // namespace
}  // namespace specstream::jobspec
