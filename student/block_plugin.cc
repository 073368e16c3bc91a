#include "student/block_plugin.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/block_draft.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/block_export.h"
#include "student/metrics_sink.h"
#include "student/student_commands.h"
#include "student/trainer.h"

namespace specstream::student {
namespace {

class AnchorPlan final : public StepPlan {
 public:
  explicit AnchorPlan(BlockAnchors anchors) : anchors(std::move(anchors)) {}
  BlockAnchors anchors;
};

const BlockAnchors& AnchorsOf(const StepPlan& plan) {
  return static_cast<const AnchorPlan&>(plan).anchors;
}

class BlockPlugin final : public TrainableDraft {
 public:
  // `loss_settings`: whether the options' training-only fields (anchors,
  // γ, loss weights) are the ones the draft was trained with; an export
  // without them can propose but not be evaluated.
  BlockPlugin(std::unique_ptr<BlockDraft> draft, std::string target_dir, bool loss_settings,
              std::string what)
      : draft_(std::move(draft)),
        type_(BlockDraftKindName(draft_->options().kind)),
        target_dir_(std::move(target_dir)),
        loss_settings_(loss_settings),
        what_(std::move(what)) {}

  BlockDraft& block() { return *draft_; }

  const std::string& type() const override { return type_; }
  std::string Describe() const override {
    const BlockDraftOptions& o = draft_->options();
    return absl::StrCat(type_, " draft, ", o.num_layers, " layer(s) over target layers [",
                        absl::StrJoin(o.target_layer_ids, ", "), "], block ", o.block_size, ", ",
                        o.num_anchors, " anchors, mask token ", o.mask_token_id);
  }
  CaptureLayerIds capture_layer_ids() const override { return draft_->options().target_layer_ids; }
  const NamedTensors& parameters() const override { return draft_->parameters(); }
  torch::Device device() const override { return draft_->device(); }
  // The context and teacher states are gathered over the CP group, and the
  // whole token ids read separately: no halo.
  int64_t halo_rows() const override { return 0; }
  bool reads_whole_token_ids() const override { return true; }

  absl::StatusOr<std::unique_ptr<StepPlan>> Plan(const DraftBatch& batch,
                                                 const std::vector<int64_t>& sample_keys,
                                                 uint64_t seed, int64_t step,
                                                 const CpLayout& layout) const override {
    if (!loss_settings_) {
      return absl::FailedPreconditionError(absl::StrCat(
          what_, ": config.json lacks ", kBlockTrainingKey,
          " (num_anchors, loss_decay_gamma, loss_weights), which evaluation needs: export the "
          "draft again with this version, or evaluate its checkpoint"));
    }
    BlockAnchors anchors =
        SampleBlockAnchors(batch, sample_keys, seed, step, draft_->options().num_anchors);
    if (layout.cp_size > 1) anchors = DealBlocks(anchors, layout.cp_size, layout.cp_rank());
    return std::make_unique<AnchorPlan>(std::move(anchors));
  }
  absl::StatusOr<torch::Tensor> LossNormaliser(const DraftBatch& batch,
                                               const StepPlan& plan) const override {
    torch::Tensor weight;
    RETURN_IF_ERROR(CatchTorch("loss normaliser",
                               [&] { weight = draft_->WeightSum(batch, AnchorsOf(plan)); }));
    return weight;
  }
  absl::StatusOr<bool> Empty(const torch::Tensor& global_weight) const override {
    bool empty = false;
    RETURN_IF_ERROR(CatchTorch("global weight", [&] { empty = global_weight.item<double>() <= 0; }));
    return empty;
  }
  absl::StatusOr<DraftStep> Forward(const DraftBatch& batch, const StepPlan& plan,
                                    const torch::Tensor& global_weight, torch::Dtype dtype,
                                    const CpGroups& groups) override {
    ASSIGN_OR_RETURN(BlockOutputs out, draft_->Forward(batch, AnchorsOf(plan), global_weight,
                                                       dtype, groups.cp.get()));
    DraftStep step;
    step.loss = out.weighted_loss;
    step.sums = {{"loss_sum", out.loss_sum},   {"weight_sum", out.weight_sum},
                 {"correct", out.correct},     {"counted", out.counted},
                 {"accepted", out.accepted},   {"blocks", out.blocks}};
    if (out.calibration.defined()) step.sums["calibration"] = out.calibration;
    return step;
  }
  DraftMetrics Metrics(const MetricSums& totals) const override {
    const BlockDraftOptions& o = draft_->options();
    const int64_t bs = o.block_size;
    // DFlash's slot 0 holds the anchor and is never trained.
    const int64_t first = o.kind == BlockDraftKind::kDFlash ? 1 : 0;
    auto scalar = [&](const char* name) { return totals.at(name).item<double>(); };
    const torch::Tensor correct = totals.at("correct").contiguous();
    const torch::Tensor counted = totals.at("counted").contiguous();
    DraftMetrics m;
    m.acc_k.assign(bs, 0.0);
    std::vector<double> trained;
    for (int64_t k = 0; k < bs; ++k) {
      const double n = counted.data_ptr<double>()[k];
      m.acc_k[k] = n > 0 ? correct.data_ptr<double>()[k] / n : 0.0;
      if (k >= first) trained.push_back(m.acc_k[k]);
    }
    m.sim_accept_len = SimulatedAcceptLength(trained);
    m.positions = static_cast<int64_t>(counted.data_ptr<double>()[first]);
    const double weight = scalar("weight_sum");
    m.loss = weight > 0 ? scalar("loss_sum") / weight : 0.0;
    const double blocks = scalar("blocks");
    m.tau = blocks > 0 ? scalar("accepted") / blocks : 0.0;
    if (auto it = totals.find("calibration"); it != totals.end()) {
      const torch::Tensor bins = it->second.contiguous();
      m.calibration_error = CalibrationError(bins.data_ptr<double>(), kCalibrationBins);
    }
    return m;
  }

