#include "student/proposer.h"

#include <utility>

#include "common/status.h"
#include "student/block_draft.h"
#include "student/draft_model.h"
#include "student/student_commands.h"

namespace specstream::student {
namespace {

class Eagle3Proposer final : public spec::Draft {
 public:
  Eagle3Proposer(std::unique_ptr<Eagle3Draft> draft, int64_t k)
      : draft_(std::move(draft)), k_(k) {}
  int64_t max_proposal() const override { return k_; }
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, spec::TokenChooser& chooser,
                       std::vector<int32_t>* tokens) override {
    return draft_->Propose(ids, aux, std::min(max_tokens, k_), chooser, tokens);
  }

 private:
  std::unique_ptr<Eagle3Draft> draft_;
  int64_t k_;
};

class BlockProposer final : public spec::Draft {
 public:
  explicit BlockProposer(std::unique_ptr<BlockDraft> draft) : draft_(std::move(draft)) {}
  int64_t max_proposal() const override { return draft_->proposal_length(); }
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, spec::TokenChooser& chooser,
                       std::vector<int32_t>* tokens) override {
    return draft_->Propose(ids, aux, max_tokens, chooser, tokens);
  }

 private:
  std::unique_ptr<BlockDraft> draft_;
};

}  // namespace

absl::StatusOr<LoadedProposer> LoadProposer(const std::string& path,
                                            const std::string& target_dir, bool untrained,
                                            int64_t chain_length, uint64_t seed) {
  if (chain_length < 1) {
    return absl::InvalidArgumentError("the EAGLE-3 chain length must be at least 1");
  }
  LoadedProposer out;
  ASSIGN_OR_RETURN(bool block, HoldsBlockDraft(path));
  if (block) {
    ASSIGN_OR_RETURN(RestoredBlockDraft restored, RestoreBlockDraft(path, target_dir));
    out.target_dir = restored.state["target_dir"].get<std::string>();
    std::unique_ptr<BlockDraft> draft = std::move(restored.draft);
    if (untrained) {
      ASSIGN_OR_RETURN(draft, BlockDraft::Create(draft->shape(), draft->options(), out.target_dir,
                                                 seed));
    }
    out.type = BlockDraftKindName(draft->options().kind);
    for (int64_t id : draft->options().target_layer_ids) {
      out.capture_layer_ids.push_back(static_cast<int>(id));
    }
    out.draft = std::make_unique<BlockProposer>(std::move(draft));
    return out;
  }
  ASSIGN_OR_RETURN(RestoredDraft restored, RestoreDraft(path, false, target_dir));
  out.target_dir = restored.state["target_dir"].get<std::string>();
  if (!restored.state.contains("capture_layer_ids")) {
    return absl::InvalidArgumentError(path + ": the draft does not record capture_layer_ids");
  }
  out.capture_layer_ids = restored.state["capture_layer_ids"].get<std::vector<int>>();
  std::unique_ptr<Eagle3Draft> draft = std::move(restored.draft);
  if (untrained) {
    ASSIGN_OR_RETURN(draft, Eagle3Draft::Create(draft->shape(), out.target_dir,
                                                draft->vocab_map(), seed, false));
  }
  out.type = "eagle3";
  out.draft = std::make_unique<Eagle3Proposer>(std::move(draft), chain_length);
  return out;
}

}  // namespace specstream::student
