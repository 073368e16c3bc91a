#include "student/train_state.h"

#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "student/checkpoint.h"

namespace specstream::student {

absl::Status TrainState::Save(int64_t step) {
  torch::NoGradGuard no_grad;
  std::map<int, std::string> rng;
  torch::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  if (run_.world_size > 1) {
    std::vector<std::vector<torch::Tensor>> gathered(1);
    for (int r = 0; r < run_.world_size; ++r) gathered[0].push_back(torch::empty_like(state));
    std::vector<torch::Tensor> input{state};
    RETURN_IF_ERROR(
        CatchTorch("rng all_gather", [&] { group_->allgather(gathered, input)->wait(); }));
    for (int r = 0; r < run_.world_size; ++r) {
      const torch::Tensor& t = gathered[0][r];
      rng[r] = std::string(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
  } else {
    rng[0] = std::string(static_cast<const char*>(state.data_ptr()), state.nbytes());
  }
  absl::Status status;
  if (run_.rank == 0) {
    CheckpointContents contents;
    // Checkpoints are host tensors, whatever the device.
    for (const auto& [name, p] : params_) {
      contents.draft[name] = p.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    for (const auto& [name, t] : record_.fixed) contents.draft[name] = t;
    for (const auto& [name, t] : optimizer_.State()) {
      contents.optimizer[name] = t.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    contents.rng_by_rank = rng;
    const LrSchedule& schedule = run_.schedule;
    contents.state = {{"step", step},
                      {"epoch", step / run_.steps_per_epoch},
                      {"batch_in_epoch", step % run_.steps_per_epoch},
                      {"steps_per_epoch", run_.steps_per_epoch},
                      {"total_steps", run_.total_steps},
                      {"world_size", run_.world_size},
                      {"cp_size", run_.cp_size},
                      {"ulysses_degree", run_.ulysses_degree},
                      {"seed", run_.seed},
                      {"ttt_steps", run_.ttt_steps},
                      {"target_dir", run_.target_dir},
                      {"capture_layer_ids", run_.capture_layer_ids},
                      {"store", run_.store},
                      {"scheduler",
                       {{"peak_lr", schedule.peak_lr},
                        {"warmup_steps", schedule.warmup_steps},
                        {"total_steps", schedule.total_steps},
                        {"cosine", schedule.cosine},
                        {"min_lr_ratio", schedule.min_lr_ratio}}}};
    contents.state.update(record_.state);
    auto manager =
        CheckpointManager::Create({run_.checkpoint_dir, static_cast<int>(run_.keep_last), {}});
    status = manager.ok() ? (*manager)->Save(step, contents) : manager.status();
  }
  // Keeps ranks from racing ahead of a checkpoint in progress.
  if (run_.world_size > 1) {
    RETURN_IF_ERROR(CatchTorch("barrier", [&] { group_->barrier()->wait(); }));
  }
  return status;
}

absl::StatusOr<int64_t> TrainState::Resume() {
  // Only rank 0 may clean up leftovers; the others read.
  CheckpointOptions options;
  options.root = run_.checkpoint_dir;
  options.keep_last = static_cast<int>(run_.keep_last);
  options.read_only = run_.rank != 0;
  ASSIGN_OR_RETURN(auto manager, CheckpointManager::Create(options));
  // The newest checkpoint that verifies (a corrupt one is set aside).
  ASSIGN_OR_RETURN(std::optional<CheckpointManager::Loaded> loaded, manager->LoadNewest());
  if (!loaded) {
    SS_LOG_INFO("resume: no checkpoint in {}, starting from step 0", run_.checkpoint_dir);
    return 0;
  }
  const int64_t latest = loaded->step;
  const CheckpointContents& contents = loaded->contents;
  const nlohmann::json& state = contents.state;
  if (state.value("world_size", 0) != run_.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint step ", latest, " was written by ", state.value("world_size", 0),
                     " ranks; exact resume needs the same world size (", run_.world_size, ")"));
  }
  if (state.value("cp_size", 1) != run_.cp_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint step ", latest, " was written with cp_size ", state.value("cp_size", 1),
        "; exact resume needs the same (", run_.cp_size, ")"));
  }
  if (state.value("steps_per_epoch", int64_t{0}) != run_.steps_per_epoch) {
    return absl::FailedPreconditionError(
        "checkpoint was taken with a different data plan "
        "(store or batch settings changed)");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : record_.fixed) {
    auto it = contents.draft.find(name);
    if (it == contents.draft.end() || !it->second.sizes().equals(t.sizes()) ||
        !torch::equal(it->second.to(t.scalar_type()), t)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint's draft ", name, " differs from this job's (the draft vocab map differs)"));
    }
  }
  for (const std::string& key : record_.resume_keys) {
    const nlohmann::json written = state.value(key, nlohmann::json());
    const nlohmann::json mine = record_.state.value(key, nlohmann::json());
    if (written != mine) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint step ", latest, " was written with ", key, " ", written.dump(),
                       "; this job's is ", mine.dump(), " (exact resume needs the same model.draft)"));
    }
  }
  for (auto& [name, p] : params_) {
    auto it = contents.draft.find(name);
    if (it == contents.draft.end() || !it->second.sizes().equals(p.sizes())) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint lacks draft tensor ", name, " of this shape"));
    }
    p.detach().copy_(it->second);
  }
  RETURN_IF_ERROR(optimizer_.LoadState(contents.optimizer));
  auto rng = contents.rng_by_rank.find(run_.rank);
  if (rng != contents.rng_by_rank.end()) {
    torch::Tensor bytes = torch::empty({static_cast<int64_t>(rng->second.size())}, torch::kUInt8);
    std::memcpy(bytes.data_ptr(), rng->second.data(), rng->second.size());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(bytes);
  }
  const int64_t step = state.value("step", int64_t{0});
  if (run_.world_size > 1) {
    // Every rank must have picked the same checkpoint.
    torch::Tensor low = torch::tensor({step}, torch::kInt64), high = low.clone();
    RETURN_IF_ERROR(CatchTorch("resume step check", [&] {
      c10d::AllreduceOptions min_options, max_options;
      min_options.reduceOp = c10d::ReduceOp::MIN;
      max_options.reduceOp = c10d::ReduceOp::MAX;
      std::vector<torch::Tensor> a{low}, b{high};
      group_->allreduce(a, min_options)->wait();
      group_->allreduce(b, max_options)->wait();
    }));
    if (low.item<int64_t>() != high.item<int64_t>()) {
      return absl::FailedPreconditionError(
          absl::StrCat("ranks resumed from different checkpoints (steps ", low.item<int64_t>(),
                       " to ", high.item<int64_t>(), ")"));
    }
  }
  SS_LOG_INFO("resume: continuing from step {} of {}", step, run_.total_steps);
  return step;
}

}  // namespace specstream::student