  DraftRecord Record() const override {
    DraftRecord record;
    record.state["draft_type"] = type_;
    record.state["draft_shape"] = DraftShapeJson(draft_->shape());
    record.state["block_draft"] = BlockDraftOptionsJson(draft_->options());
    record.resume_keys = {"draft_type", "block_draft"};
    return record;
  }
  absl::Status Export(const HfModelConfig& target, const std::string& dir) const override {
    return ExportBlockDraft(*draft_, target, dir);
  }
  absl::StatusOr<std::unique_ptr<TrainableDraft>> Fresh(uint64_t seed) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<BlockDraft> fresh,
                     BlockDraft::Create(draft_->shape(), draft_->options(), target_dir_, seed,
                                        draft_->device()));
    return std::unique_ptr<TrainableDraft>(
        new BlockPlugin(std::move(fresh), target_dir_, loss_settings_, what_));
  }
  int64_t ProposalLength(int64_t) const override { return draft_->proposal_length(); }
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, spec::TokenChooser& chooser,
                       std::vector<int32_t>* tokens) override {
    return draft_->Propose(ids, aux, max_tokens, chooser, tokens);
  }

 private:
  std::unique_ptr<BlockDraft> draft_;
  std::string type_;
  std::string target_dir_;
  bool loss_settings_;
  std::string what_;
};

absl::Status Configure(BlockDraftKind kind, const v1::DraftSpec& draft, TrainerConfig* c) {
  BlockDraftOptions& b = c->block;
  b.kind = kind;
  b.num_layers = draft.num_layers();
  b.block_size = draft.block_size();
  b.num_anchors = draft.num_anchors();
  ASSIGN_OR_RETURN(b.target_layer_ids,
                   NarrowCaptureLayerIds(draft.target_layer_ids(), "model.draft.target_layer_ids"));
  if (draft.has_mask_token_id()) c->mask_token_id = draft.mask_token_id();
  b.loss_decay_gamma = draft.loss_decay_gamma();
  if (kind == BlockDraftKind::kDSpark) {
    b.markov_rank = draft.markov_rank();
    b.confidence_head = draft.enable_confidence_head();
    b.confidence_with_markov = draft.confidence_head_with_markov();
    b.ce_weight = draft.loss_weights().ce();
    b.l1_weight = draft.loss_weights().l1();
    b.conf_weight = draft.loss_weights().conf();
  }
  return absl::OkStatus();
}

absl::StatusOr<CaptureLayerIds> CaptureLayers(const TrainerConfig& c, const HfModelConfig& target) {
  // A block draft asks each teacher for exactly the layers it reads.
  return BlockTargetLayerIds(c.block.target_layer_ids, c.block.num_layers,
                             target.num_hidden_layers);
}

