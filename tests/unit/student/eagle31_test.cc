// EAGLE 3.1's flags on the EAGLE-3 draft (student/draft_model.h
// Eagle3Options): the training forward of each flag against a float64
// reference written here (loss and every gradient), the incremental
// proposal against the training forward's argmax at every TTT step, and
// the export round trip with the keys vLLM reads.
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/file.h"
#include "common/hf_config.h"
#include "common/torch/blocks.h"
#include "common/torch/speculative.h"
#include "common/vocab_map.h"
#include "nlohmann/json.hpp"
#include "student/draft_model.h"
#include "student/eagle3_plugin.h"
#include "student/export.h"
#include "tests/testing/eagle3_draft_fixture.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::student {
namespace {

constexpr int64_t kDraftVocab = testing::Eagle3DraftFixture::kDraftVocab;
constexpr int kSteps = 3;

using Eagle31Test = testing::Eagle3DraftFixture;

// The TTT unroll of DESIGN.md §3 with EAGLE 3.1's flags, written out
// densely in float64 for one sample: at step k, row t reads token
// x[t+k+1], attends to step-0 keys at positions <= t and to its own keys of
// steps 1..k in one softmax (RoPE position t+k), and is trained towards the
// teacher's draft-vocab distribution at t+k+1 where (t, k) is valid. The
// loss is Σ_k 0.8^k · mean over valid (t, k) of the soft cross-entropy.
torch::Tensor ReferenceLoss(const std::map<std::string, torch::Tensor>& w,
                            const Eagle3Options& flags, const DraftShape& s,
                            const torch::Tensor& embed, const torch::Tensor& full_head,
                            const torch::Tensor& teacher_head,
                            const std::vector<int64_t>& used, const DraftBatch& batch) {
  const auto f64 = torch::kFloat64;
  const double eps = s.rms_norm_eps;
  const int64_t t = batch.input_ids.size(1), h = s.hidden_size, ht = s.target_hidden_size;
  const int64_t a_heads = s.num_attention_heads, kv = s.num_key_value_heads, d = s.head_dim;
  auto W = [&](const std::string& name) { return w.at(name); };
  auto norm = [&](const torch::Tensor& x, const torch::Tensor& weight) {
    torch::Tensor r = x * torch::rsqrt(x.pow(2).mean(-1, true) + eps);
    return r * weight;
  };
  // Teacher: distribution over the draft vocab, argmax over the full vocab
  // (the draft head's rows are the full head's used rows).
  const torch::Tensor last = batch.last_hidden[0].to(f64);
  const torch::Tensor teacher_logp = torch::log_softmax(torch::matmul(last, teacher_head.t()), -1);
  const torch::Tensor full_argmax = torch::matmul(last, full_head.t()).argmax(-1);
  std::vector<bool> in_vocab(t);
  std::vector<bool> used_id(embed.size(0), false);
  for (int64_t id : used) used_id[id] = true;
  for (int64_t p = 0; p < t; ++p) in_vocab[p] = used_id[full_argmax[p].item<int64_t>()];

  torch::Tensor aux = batch.aux_hidden[0].to(f64);
  if (flags.fc_norm) {
    std::vector<torch::Tensor> parts;
    for (int64_t i = 0; i < 3; ++i) {
      parts.push_back(norm(aux.narrow(-1, i * ht, ht), W(FcNormTensorName(i))));
    }
    aux = torch::cat(parts, -1);
  }
  if (flags.norm_before_fc) aux = norm(aux, W(kNormBeforeFcTensor));
  torch::Tensor hidden = torch::matmul(aux, W("fc.weight").t());  // [t, h]

  auto rotary = nn::Rotary::Create(d, s.rope_theta, s.rope_scaling, s.max_position_embeddings);
  EXPECT_TRUE(rotary.ok());
  std::vector<torch::Tensor> step_keys, step_values;  // per step [heads, t, d]
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions(f64));
  double decay = 1.0;
  for (int k = 0; k < kSteps; ++k) {
    std::vector<int64_t> next(t, 0);
    for (int64_t p = 0; p + k + 1 < t; ++p) next[p] = batch.input_ids[0][p + k + 1].item<int64_t>();
    const torch::Tensor emb = embed.index_select(0, torch::tensor(next));
    const torch::Tensor x = torch::cat({norm(emb, W("midlayer.input_layernorm.weight")),
                                        norm(hidden, W("midlayer.hidden_norm.weight"))},
                                       -1);
    auto [cos, sin] = rotary->CosSin(torch::arange(k, k + t), f64);
    auto heads = [&](const std::string& name, int64_t count) {
      return torch::matmul(x, W(name).t()).view({t, count, d}).transpose(0, 1);
    };
    const torch::Tensor q = nn::ApplyRotary(heads("midlayer.self_attn.q_proj.weight", a_heads), cos, sin);
    step_keys.push_back(nn::ApplyRotary(heads("midlayer.self_attn.k_proj.weight", kv), cos, sin));
    step_values.push_back(heads("midlayer.self_attn.v_proj.weight", kv));
    // Scores of every query against step 0's keys (causal) and its own
    // position's keys of steps 1..k.
    const int64_t group = a_heads / kv;
    std::vector<torch::Tensor> outputs;
    for (int64_t head = 0; head < a_heads; ++head) {
      const int64_t g = head / group;
      const torch::Tensor qh = q[head];  // [t, d]
      torch::Tensor causal = torch::matmul(qh, step_keys[0][g].t()) / std::sqrt(double(d));
      causal = causal.masked_fill(torch::ones({t, t}, torch::kBool).triu(1), -INFINITY);
      std::vector<torch::Tensor> scores = {causal};
      std::vector<torch::Tensor> values;
      for (int j = 1; j <= k; ++j) {
        scores.push_back((qh * step_keys[j][g]).sum(-1, true) / std::sqrt(double(d)));
      }
      const torch::Tensor prob = torch::softmax(torch::cat(scores, -1), -1);
      torch::Tensor out = torch::matmul(prob.narrow(-1, 0, t), step_values[0][g]);
      for (int j = 1; j <= k; ++j) out = out + prob.narrow(-1, t + j - 1, 1) * step_values[j][g];
      outputs.push_back(out);
    }
    const torch::Tensor attn = torch::stack(outputs, 1).reshape({t, a_heads * d});
    torch::Tensor next_hidden = hidden + torch::matmul(attn, W("midlayer.self_attn.o_proj.weight").t());
    const torch::Tensor m = norm(next_hidden, W("midlayer.post_attention_layernorm.weight"));
    next_hidden = next_hidden +
                  torch::matmul(torch::silu(torch::matmul(m, W("midlayer.mlp.gate_proj.weight").t())) *
                                    torch::matmul(m, W("midlayer.mlp.up_proj.weight").t()),
                                W("midlayer.mlp.down_proj.weight").t());
    const torch::Tensor normed = norm(next_hidden, W("norm.weight"));
    const torch::Tensor logq = torch::log_softmax(torch::matmul(normed, W("lm_head.weight").t()), -1);
    torch::Tensor step_loss = torch::zeros({}, torch::TensorOptions(f64));
    int64_t valid = 0;
    for (int64_t p = 0; p + k + 1 < t; ++p) {
      if (batch.loss_mask[0][p + k].item<int64_t>() == 0 || !in_vocab[p + k + 1]) continue;
      step_loss = step_loss - (teacher_logp[p + k + 1].exp() * logq[p]).sum();
      ++valid;
    }
    loss = loss + decay * step_loss / std::max<int64_t>(valid, 1);
    decay *= 0.8;
    hidden = flags.norm_output ? normed : next_hidden;
  }
  return loss;
}

