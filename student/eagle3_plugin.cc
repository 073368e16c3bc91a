#include "student/eagle3_plugin.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/block_draft.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "common/jobspec/job_spec.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/cod_sampling.h"
#include "student/metrics_sink.h"
#include "student/student_commands.h"
#include "student/trainer.h"

namespace specstream::student {
namespace {

constexpr const char* kEagle3 = jobspec::kDraftTypeEagle3;
constexpr const char* kPeagle = jobspec::kDraftTypePeagle;
constexpr int kDefaultTttSteps = 7;

nlohmann::json OptionsJson(const Eagle3Options& o) {
  nlohmann::json j = {
      {"fc_norm", o.fc_norm}, {"norm_output", o.norm_output}, {"norm_before_fc", o.norm_before_fc}};
  if (o.parallel_drafting) {
    j["parallel_drafting"] = true;
    j["mask_token_id"] = o.mask_token_id;
  }
  return j;
}

Eagle3Options OptionsFromJson(const nlohmann::json& j) {
  Eagle3Options o;
  if (!j.is_object()) return o;
  o.fc_norm = j.value("fc_norm", false);
  o.norm_output = j.value("norm_output", false);
  o.norm_before_fc = j.value("norm_before_fc", false);
  o.parallel_drafting = j.value("parallel_drafting", false);
  o.mask_token_id = j.value("mask_token_id", int64_t{0});
  return o;
}

// P-EAGLE's COD shares, as a checkpoint's state records them.
nlohmann::json CodJson(const CodOptions& cod) {
  return {{"down_sample_ratio", cod.ratio}, {"down_sample_ratio_min", cod.ratio_min}};
}
CodOptions CodFromJson(const nlohmann::json& j, int64_t depths) {
  CodOptions cod;
  cod.depths = depths;
  if (!j.is_object()) return cod;
  cod.ratio = j.value("down_sample_ratio", cod.ratio);
  cod.ratio_min = j.value("down_sample_ratio_min", cod.ratio_min);
  return cod;
}

// Builds the vocab map from the masked tokens of every sample in the source
// (deterministic, so every rank builds the same one).
absl::StatusOr<VocabMap> BuildMapFromSource(SampleSource& source, int64_t target_vocab,
                                            int64_t draft_vocab) {
  TokenCounter counter(target_vocab);
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (int64_t i = 0; i < source.size(); ++i) {
    RETURN_IF_ERROR(source.TokenIds(i, &ids, &mask));
    RETURN_IF_ERROR(counter.Add(ids, mask));
  }
  return BuildVocabMap(counter, draft_vocab);
}

// EAGLE-3 plans nothing on the host; P-EAGLE the rows each depth trains.
class NoPlan final : public StepPlan {};
class CodPlan final : public StepPlan {
 public:
  explicit CodPlan(torch::Tensor keep) : keep(std::move(keep)) {}
  torch::Tensor keep;  // bool [K, B, whole T] on the host (CodSample)
};

class Eagle3Plugin final : public TrainableDraft {
 public:
  // `cod`: P-EAGLE's (a draft with parallel_drafting); its depths are
  // `ttt_steps`.
  Eagle3Plugin(std::unique_ptr<Eagle3Draft> draft, int ttt_steps, CaptureLayerIds captures,
               std::string target_dir, CodOptions cod = {})
      : draft_(std::move(draft)),
        ttt_steps_(ttt_steps),
        captures_(std::move(captures)),
        target_dir_(std::move(target_dir)),
        cod_(cod) {
    cod_.depths = ttt_steps_;
  }

  Eagle3Draft& eagle3() { return *draft_; }

  const std::string& type() const override {
    static const std::string* eagle3 = new std::string(kEagle3);
    static const std::string* peagle = new std::string(kPeagle);
    return parallel() ? *peagle : *eagle3;
  }
  std::string Describe() const override {
    const Eagle3Options& o = draft_->options();
    if (parallel()) {
      return absl::StrCat("P-EAGLE draft, draft vocab ", draft_->shape().draft_vocab_size,
                          ", K=", ttt_steps_, " depths in one forward, COD ", cod_.ratio, " (min ",
                          cod_.ratio_min, "), mask token ", o.mask_token_id, ", captures [",
                          absl::StrJoin(captures_, ", "), "]");
    }
    std::vector<std::string> flags;
    if (o.fc_norm) flags.push_back("fc_norm");
    if (o.norm_output) flags.push_back("norm_output");
    if (o.norm_before_fc) flags.push_back("norm_before_fc");
    return absl::StrCat(o.any() ? "EAGLE 3.1 draft (" + absl::StrJoin(flags, ", ") + ")"
                                : std::string("EAGLE-3 draft"),
                        ", draft vocab ", draft_->shape().draft_vocab_size, ", K=", ttt_steps_,
                        ", captures [", absl::StrJoin(captures_, ", "), "]");
  }
  CaptureLayerIds capture_layer_ids() const override { return captures_; }
  const NamedTensors& parameters() const override { return draft_->parameters(); }
  torch::Device device() const override { return draft_->device(); }
  int64_t halo_rows() const override { return ttt_steps_; }
  bool reads_whole_token_ids() const override { return false; }
  bool plans_on_whole_loss_mask() const override { return parallel(); }