absl::StatusOr<std::unique_ptr<TrainableDraft>> Create(BlockDraftKind kind,
                                                       const DraftContext& ctx) {
  const TrainerConfig& c = ctx.config;
  BlockDraftOptions o = c.block;
  o.kind = kind;
  ASSIGN_OR_RETURN(o.target_layer_ids, BlockTargetLayerIds(o.target_layer_ids, o.num_layers,
                                                           ctx.target.num_hidden_layers));
  const CaptureLayerIds& capture = ctx.source.model().capture_layer_ids;
  if (capture != o.target_layer_ids) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model.draft.target_layer_ids: the ", BlockDraftKindName(kind), " draft reads layers [",
        absl::StrJoin(o.target_layer_ids, ", "), "] but ", ctx.source_name, " captures [",
        absl::StrJoin(capture, ", "), "] (dump or serve with --capture-layers ",
        absl::StrJoin(o.target_layer_ids, ","), " --capture-for any)"));
  }
  ASSIGN_OR_RETURN(o.mask_token_id,
                   ResolveMaskTokenId(c.mask_token_id, c.target_dir, ctx.target.vocab_size));
  const DraftShape shape =
      DraftShapeFor(c, ctx.target, static_cast<int64_t>(o.target_layer_ids.size()));
  ASSIGN_OR_RETURN(std::unique_ptr<BlockDraft> draft,
                   BlockDraft::Create(shape, o, c.target_dir, c.seed, ctx.device));
  return std::unique_ptr<TrainableDraft>(
      new BlockPlugin(std::move(draft), c.target_dir, true, ctx.source_name));
}

absl::StatusOr<std::unique_ptr<TrainableDraft>> RestoreBlock(const RestoreInput& in) {
  BlockDraftOptions options;
  DraftShape shape;
  std::map<std::string, torch::Tensor> tensors;
  bool loss_settings = true;
  if (in.is_export) {
    ASSIGN_OR_RETURN(BlockExport exported, ReadBlockExport(in.path));
    options = exported.options;
    shape = exported.shape;
    tensors = std::move(exported.tensors);
    loss_settings = exported.has_training_options;
  } else {
    if (!in.state.contains("block_draft")) {
      return absl::InvalidArgumentError(in.what + ": state.json lacks block_draft");
    }
    ASSIGN_OR_RETURN(options, BlockDraftOptionsFromJson(in.state["block_draft"]));
    ASSIGN_OR_RETURN(shape, DraftShapeFromJson(in.state["draft_shape"]));
    tensors = in.tensors;
  }
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(in.target_dir));
  TakeTargetPositions(target, &shape);
  ASSIGN_OR_RETURN(std::unique_ptr<BlockDraft> draft,
                   BlockDraft::Create(shape, options, in.target_dir, 0));
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : draft->parameters()) {
    auto it = tensors.find(name);
    if (it == tensors.end() || !it->second.sizes().equals(param.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat(in.what, ": draft tensor ", name, " missing or mis-shaped"));
    }
    param.detach().copy_(it->second);
  }
  return std::unique_ptr<TrainableDraft>(
      new BlockPlugin(std::move(draft), in.target_dir, loss_settings, in.what));
}

}  // namespace

DraftType BlockDraftType(BlockDraftKind kind) {
  const std::string name = BlockDraftKindName(kind);
  DraftType type;
  type.name = name;
  type.configure = [kind](const v1::DraftSpec& draft, TrainerConfig* c) {
    return Configure(kind, draft, c);
  };
  type.capture_layers = CaptureLayers;
  type.create = [kind](const DraftContext& ctx) { return Create(kind, ctx); };
  type.holds_checkpoint = [name](const nlohmann::json& state) {
    // Checkpoints from before draft_type was recorded name the kind in
    // their block_draft options.
    if (state.contains("draft_type")) return state["draft_type"] == name;
    return state.contains("block_draft") && state["block_draft"].value("type", "") == name;
  };
  const char* architecture =
      kind == BlockDraftKind::kDFlash ? kDFlashArchitecture : kDSparkArchitecture;
  type.holds_export = [architecture](const nlohmann::json& config) {
    return config.value("architectures", nlohmann::json::array()) ==
           nlohmann::json::array({architecture});
  };
  type.restore = RestoreBlock;
  return type;
}

BlockDraft* AsBlockDraft(TrainableDraft& draft) {
  auto* plugin = dynamic_cast<BlockPlugin*>(&draft);
  return plugin == nullptr ? nullptr : &plugin->block();
}

}  // namespace specstream::student
