// P-EAGLE (student/draft_model.h Eagle3Options::parallel_drafting,
// student/cod_sampling.h): COD sample counts computed by hand, the training
// forward against a float64 reference written here with a dense mask over
// the sampled elements (loss and every gradient), the one-forward proposal
// against that reference's logits, and the export round trip with the keys
// vLLM's parallel drafting reads.
#include <cmath>
#include <map>
#include <random>
#include <set>
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
#include "student/cod_sampling.h"
#include "student/draft.h"
#include "student/draft_model.h"
#include "student/eagle3_plugin.h"
#include "student/export.h"
#include "tests/testing/eagle3_draft_fixture.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::student {
namespace {

constexpr int64_t kDraftVocab = testing::Eagle3DraftFixture::kDraftVocab;
constexpr int kDepths = 4;
constexpr int64_t kMaskToken = 7;

// --- COD sampling ---------------------------------------------------------

TEST(CodSamplingTest, DepthSizesByHand) {
  // n = 20, r = 0.7, r_min = 0.2:
  //   k=1: floor(19 · 0.7)   = floor(13.3)  = 13
  //   k=2: floor(18 · 0.49)  = floor(8.82)  = 8
  //   k=3: floor(17 · 0.343) = floor(5.831) = 5
  //   k=4: floor(16 · 0.2401) = floor(3.84) = 3
  //   k=5: 0.7^5 = 0.168 < 0.2: floor(15 · 0.2) = 3
  //   k=6: floor(14 · 0.2) = 2
  CodOptions o;
  o.depths = 7;
  EXPECT_EQ(CodDepthSizes(20, o), (std::vector<int64_t>{20, 13, 8, 5, 3, 3, 2}));
  // Without a floor the shares reach 0, and every deeper depth stays empty:
  // n = 6, r = 0.5: floor(5 · 0.5) = 2, floor(4 · 0.25) = 1, floor(3 · 0.125) = 0.
  o.ratio = 0.5;
  o.ratio_min = 0;
  o.depths = 6;
  EXPECT_EQ(CodDepthSizes(6, o), (std::vector<int64_t>{6, 2, 1, 0, 0, 0}));
}

TEST(CodSamplingTest, RowsAreNestedValidAndKeyedBySampleAndStep) {
  // Two samples: 20 tokens with the first 4 masked (a prompt) and a hole at
  // 10; 9 tokens, all trained, padded to 20.
  torch::Tensor mask = torch::ones({2, 20}, torch::kUInt8);
  mask[0].narrow(0, 0, 4).zero_();
  mask[0][10] = 0;
  mask[1].narrow(0, 9, 11).zero_();
  const std::vector<int64_t> lengths = {20, 9};
  CodOptions o;
  o.depths = 5;
  const torch::Tensor keep = CodSample(mask, lengths, {3, 8}, 11, 2, o);
  ASSERT_EQ(keep.sizes(), (std::vector<int64_t>{5, 2, 20}));
  auto valid = [&](int64_t b, int64_t p, int64_t k) {
    return p + k + 1 < lengths[b] && mask[b][p + k].item<int64_t>() != 0;
  };
  // Sample 0: L_0(p) holds for p in 4..18 except 10: n = 14.
  // Sample 1: p in 0..7: n = 8.
  const std::vector<std::vector<int64_t>> want_sizes = {CodDepthSizes(14, o), CodDepthSizes(8, o)};
  EXPECT_EQ(want_sizes[0],
            (std::vector<int64_t>{14, 9, 5, 3, 2}));  // 13·.7, 12·.49, 11·.343, 10·.24
  EXPECT_EQ(want_sizes[1], (std::vector<int64_t>{8, 4, 2, 1, 0}));  // 7·.7, 6·.49, 5·.343, 4·.24
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t k = 0; k < 5; ++k) {
      int64_t count = 0, pool = 0;
      for (int64_t p = 0; p < 20; ++p) {
        const bool kept = keep[k][b][p].item<bool>();
        count += kept;
        if (k == 0) EXPECT_EQ(kept, valid(b, p, 0)) << b << " " << p;
        if (k > 0) {
          const bool in_pool = keep[k - 1][b][p].item<bool>() && valid(b, p, k);
          pool += in_pool;
          if (kept) EXPECT_TRUE(in_pool) << "sample " << b << " depth " << k << " row " << p;
        }
      }
      const int64_t want = k == 0 ? want_sizes[b][0] : std::min(want_sizes[b][k], pool);
      EXPECT_EQ(count, want) << "sample " << b << " depth " << k;
    }
  }
  // The same keys, seed and step draw the same rows, whatever else is in
  // the batch; another step draws others.
  const torch::Tensor alone = CodSample(mask.narrow(0, 1, 1), {9}, {8}, 11, 2, o);
  EXPECT_TRUE(torch::equal(alone[0][0], keep[0][1]));
  EXPECT_TRUE(torch::equal(alone.select(1, 0), keep.select(1, 1)));
  const torch::Tensor later = CodSample(mask, lengths, {3, 8}, 11, 3, o);
  EXPECT_FALSE(torch::equal(later, keep));
}