TEST_F(Eagle31Test, EachFlagMatchesAFloat64Reference) {
  const DraftBatch batch = Batch(14, 7);
  const std::vector<Eagle3Options> cases = {
      {false, false, false}, {true, false, false}, {false, true, false},
      {false, false, true},  {true, true, false},  {false, true, true}};
  auto frozen = LoadTargetEmbeddings(tmp_.path(), model_.vocab, shape_.hidden_size, torch::kCPU);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  const torch::Tensor embed = frozen->first.to(torch::kFloat64);
  const torch::Tensor full_head = frozen->second.to(torch::kFloat64);
  const torch::Tensor teacher_head = full_head.index_select(0, torch::tensor(map_.used));
  for (const Eagle3Options& flags : cases) {
    SCOPED_TRACE(::testing::Message() << "fc_norm " << flags.fc_norm << " norm_output "
                                      << flags.norm_output << " norm_before_fc "
                                      << flags.norm_before_fc);
    std::unique_ptr<Eagle3Draft> draft = Draft(flags);
    ASSERT_NE(draft, nullptr);
    DraftBatch with_ids = batch;
    const torch::Tensor counts = draft->CountValid(with_ids, kSteps);
    auto out = draft->Forward(with_ids, kSteps, counts, torch::kFloat32);
    ASSERT_TRUE(out.ok()) << out.status();
    out->weighted_loss.backward();

    std::map<std::string, torch::Tensor> w = Float64Leaves(*draft);
    const torch::Tensor want =
        ReferenceLoss(w, flags, shape_, embed, full_head, teacher_head, map_.used, batch);
    want.backward();
    const double loss = out->weighted_loss.item<double>();
    EXPECT_NEAR(loss, want.item<double>(), 2e-5 * std::abs(want.item<double>()));
    ExpectGradientsMatch(*draft, w);
    // The flags change the loss: the reference without them disagrees.
    if (flags.any()) {
      std::map<std::string, torch::Tensor> plain = w;
      const double off =
          ReferenceLoss(plain, {}, shape_, embed, full_head, teacher_head, map_.used, batch).item<double>();
      EXPECT_GT(std::abs(off - loss), 1e-4 * std::abs(loss));
    }
  }
}