  absl::StatusOr<std::unique_ptr<StepPlan>> Plan(const DraftBatch& batch,
                                                 const std::vector<int64_t>& sample_keys,
                                                 uint64_t seed, int64_t step,
                                                 const CpLayout&) const override {
    if (!parallel()) return std::make_unique<NoPlan>();
    torch::Tensor keep;
    RETURN_IF_ERROR(CatchTorch("COD plan", [&] {
      const torch::Tensor& mask =
          batch.whole_loss_mask.defined() ? batch.whole_loss_mask : batch.loss_mask;
      keep = CodSample(mask, batch.host_lengths, sample_keys, seed, step, cod_);
    }));
    return std::make_unique<CodPlan>(std::move(keep));
  }
  absl::StatusOr<torch::Tensor> LossNormaliser(const DraftBatch& batch,
                                               const StepPlan& plan) const override {
    torch::Tensor counts;
    RETURN_IF_ERROR(CatchTorch("loss normaliser", [&] {
      counts = draft_->CountValid(batch, ttt_steps_, Keep(batch, plan));
    }));
    return counts;
  }
  absl::StatusOr<bool> Empty(const torch::Tensor&) const override { return false; }
  absl::StatusOr<DraftStep> Forward(const DraftBatch& batch, const StepPlan& plan,
                                    const torch::Tensor& global_normaliser, torch::Dtype dtype,
                                    const CpGroups& groups) override {
    const DraftParallel parallel{groups.ulysses.get(), groups.ring.get()};
    torch::Tensor keep;
    RETURN_IF_ERROR(CatchTorch("COD plan", [&] { keep = Keep(batch, plan); }));
    ASSIGN_OR_RETURN(TttOutputs out,
                     draft_->Forward(batch, ttt_steps_, global_normaliser, dtype, parallel, keep));
    DraftStep step;
    step.loss = out.weighted_loss;
    step.sums = {{"loss_sum", out.loss_sum}, {"correct", out.correct}, {"valid", out.valid}};
    return step;
  }
  DraftMetrics Metrics(const MetricSums& totals) const override {
    const torch::Tensor loss = totals.at("loss_sum").contiguous();
    const torch::Tensor correct = totals.at("correct").contiguous();
    const torch::Tensor valid = totals.at("valid").contiguous();
    const TttMeans means = TttMeansFromSums(loss.data_ptr<double>(), correct.data_ptr<double>(),
                                            valid.data_ptr<double>(), ttt_steps_);
    DraftMetrics m;
    m.loss = means.loss;
    if (parallel()) {
      // What P-EAGLE optimises: the mean over every trained (row, depth).
      const double rows = valid.sum().item<double>();
      m.loss = loss.sum().item<double>() / std::max(1.0, rows);
    }
    m.loss_k = means.loss_k;
    m.acc_k = means.acc_k;
    m.sim_accept_len = means.sim_accept_len;
    m.positions = static_cast<int64_t>(valid.data_ptr<double>()[0]);
    return m;
  }

