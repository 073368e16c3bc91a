#include "student/draft.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"
#include "student/block_plugin.h"
#include "student/checkpoint.h"
#include "student/eagle3_plugin.h"
#include "student/trainer.h"

namespace specstream::student {
namespace {

bool IsExportDirectory(const std::string& path) {
  return std::filesystem::exists(std::filesystem::path(path) / "config.json") &&
         std::filesystem::exists(std::filesystem::path(path) / "model.safetensors");
}

// The contents of a checkpoint: `path` is a root (its newest good step) or
// one step directory.
absl::StatusOr<CheckpointContents> LoadCheckpointAt(const std::string& path) {
  // A step directory is "<root>/step-NNNNNNNN"; anything else is a root.
  std::filesystem::path p(path);
  while (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  std::string root = path;
  std::optional<int64_t> step;
  const std::string name = p.filename().string();
  if (name.rfind("step-", 0) == 0) {
    root = p.parent_path().string();
    int64_t parsed = 0;
    if (!absl::SimpleAtoi(name.substr(5), &parsed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--checkpoint ", path, ": bad step directory"));
    }
    step = parsed;
  }
  CheckpointOptions options;
  options.root = root;
  options.read_only = true;
  ASSIGN_OR_RETURN(auto manager, CheckpointManager::Create(options));
  if (step) return manager->Load(*step);
  // The newest checkpoint that verifies.
  ASSIGN_OR_RETURN(std::optional<CheckpointManager::Loaded> loaded, manager->LoadNewest());
  if (!loaded) return absl::NotFoundError(absl::StrCat("no checkpoint in ", root));
  return std::move(loaded->contents);
}

std::string KnownTypes() {
  std::vector<std::string> names;
  for (const DraftType& type : DraftTypes()) names.push_back(type.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

DraftShape DraftShapeFor(const TrainerConfig& c, const HfModelConfig& target, int64_t captures) {
  DraftShape shape = TargetDraftShape(target, captures);
  if (c.intermediate_size > 0) shape.intermediate_size = c.intermediate_size;
  if (c.num_attention_heads > 0) shape.num_attention_heads = c.num_attention_heads;
  if (c.num_key_value_heads > 0) shape.num_key_value_heads = c.num_key_value_heads;
  if (c.head_dim > 0) shape.head_dim = c.head_dim;
  return shape;
}

void TakeTargetPositions(const HfModelConfig& target, DraftShape* shape) {
  shape->rms_norm_eps = target.rms_norm_eps;
  shape->rope_theta = target.rope_theta;
  shape->rope_scaling = target.rope_scaling;
  shape->max_position_embeddings = target.max_position_embeddings;
}

const std::vector<DraftType>& DraftTypes() {
  static const std::vector<DraftType>* types = new std::vector<DraftType>{
      Eagle3DraftType(),
      PeagleDraftType(),
      BlockDraftType(BlockDraftKind::kDFlash),
      BlockDraftType(BlockDraftKind::kDSpark),
  };
  return *types;
}

absl::StatusOr<const DraftType*> FindDraftType(const std::string& name) {
  for (const DraftType& type : DraftTypes()) {
    if (type.name == name) return &type;
  }
  return absl::InvalidArgumentError(absl::StrCat("model.draft.type: unknown draft type \"", name,
                                                 "\" (known: ", KnownTypes(), ")"));
}

absl::StatusOr<RestoredDraft> RestoreDraft(const std::string& path, const RestoreOptions& options) {
  RestoreInput in;
  in.target_dir = options.target_dir;
  in.need_full_lm_head = options.need_full_lm_head;
  in.ttt_steps = options.ttt_steps;
  const DraftType* found = nullptr;
  RestoredDraft restored;
  if (IsExportDirectory(path)) {
    if (in.target_dir.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--checkpoint ", path,
                       " is an exported draft, which does not record its target model: pass "
                       "--target DIR"));
    }
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(path + "/config.json"));
    in.state = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!in.state.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, "/config.json: not a JSON object"));
    }
    in.is_export = true;
    in.what = absl::StrCat("export ", path);
    for (const DraftType& type : DraftTypes()) {
      if (type.holds_export(in.state)) found = &type;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, "/config.json: architectures ",
                       in.state.value("architectures", nlohmann::json()).dump(),
                       " is not a draft this build reads (", KnownTypes(), ")"));
    }
  } else {
    ASSIGN_OR_RETURN(CheckpointContents contents, LoadCheckpointAt(path));
    if (!contents.state.contains("draft_shape") || !contents.state.contains("target_dir")) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", path, ": state.json lacks draft_shape/target_dir"));
    }
    if (in.target_dir.empty()) in.target_dir = contents.state["target_dir"].get<std::string>();
    in.state = contents.state;
    in.tensors = std::move(contents.draft);
    in.what = absl::StrCat("checkpoint ", path);
    for (const DraftType& type : DraftTypes()) {
      if (type.holds_checkpoint(in.state)) found = &type;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", path, ": state.json draft_type ",
          in.state.value("draft_type", nlohmann::json()).dump(), " is not one of ", KnownTypes()));
    }
  }
  in.path = path;
  ASSIGN_OR_RETURN(restored.draft, found->restore(in));
  if (in.is_export) {
    restored.state = {{"target_dir", in.target_dir},
                      {"capture_layer_ids", restored.draft->capture_layer_ids()}};
  } else {
    restored.state = std::move(in.state);
  }
  return restored;
}