// --- The draft --------------------------------------------------------------

class PeagleTest : public testing::Eagle3DraftFixture {
 protected:
  static Eagle3Options Peagle(bool fc_norm = false) {
    Eagle3Options o;
    o.fc_norm = fc_norm;
    o.parallel_drafting = true;
    o.mask_token_id = kMaskToken;
    return o;
  }
};

// One element of the parallel draft's flattened sequence.
struct Element {
  int64_t anchor, depth;
};

// The P-EAGLE forward of one sample in float64, over an explicit element
// list (every row at depth 0, then the kept rows of each depth), with ONE
// attention under a dense [E, E] mask:
//   element q sees element k iff (depth_k = 0 and anchor_k <= anchor_q) or
//   (anchor_k = anchor_q and depth_k <= depth_q).
// Element (p, d) reads token x[p+1] and fc(aux[p]) at d = 0, the mask token
// and fc(mask_hidden) at d >= 1, at RoPE position p + d. Returns the
// draft-vocab logits [E, draft_vocab].
torch::Tensor ReferenceLogits(const std::map<std::string, torch::Tensor>& w, bool fc_norm,
                              const DraftShape& s, const torch::Tensor& embed,
                              const DraftBatch& batch, const std::vector<Element>& elements) {
  const auto f64 = torch::kFloat64;
  const double eps = s.rms_norm_eps;
  const int64_t t = batch.input_ids.size(1), ht = s.target_hidden_size;
  const int64_t a_heads = s.num_attention_heads, kv = s.num_key_value_heads, d = s.head_dim;
  const int64_t e = static_cast<int64_t>(elements.size());
  auto W = [&](const std::string& name) { return w.at(name); };
  auto norm = [&](const torch::Tensor& x, const torch::Tensor& weight) {
    return x * torch::rsqrt(x.pow(2).mean(-1, true) + eps) * weight;
  };
  auto fc = [&](torch::Tensor captures) {
    if (fc_norm) {
      std::vector<torch::Tensor> parts;
      for (int64_t i = 0; i < 3; ++i) {
        parts.push_back(norm(captures.narrow(-1, i * ht, ht), W(FcNormTensorName(i))));
      }
      captures = torch::cat(parts, -1);
    }
    return torch::matmul(captures, W("fc.weight").t());
  };
  const torch::Tensor aux = batch.aux_hidden[0].to(f64);
  const torch::Tensor mask_hidden = fc(W(kMaskHiddenTensor).view({1, -1}));
  std::vector<torch::Tensor> embeds, hiddens;
  std::vector<int64_t> positions;
  for (const Element& el : elements) {
    const int64_t token =
        el.depth == 0 ? (el.anchor + 1 < t ? batch.input_ids[0][el.anchor + 1].item<int64_t>() : 0)
                      : kMaskToken;
    embeds.push_back(embed[token]);
    hiddens.push_back(el.depth == 0 ? fc(aux[el.anchor].unsqueeze(0))[0] : mask_hidden[0]);
    positions.push_back(el.anchor + el.depth);
  }
  const torch::Tensor hidden = torch::stack(hiddens);
  const torch::Tensor x =
      torch::cat({norm(torch::stack(embeds), W("midlayer.input_layernorm.weight")),
                  norm(hidden, W("midlayer.hidden_norm.weight"))},
                 -1);
  auto rotary = nn::Rotary::Create(d, s.rope_theta, s.rope_scaling, s.max_position_embeddings);
  EXPECT_TRUE(rotary.ok());
  auto [cos, sin] = rotary->CosSin(torch::tensor(positions), f64);
  auto heads = [&](const std::string& name, int64_t count) {
    return torch::matmul(x, W(name).t()).view({e, count, d}).transpose(0, 1);
  };
  const torch::Tensor q =
      nn::ApplyRotary(heads("midlayer.self_attn.q_proj.weight", a_heads), cos, sin);
  const torch::Tensor k = nn::ApplyRotary(heads("midlayer.self_attn.k_proj.weight", kv), cos, sin);
  const torch::Tensor v = heads("midlayer.self_attn.v_proj.weight", kv);
  torch::Tensor visible = torch::zeros({e, e}, torch::kBool);
  for (int64_t i = 0; i < e; ++i) {
    for (int64_t j = 0; j < e; ++j) {
      const Element& qe = elements[i];
      const Element& ke = elements[j];
      visible[i][j] = (ke.depth == 0 && ke.anchor <= qe.anchor) ||
                      (ke.anchor == qe.anchor && ke.depth <= qe.depth);
    }
  }
  std::vector<torch::Tensor> outputs;
  for (int64_t head = 0; head < a_heads; ++head) {
    const int64_t g = head / (a_heads / kv);
    torch::Tensor scores = torch::matmul(q[head], k[g].t()) / std::sqrt(double(d));
    scores = scores.masked_fill(visible.logical_not(), -INFINITY);
    outputs.push_back(torch::matmul(torch::softmax(scores, -1), v[g]));
  }
  const torch::Tensor attn = torch::stack(outputs, 1).reshape({e, a_heads * d});
  torch::Tensor out = hidden + torch::matmul(attn, W("midlayer.self_attn.o_proj.weight").t());
  const torch::Tensor m = norm(out, W("midlayer.post_attention_layernorm.weight"));
  out = out + torch::matmul(torch::silu(torch::matmul(m, W("midlayer.mlp.gate_proj.weight").t())) *
                                torch::matmul(m, W("midlayer.mlp.up_proj.weight").t()),
                            W("midlayer.mlp.down_proj.weight").t());
  return torch::matmul(norm(out, W("norm.weight")), W("lm_head.weight").t());
}