  DraftRecord Record() const override {
    DraftRecord record;
    const VocabMap& map = draft_->vocab_map();
    record.fixed["d2t"] = torch::tensor(map.d2t, torch::kInt64);
    record.fixed["t2d"] =
        torch::tensor(std::vector<int64_t>(map.t2d.begin(), map.t2d.end())).to(torch::kBool);
    record.state["draft_type"] = type();
    record.state["draft_shape"] = DraftShapeJson(draft_->shape());
    record.state["eagle3"] = OptionsJson(draft_->options());
    record.resume_keys = {"draft_type", "eagle3"};
    if (parallel()) {
      record.state["peagle"] = CodJson(cod_);
      record.resume_keys.push_back("peagle");
    }
    return record;
  }
  absl::Status Export(const HfModelConfig&, const std::string& dir) const override {
    ASSIGN_OR_RETURN(ExportInput in, DraftExportInput(*draft_, target_dir_, captures_));
    if (parallel()) {
      in.config.num_depths = ttt_steps_;
      in.config.down_sample_ratio = cod_.ratio;
      in.config.down_sample_ratio_min = cod_.ratio_min;
    }
    return ExportDraft(in, dir);
  }
  absl::StatusOr<std::unique_ptr<TrainableDraft>> Fresh(uint64_t seed) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<Eagle3Draft> fresh,
                     Eagle3Draft::Create(draft_->shape(), target_dir_, draft_->vocab_map(), seed,
                                         false, draft_->device(), draft_->options()));
    return std::unique_ptr<TrainableDraft>(
        new Eagle3Plugin(std::move(fresh), ttt_steps_, captures_, target_dir_, cod_));
  }
  // P-EAGLE proposes the K depths it was trained with (more would read
  // depths it never saw); EAGLE-3 the chain asked for.
  int64_t ProposalLength(int64_t chain_length) const override {
    return parallel() ? std::min<int64_t>(chain_length, ttt_steps_) : chain_length;
  }
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, spec::TokenChooser& chooser,
                       std::vector<int32_t>* tokens) override {
    return draft_->Propose(ids, aux, max_tokens, chooser, tokens);
  }

 private:
  bool parallel() const { return draft_->options().parallel_drafting; }
  // P-EAGLE: the plan's rows of this batch's own rows, on the host;
  // undefined for EAGLE-3.
  torch::Tensor Keep(const DraftBatch& batch, const StepPlan& plan) const {
    if (!parallel()) return {};
    const torch::Tensor& whole = static_cast<const CodPlan&>(plan).keep;
    return whole.narrow(2, batch.offset, batch.aux_hidden.size(1)).contiguous();
  }

  std::unique_ptr<Eagle3Draft> draft_;
  int ttt_steps_;
  CaptureLayerIds captures_;
  std::string target_dir_;
  CodOptions cod_;
};

absl::Status Configure(const v1::DraftSpec& draft, TrainerConfig* c) {
  c->vocab_map = draft.vocab_map();
  c->draft_vocab_size = draft.draft_vocab_size();
  c->eagle3.fc_norm = draft.fc_norm();
  c->eagle3.norm_output = draft.norm_output();
  c->eagle3.norm_before_fc = draft.norm_before_fc();
  c->eagle3.parallel_drafting = draft.type() == kPeagle;
  if (c->eagle3.parallel_drafting) {
    if (draft.has_mask_token_id()) c->mask_token_id = draft.mask_token_id();
    if (draft.has_down_sample_ratio()) c->down_sample_ratio = draft.down_sample_ratio();
    if (draft.has_down_sample_ratio_min()) {
      c->down_sample_ratio_min = draft.down_sample_ratio_min();
    }
  }
  return ValidateEagle3Options(c->eagle3);
}

absl::StatusOr<std::unique_ptr<TrainableDraft>> CreateEagle3(const DraftContext& ctx) {
  const TrainerConfig& c = ctx.config;
  const HfModelConfig& target = ctx.target;
  if (c.ttt_steps < 1) return absl::InvalidArgumentError("training.ttt_steps must be >= 1");
  const CaptureLayerIds& capture = ctx.source.model().capture_layer_ids;
  // A draft over captures the servers cannot use would only fail at
  // export, after the whole run.
  if (absl::Status valid = ValidateEagle3CaptureLayers(capture, target.num_hidden_layers);
      !valid.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx.source_name, " captures layers [", absl::StrJoin(capture, ", "),
                     "], which an EAGLE-3 draft cannot be served with: ", valid.message(),
                     " (set the capture layer ids when serving or dumping)"));
  }
  VocabMap map;
  if (!c.vocab_map.empty()) {
    ASSIGN_OR_RETURN(map, LoadVocabMap(c.vocab_map));
    if (map.target_vocab() != target.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.draft.vocab_map ", c.vocab_map, " covers ", map.target_vocab(),
                       " target ids but the target vocab is ", target.vocab_size));
    }
  } else {
    if (c.draft_vocab_size < 1 || c.draft_vocab_size > target.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("model.draft.draft_vocab_size ",
                                                     c.draft_vocab_size, " must be in [1, ",
                                                     target.vocab_size, "]"));
    }
    ASSIGN_OR_RETURN(map, BuildMapFromSource(ctx.source, target.vocab_size, c.draft_vocab_size));
  }
  DraftShape shape = DraftShapeFor(c, target, static_cast<int64_t>(capture.size()));
  shape.draft_vocab_size = map.draft_vocab();
  RETURN_IF_ERROR(
      ValidateCpLayout(ctx.layout, shape.num_attention_heads, shape.num_key_value_heads));
  Eagle3Options options = c.eagle3;
  CodOptions cod;
  if (options.parallel_drafting) {
    ASSIGN_OR_RETURN(options.mask_token_id,
                     ResolveMaskTokenId(c.mask_token_id, c.target_dir, target.vocab_size));
    cod.ratio = c.down_sample_ratio;
    cod.ratio_min = c.down_sample_ratio_min;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Eagle3Draft> draft,
                   Eagle3Draft::Create(shape, c.target_dir, map, c.seed,
                                       !ctx.source.has_target_ids(), ctx.device, options));
  return std::unique_ptr<TrainableDraft>(
      new Eagle3Plugin(std::move(draft), c.ttt_steps, capture, c.target_dir, cod));
}