absl::StatusOr<MetricSums> ReduceToHost(const MetricSums& sums, CommGroup* group) {
  torch::Tensor all;
  RETURN_IF_ERROR(CatchTorch("metrics", [&] {
    std::vector<torch::Tensor> flat;
    for (const auto& [name, t] : sums) flat.push_back(t.to(torch::kFloat64).reshape({-1}));
    all = torch::cat(flat);
  }));
  // The collective's own status (UNAVAILABLE for a lost peer) is returned
  // as it is.
  if (group != nullptr) RETURN_IF_ERROR(AllReduceSum(*group, all));
  MetricSums host;
  RETURN_IF_ERROR(CatchTorch("metrics", [&] {
    all = all.to(torch::kCPU);
    int64_t at = 0;
    for (const auto& [name, t] : sums) {
      host[name] = all.narrow(0, at, t.numel()).view(t.sizes()).clone();
      at += t.numel();
    }
  }));
  return host;
}

absl::StatusOr<DraftMetrics> Evaluate(TrainableDraft& draft, SampleSource& source,
                                      const EvalOptions& options) {
  if (source.size() == 0) return absl::InvalidArgumentError("evaluation: the data holds no sample");
  torch::NoGradGuard no_grad;
  MetricSums totals;
  for (int64_t i = 0; i < source.size(); ++i) {
    ASSIGN_OR_RETURN(TrainingSample s, source.Get(i));
    DraftBatch batch;
    RETURN_IF_ERROR(CatchTorch(absl::StrCat("eval: sample ", i),
                               [&] { batch = Collate({s}, options.max_length); }));
    ASSIGN_OR_RETURN(std::unique_ptr<StepPlan> plan,
                     draft.Plan(batch, {i}, options.seed, 0, CpLayout{}));
    RETURN_IF_ERROR(CatchTorch(absl::StrCat("eval: sample ", i, " to ", draft.device().str()),
                               [&] { batch = ToDevice(std::move(batch), draft.device()); }));
    ASSIGN_OR_RETURN(torch::Tensor normaliser, draft.LossNormaliser(batch, *plan));
    ASSIGN_OR_RETURN(DraftStep step,
                     draft.Forward(batch, *plan, normaliser, options.dtype, CpGroups{}));
    RETURN_IF_ERROR(CatchTorch("eval", [&] {
      for (const auto& [name, t] : step.sums) {
        torch::Tensor value = t.to(torch::kFloat64);
        auto it = totals.find(name);
        if (it == totals.end()) {
          totals[name] = value.clone();
        } else {
          it->second += value;
        }
      }
    }));
  }
  ASSIGN_OR_RETURN(MetricSums host, ReduceToHost(totals, nullptr));
  return draft.Metrics(host);
}

}  // namespace specstream::student