TEST_F(Eagle31Test, DefaultsAreEagle3BitForBit) {
  // No flag: the same parameters, in the same order, and the same loss.
  auto a = Eagle3Draft::Create(shape_, tmp_.path(), map_, 3, true);
  auto b = Eagle3Draft::Create(shape_, tmp_.path(), map_, 3, true, torch::kCPU, Eagle3Options{});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ((*a)->parameters().size(), 13u);
  // With fc_norm the EAGLE-3 parameters keep their initial values.
  auto c = Eagle3Draft::Create(shape_, tmp_.path(), map_, 3, true, torch::kCPU,
                               Eagle3Options{true, true, false});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ((*c)->parameters().size(), 16u);
  for (size_t i = 0; i < (*a)->parameters().size(); ++i) {
    EXPECT_EQ((*a)->parameters()[i].first, (*c)->parameters()[i].first);
    EXPECT_TRUE(torch::equal((*a)->parameters()[i].second, (*c)->parameters()[i].second));
  }
  const DraftBatch batch = Batch(12, 2);
  auto la = (*a)->Forward(batch, kSteps, (*a)->CountValid(batch, kSteps), torch::kFloat32);
  auto lb = (*b)->Forward(batch, kSteps, (*b)->CountValid(batch, kSteps), torch::kFloat32);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_TRUE(torch::equal(la->weighted_loss, lb->weighted_loss));
  // Both norms at once are refused, naming both fields.
  auto both = Eagle3Draft::Create(shape_, tmp_.path(), map_, 3, false, torch::kCPU,
                                  Eagle3Options{true, false, true});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("model.draft.fc_norm"), std::string::npos);
  EXPECT_NE(both.status().message().find("model.draft.norm_before_fc"), std::string::npos);
}