TEST_F(PeagleTest, TrainingMatchesAFloat64DenseMaskReference) {
  const int64_t t = 16;
  const DraftBatch batch = Batch(t, 7);
  auto frozen = LoadTargetEmbeddings(tmp_.path(), model_.vocab, shape_.hidden_size, torch::kCPU);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  const torch::Tensor embed = frozen->first.to(torch::kFloat64);
  const torch::Tensor full_head = frozen->second.to(torch::kFloat64);
  const torch::Tensor teacher_head = full_head.index_select(0, torch::tensor(map_.used));
  CodOptions cod;
  cod.depths = kDepths;
  cod.ratio = 0.6;
  const torch::Tensor keep = CodSample(batch.loss_mask, batch.host_lengths, {4}, 9, 1, cod);
  for (bool fc_norm : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "fc_norm " << fc_norm);
    std::unique_ptr<Eagle3Draft> draft = Draft(Peagle(fc_norm));
    ASSERT_NE(draft, nullptr);
    const torch::Tensor counts = draft->CountValid(batch, kDepths, keep);
    auto out = draft->Forward(batch, kDepths, counts, torch::kFloat32, {}, keep);
    ASSERT_TRUE(out.ok()) << out.status();
    out->weighted_loss.backward();

    // The reference: elements of depth 0 at every row, then each depth's
    // kept rows; the trained ones are the kept rows whose teacher target is
    // valid (EAGLE-3's alignment) and in the draft vocab.
    std::map<std::string, torch::Tensor> w = Float64Leaves(*draft);
    std::vector<Element> elements;
    for (int64_t p = 0; p < t; ++p) elements.push_back({p, 0});
    for (int64_t k = 1; k < kDepths; ++k) {
      for (int64_t p = 0; p < t; ++p) {
        if (keep[k][0][p].item<bool>()) elements.push_back({p, k});
      }
    }
    ASSERT_GT(elements.size(), static_cast<size_t>(t + kDepths));
    const torch::Tensor logq =
        torch::log_softmax(ReferenceLogits(w, fc_norm, shape_, embed, batch, elements), -1);
    const torch::Tensor last = batch.last_hidden[0].to(torch::kFloat64);
    const torch::Tensor teacher_logp =
        torch::log_softmax(torch::matmul(last, teacher_head.t()), -1);
    const torch::Tensor full_argmax = torch::matmul(last, full_head.t()).argmax(-1);
    const std::set<int64_t> used(map_.used.begin(), map_.used.end());
    torch::Tensor loss = torch::zeros({}, torch::kFloat64);
    std::vector<int64_t> trained(kDepths, 0);
    for (size_t i = 0; i < elements.size(); ++i) {
      const int64_t p = elements[i].anchor, k = elements[i].depth;
      if (p + k + 1 >= t || batch.loss_mask[0][p + k].item<int64_t>() == 0 ||
          used.count(full_argmax[p + k + 1].item<int64_t>()) == 0) {
        continue;
      }
      loss = loss - (teacher_logp[p + k + 1].exp() * logq[i]).sum();
      ++trained[k];
    }
    int64_t total = 0;
    for (int64_t k = 0; k < kDepths; ++k) {
      EXPECT_EQ(counts[k].item<int64_t>(), trained[k]) << "depth " << k;
      EXPECT_EQ(out->valid[k].item<int64_t>(), trained[k]) << "depth " << k;
      total += trained[k];
    }
    ASSERT_GT(trained[kDepths - 1], 0);
    loss = loss / total;
    loss.backward();
    EXPECT_NEAR(out->weighted_loss.item<double>(), loss.item<double>(),
                2e-5 * std::abs(loss.item<double>()));
    ExpectGradientsMatch(*draft, w);
    EXPECT_GT(w.at(kMaskHiddenTensor).grad().abs().max().item<double>(), 0);
  }
}