// A draft of `shape` and `options` over the target at `target_dir`, its
// vocab map from the d2t/t2d tensors and its parameters from `tensors` (a
// checkpoint's draft tensors or an export's, which share the names).
absl::StatusOr<std::unique_ptr<Eagle3Draft>> BuildDraft(
    DraftShape shape, const Eagle3Options& options, const std::string& target_dir,
    const std::map<std::string, torch::Tensor>& tensors, bool need_full_lm_head,
    const std::string& what) {
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(target_dir));
  TakeTargetPositions(target, &shape);
  auto d2t = tensors.find("d2t");
  auto t2d = tensors.find("t2d");
  if (d2t == tensors.end() || t2d == tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " lacks d2t/t2d"));
  }
  VocabMap map;
  torch::Tensor d = d2t->second.to(torch::kInt64).contiguous();
  torch::Tensor t = t2d->second.to(torch::kUInt8).contiguous();
  map.d2t.assign(d.data_ptr<int64_t>(), d.data_ptr<int64_t>() + d.numel());
  map.t2d.assign(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
  for (int64_t i = 0; i < map.draft_vocab(); ++i) map.used.push_back(map.d2t[i] + i);
  ASSIGN_OR_RETURN(std::unique_ptr<Eagle3Draft> draft,
                   Eagle3Draft::Create(shape, target_dir, map, 0, need_full_lm_head,
                                       torch::kCPU, options));
  torch::NoGradGuard no_grad;
  for (auto& [pname, param] : draft->parameters()) {
    auto it = tensors.find(pname);
    if (it == tensors.end() || !it->second.sizes().equals(param.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": draft tensor ", pname, " missing or mis-shaped"));
    }
    param.detach().copy_(it->second);
  }
  return draft;
}

absl::StatusOr<std::unique_ptr<TrainableDraft>> RestoreEagle3(const RestoreInput& in) {
  std::unique_ptr<Eagle3Draft> draft;
  CaptureLayerIds captures;
  int k = in.ttt_steps;
  CodOptions cod;
  if (in.is_export) {
    ASSIGN_OR_RETURN(ExportInput exported, ReadExport(in.path));
    const ExportConfig& c = exported.config;
    DraftShape shape;
    shape.hidden_size = c.hidden_size;
    shape.target_hidden_size = c.target_hidden_size > 0 ? c.target_hidden_size : c.hidden_size;
    shape.num_captures = static_cast<int64_t>(c.aux_layer_ids.size());
    shape.intermediate_size = c.intermediate_size;
    shape.num_attention_heads = c.num_attention_heads;
    shape.num_key_value_heads = c.num_key_value_heads;
    shape.head_dim = c.head_dim;
    shape.draft_vocab_size = c.draft_vocab_size;
    shape.target_vocab_size = c.vocab_size;
    Eagle3Options options;
    options.fc_norm = c.fc_norm;
    options.norm_output = c.norm_output;
    options.norm_before_fc = c.norm_before_fc;
    options.parallel_drafting = c.parallel_drafting;
    options.mask_token_id = c.mask_token_id;
    ASSIGN_OR_RETURN(draft, BuildDraft(shape, options, in.target_dir, exported.tensors,
                                       in.need_full_lm_head, in.what));
    captures = c.aux_layer_ids;
    cod.ratio = c.down_sample_ratio;
    cod.ratio_min = c.down_sample_ratio_min;
    if (k <= 0 && c.num_depths > 0) k = static_cast<int>(c.num_depths);
  } else {
    ASSIGN_OR_RETURN(DraftShape shape, DraftShapeFromJson(in.state["draft_shape"]));
    ASSIGN_OR_RETURN(draft, BuildDraft(shape, OptionsFromJson(in.state.value("eagle3", nlohmann::json())),
                                       in.target_dir, in.tensors, in.need_full_lm_head, in.what));
    if (!in.state.contains("capture_layer_ids")) {
      return absl::InvalidArgumentError(in.what + ": state.json lacks capture_layer_ids");
    }
    captures = in.state["capture_layer_ids"].get<CaptureLayerIds>();
    if (k <= 0) k = in.state.value("ttt_steps", kDefaultTttSteps);
    cod = CodFromJson(in.state.value("peagle", nlohmann::json()), k);
  }
  if (k <= 0) k = kDefaultTttSteps;
  return std::unique_ptr<TrainableDraft>(
      new Eagle3Plugin(std::move(draft), k, std::move(captures), in.target_dir, cod));
}

}  // namespace