// The k-th proposed token is the training forward's argmax at step k-1 for
// the row before it, fed the proposed tokens: the chain's recurrence
// (norm_output's post-norm hidden state included) is the training one.
TEST_F(Eagle31Test, ProposalsFollowTheTrainingForwardAtEveryStep) {
  for (const Eagle3Options& flags :
       {Eagle3Options{}, Eagle3Options{true, true, false}, Eagle3Options{false, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "fc_norm " << flags.fc_norm << " norm_output "
                                      << flags.norm_output);
    std::unique_ptr<Eagle3Draft> draft = Draft(flags, 11);
    ASSERT_NE(draft, nullptr);
    const int64_t h = shape_.hidden_size;
    torch::manual_seed(5);
    const torch::Tensor aux = torch::randn({kSteps + 1, 3 * h}) * 2;
    const std::vector<int32_t> prefix = {5, 17};
    std::mt19937_64 rng(0);
    spec::TokenChooser chooser(0, &rng);
    std::vector<int32_t> tokens;
    ASSERT_TRUE(draft->Propose(prefix, aux.narrow(0, 0, 1), kSteps, chooser, &tokens).ok());
    ASSERT_EQ(tokens.size(), static_cast<size_t>(kSteps));
    auto lm = LoadTargetEmbeddings(tmp_.path(), model_.vocab, h, torch::kCPU);
    ASSERT_TRUE(lm.ok()) << lm.status();
    torch::NoGradGuard no_grad;
    for (int k = 1; k <= kSteps; ++k) {
      // ids = prefix + the first k-1 proposals: row 0 at step k-1 reads the
      // proposal k-1 and is the only valid row of that step.
      std::vector<int64_t> ids(prefix.begin(), prefix.end());
      for (int j = 0; j + 1 < k; ++j) ids.push_back(tokens[j]);
      const int64_t t = static_cast<int64_t>(ids.size());
      DraftBatch batch;
      batch.input_ids = torch::tensor(ids).unsqueeze(0);
      batch.loss_mask = torch::ones({1, t}, torch::kUInt8);
      batch.aux_hidden = aux.narrow(0, 0, t).unsqueeze(0);
      batch.last_hidden = torch::zeros({1, t, h});
      batch.target_ids = torch::zeros({1, t}, torch::kInt64);
      // The teacher at position k names proposal k (0-based k-1).
      batch.last_hidden[0][k] = lm->second[tokens[k - 1]] * 50;
      batch.target_ids[0][k] = tokens[k - 1];
      batch.lengths = torch::tensor({t});
      batch.host_lengths = {t};
      auto out = draft->Forward(batch, k, draft->CountValid(batch, k), torch::kFloat32);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->valid[k - 1].item<int64_t>(), 1) << "step " << k - 1;
      EXPECT_EQ(out->correct[k - 1].item<int64_t>(), 1) << "step " << k - 1;
    }
  }
}