// One forward proposes every depth: depth j's token is the argmax (over the
// target vocab, through d2t) of the reference's element (r, j), where r is
// the last row, with the cache of a previous call in play.
TEST_F(PeagleTest, OneForwardProposesWhatTheReferencePredicts) {
  std::unique_ptr<Eagle3Draft> draft = Draft(Peagle(true), 13);
  ASSERT_NE(draft, nullptr);
  const int64_t h = shape_.hidden_size;
  torch::manual_seed(5);
  const int64_t t = 12;
  const torch::Tensor aux = torch::randn({t, 3 * h}) * 2;
  const std::vector<int32_t> ids = testing::RandomTokens(t + 1, model_.vocab - 1, 6);
  auto frozen = LoadTargetEmbeddings(tmp_.path(), model_.vocab, h, torch::kCPU);
  ASSERT_TRUE(frozen.ok());
  std::map<std::string, torch::Tensor> w;
  for (const auto& [name, p] : draft->parameters()) w[name] = p.detach().to(torch::kFloat64);
  std::mt19937_64 rng(0);
  spec::TokenChooser chooser(0, &rng);
  for (int64_t n : {6, 9, 13}) {
    SCOPED_TRACE(::testing::Message() << n << " ids");
    std::vector<int32_t> prefix(ids.begin(), ids.begin() + n), tokens;
    ASSERT_TRUE(draft->Propose(prefix, aux.narrow(0, 0, n - 1), kDepths, chooser, &tokens).ok());
    ASSERT_EQ(tokens.size(), static_cast<size_t>(kDepths));
    DraftBatch batch;
    batch.input_ids =
        torch::tensor(std::vector<int64_t>(prefix.begin(), prefix.end())).unsqueeze(0);
    batch.aux_hidden = aux.narrow(0, 0, n - 1).unsqueeze(0);
    const int64_t r = n - 2;
    std::vector<Element> elements;
    for (int64_t p = 0; p <= r; ++p) elements.push_back({p, 0});
    for (int64_t k = 1; k < kDepths; ++k) elements.push_back({r, k});
    torch::NoGradGuard no_grad;
    const torch::Tensor logits =
        ReferenceLogits(w, true, shape_, frozen->first.to(torch::kFloat64), batch, elements);
    for (int64_t k = 0; k < kDepths; ++k) {
      const int64_t row = k == 0 ? r : r + k;
      const int64_t draft_id = logits[row].argmax().item<int64_t>();
      EXPECT_EQ(tokens[k], map_.used[draft_id]) << "depth " << k;
    }
  }
}