DraftType Eagle3DraftType() {
  DraftType type;
  type.name = kEagle3;
  type.configure = Configure;
  type.capture_layers = [](const TrainerConfig&,
                           const HfModelConfig&) -> absl::StatusOr<std::vector<int>> {
    return std::vector<int>();  // the teachers' default: EAGLE-3's own
  };
  type.create = CreateEagle3;
  type.holds_checkpoint = [](const nlohmann::json& state) {
    // Checkpoints from before draft_type was recorded: EAGLE-3 unless they
    // record a block draft.
    return state.value("draft_type", state.contains("block_draft") ? "" : kEagle3) == kEagle3;
  };
  type.holds_export = [](const nlohmann::json& config) {
    return config.value("architectures", nlohmann::json::array()) ==
               nlohmann::json::array({kEagle3Architecture}) &&
           !config.value("parallel_drafting", false);
  };
  type.restore = RestoreEagle3;
  return type;
}

DraftType PeagleDraftType() {
  DraftType type = Eagle3DraftType();
  type.name = kPeagle;
  type.holds_checkpoint = [](const nlohmann::json& state) {
    return state.value("draft_type", "") == kPeagle;
  };
  type.holds_export = [](const nlohmann::json& config) {
    return config.value("architectures", nlohmann::json::array()) ==
               nlohmann::json::array({kEagle3Architecture}) &&
           config.value("parallel_drafting", false);
  };
  return type;
}

absl::StatusOr<ExportInput> DraftExportInput(const Eagle3Draft& draft,
                                             const std::string& target_dir,
                                             const CaptureLayerIds& capture_layer_ids) {
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(target_dir));
  ExportInput in;
  ASSIGN_OR_RETURN(in.config, ExportConfigFromTarget(target));
  const DraftShape& s = draft.shape();
  in.config.hidden_size = s.hidden_size;
  in.config.intermediate_size = s.intermediate_size;
  in.config.num_attention_heads = s.num_attention_heads;
  in.config.num_key_value_heads = s.num_key_value_heads;
  in.config.head_dim = s.head_dim;
  in.config.draft_vocab_size = s.draft_vocab_size;
  in.config.vocab_size = s.target_vocab_size;
  in.config.target_hidden_size = s.target_hidden_size == s.hidden_size ? 0 : s.target_hidden_size;
  in.config.aux_layer_ids = capture_layer_ids;
  in.config.target_num_hidden_layers = target.num_hidden_layers;
  in.config.fc_norm = draft.options().fc_norm;
  in.config.norm_output = draft.options().norm_output;
  in.config.norm_before_fc = draft.options().norm_before_fc;
  in.config.parallel_drafting = draft.options().parallel_drafting;
  in.config.mask_token_id = draft.options().mask_token_id;
  for (const auto& [name, p] : draft.parameters()) in.tensors[name] = p.detach().clone();
  const VocabMap& map = draft.vocab_map();
  in.tensors["d2t"] = torch::tensor(map.d2t, torch::kInt64);
  in.tensors["t2d"] =
      torch::tensor(std::vector<int64_t>(map.t2d.begin(), map.t2d.end())).to(torch::kBool);
  return in;
}

Eagle3Draft* AsEagle3Draft(TrainableDraft& draft) {
  auto* plugin = dynamic_cast<Eagle3Plugin*>(&draft);
  return plugin == nullptr ? nullptr : &plugin->eagle3();
}

}  // namespace specstream::student