// A decode calls Propose with a growing committed prefix; the rows it shares
// with the call before keep their step-0 keys. The tokens equal those of a
// draft proposing from scratch each time (the same weights, no cache).
TEST_F(Eagle31Test, CachedProposalsEqualProposalsFromScratch) {
  for (const Eagle3Options& flags : {Eagle3Options{}, Eagle3Options{true, true, false}}) {
    std::unique_ptr<Eagle3Draft> warm = Draft(flags, 21);
    ASSERT_NE(warm, nullptr);
    const int64_t t = 20;
    torch::manual_seed(8);
    const torch::Tensor aux = torch::randn({t, 3 * shape_.hidden_size}) * 2;
    const std::vector<int32_t> ids = testing::RandomTokens(t + 1, model_.vocab - 1, 4);
    std::mt19937_64 rng(0);
    spec::TokenChooser chooser(0, &rng);
    // Prefixes as a decode grows them (1 to 3 tokens a round), with one
    // rewind to a shorter prefix and a repeated call.
    for (int64_t n : {3, 4, 7, 8, 8, 11, 6, 9, 14, 17}) {
      SCOPED_TRACE(::testing::Message() << "prefix of " << n << " ids");
      const std::vector<int32_t> prefix(ids.begin(), ids.begin() + n);
      std::vector<int32_t> cached, scratch;
      ASSERT_TRUE(warm->Propose(prefix, aux.narrow(0, 0, n - 1), 4, chooser, &cached).ok());
      std::unique_ptr<Eagle3Draft> cold = Draft(flags, 21);
      ASSERT_TRUE(cold->Propose(prefix, aux.narrow(0, 0, n - 1), 4, chooser, &scratch).ok());
      EXPECT_EQ(cached, scratch);
    }
    // New captures under the same ids are not taken from the cache.
    const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 10);
    const torch::Tensor other = torch::randn({9, 3 * shape_.hidden_size}) * 2;
    std::vector<int32_t> cached, scratch;
    ASSERT_TRUE(warm->Propose(prefix, other, 4, chooser, &cached).ok());
    std::unique_ptr<Eagle3Draft> cold = Draft(flags, 21);
    ASSERT_TRUE(cold->Propose(prefix, other, 4, chooser, &scratch).ok());
    EXPECT_EQ(cached, scratch);
  }
}

TEST_F(Eagle31Test, ExportRoundTripCarriesTheFlagsAndTheirNorms) {
  for (const Eagle3Options& flags :
       {Eagle3Options{true, true, false}, Eagle3Options{false, false, true}}) {
    std::unique_ptr<Eagle3Draft> draft = Draft(flags);
    ASSERT_NE(draft, nullptr);
    auto in = DraftExportInput(*draft, tmp_.path(), {1, 2, 3});
    ASSERT_TRUE(in.ok()) << in.status();
    in->config.torch_dtype = "float32";
    const std::string dir = tmp_.Join(flags.fc_norm ? "fc_norm" : "norm_before_fc");
    ASSERT_TRUE(ExportDraft(*in, dir).ok());
    auto text = ReadFileToString(dir + "/config.json");
    ASSERT_TRUE(text.ok());
    const nlohmann::json config = nlohmann::json::parse(*text);
    // The keys vLLM's llama_eagle3 reads: fc_norm and norm_output at the top
    // level, norm_before_fc in eagle_config (and the top level).
    EXPECT_EQ(config.value("fc_norm", false), flags.fc_norm);
    EXPECT_EQ(config.value("norm_output", false), flags.norm_output);
    EXPECT_EQ(config.value("norm_before_fc", false), flags.norm_before_fc);
    EXPECT_EQ(config["eagle_config"].value("norm_before_fc", false), flags.norm_before_fc);
    auto back = ReadExport(dir);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->config.fc_norm, flags.fc_norm);
    EXPECT_EQ(back->config.norm_output, flags.norm_output);
    EXPECT_EQ(back->config.norm_before_fc, flags.norm_before_fc);
    for (const auto& [name, p] : draft->parameters()) {
      ASSERT_TRUE(back->tensors.count(name)) << name;
      EXPECT_TRUE(torch::equal(back->tensors.at(name), p.detach())) << name;
    }
    EXPECT_EQ(back->tensors.count("fc_norm.0.weight"), flags.fc_norm ? 1u : 0u);
    EXPECT_EQ(back->tensors.count("input_norm.weight"), flags.norm_before_fc ? 1u : 0u);
    // A norm missing from an export that sets its flag is refused by name.
    ExportInput broken = *in;
    broken.tensors.erase(flags.fc_norm ? "fc_norm.2.weight" : "input_norm.weight");
    const absl::Status refused = ValidateExport(broken);
    EXPECT_NE(refused.message().find(flags.fc_norm ? "fc_norm.2.weight" : "input_norm.weight"),
              std::string::npos)
        << refused;
  }
}

}  // namespace
}  // namespace specstream::student