TEST_F(PeagleTest, ExportRoundTripCarriesTheParallelDraftingKeys) {
  std::unique_ptr<Eagle3Draft> draft = Draft(Peagle(), 17);
  ASSERT_NE(draft, nullptr);
  auto in = DraftExportInput(*draft, tmp_.path(), {1, 2, 3});
  ASSERT_TRUE(in.ok()) << in.status();
  in->config.torch_dtype = "float32";
  in->config.num_depths = kDepths;
  const std::string dir = tmp_.Join("peagle");
  ASSERT_TRUE(ExportDraft(*in, dir).ok());
  auto text = ReadFileToString(dir + "/config.json");
  ASSERT_TRUE(text.ok());
  const nlohmann::json config = nlohmann::json::parse(*text);
  EXPECT_EQ(config["architectures"], nlohmann::json::array({kEagle3Architecture}));
  EXPECT_EQ(config.value("parallel_drafting", false), true);
  for (const char* key : {"mask_token_id", "pard_token", "ptd_token_id"}) {
    EXPECT_EQ(config.value(key, int64_t{-1}), kMaskToken) << key;
  }
  EXPECT_EQ(config.value("num_depths", 0), kDepths);
  EXPECT_EQ(config.value("norm_before_residual", true), false);
  auto back = ReadExport(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->config.parallel_drafting);
  EXPECT_EQ(back->config.mask_token_id, kMaskToken);
  ASSERT_TRUE(back->tensors.count(kMaskHiddenTensor));
  EXPECT_EQ(back->tensors.at(kMaskHiddenTensor).sizes(),
            (std::vector<int64_t>{1, 1, 3 * shape_.hidden_size}));
  EXPECT_TRUE(torch::equal(back->tensors.at(kMaskHiddenTensor),
                           draft->parameter(kMaskHiddenTensor).detach()));
  // The export restores as a P-EAGLE draft that proposes the same tokens.
  auto restored = RestoreDraft(dir, RestoreOptions{tmp_.path()});
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->draft->type(), "peagle");
  EXPECT_EQ(restored->draft->ProposalLength(10), kDepths);
  const torch::Tensor aux = torch::randn({7, 3 * shape_.hidden_size});
  const std::vector<int32_t> prefix = testing::RandomTokens(8, model_.vocab - 1, 2);
  std::mt19937_64 rng(0);
  spec::TokenChooser chooser(0, &rng);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(draft->Propose(prefix, aux, kDepths, chooser, &a).ok());
  ASSERT_TRUE(restored->draft->Propose(prefix, aux, kDepths, chooser, &b).ok());
  EXPECT_EQ(a, b);
  // An EAGLE-3 export is not taken for P-EAGLE, nor the other way round;
  // a missing mask_hidden is refused by name.
  ExportInput broken = *in;
  broken.tensors.erase(kMaskHiddenTensor);
  const absl::Status refused = ValidateExport(broken);
  EXPECT_NE(refused.message().find(kMaskHiddenTensor), std::string::npos) << refused;
  broken = *in;
  broken.config.mask_token_id = model_.vocab;
  EXPECT_NE(ValidateExport(broken).message().find("config.mask_token_id"), std::string::npos);
}

}  // namespace
}  // namespace specstream::student
