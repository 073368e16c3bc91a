#include "student/proposer.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "student/draft.h"

namespace specstream::student {
namespace {

// Any trainable draft as a proposer: at most ProposalLength(K) tokens a
// round (EAGLE-3's chain of K, a block draft's block).
class DraftProposer final : public spec::Draft {
 public:
  DraftProposer(std::unique_ptr<TrainableDraft> draft, int64_t chain_length)
      : draft_(std::move(draft)), length_(draft_->ProposalLength(chain_length)) {}
  int64_t max_proposal() const override { return length_; }
  absl::Status Propose(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                       int64_t max_tokens, spec::TokenChooser& chooser,
                       std::vector<int32_t>* tokens) override {
    return draft_->Propose(ids, aux, std::min(max_tokens, length_), chooser, tokens);
  }

 private:
  std::unique_ptr<TrainableDraft> draft_;
  int64_t length_;
};

}  // namespace

absl::StatusOr<LoadedProposer> LoadProposer(const std::string& path,
                                            const std::string& target_dir, bool untrained,
                                            int64_t chain_length, uint64_t seed) {
  if (chain_length < 1) {
    return absl::InvalidArgumentError("the EAGLE-3 chain length must be at least 1");
  }
  RestoreOptions options;
  options.target_dir = target_dir;
  ASSIGN_OR_RETURN(RestoredDraft restored, RestoreDraft(path, options));
  LoadedProposer out;
  out.target_dir = restored.state["target_dir"].get<std::string>();
  std::unique_ptr<TrainableDraft> draft = std::move(restored.draft);
  if (untrained) {
    ASSIGN_OR_RETURN(draft, draft->Fresh(seed));
  }
  out.type = draft->type();
  out.capture_layer_ids = draft->capture_layer_ids();
  out.draft = std::make_unique<DraftProposer>(std::move(draft), chain_length);
  return out;
}

}  // namespace specstream::student
