// A trained draft as the proposer of in-process speculative decoding
// (common/torch/speculative.h): EAGLE-3 proposes a chain of K tokens, DFlash
// and DSpark one block per round.
#ifndef SPECSTREAM_STUDENT_PROPOSER_H_
#define SPECSTREAM_STUDENT_PROPOSER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "common/torch/speculative.h"

namespace specstream::student {

struct LoadedProposer {
  std::unique_ptr<spec::Draft> draft;
  std::string type;                    // "eagle3", "peagle", "dflash" or "dspark"
  CaptureLayerIds capture_layer_ids;   // the target layers the draft reads, in order
  std::string target_dir;
};

// The draft at `path` (a checkpoint root or step, or an export, which needs
// `target_dir`). `untrained`: the same architecture freshly initialised
// (seed `seed`), the baseline a trained draft must beat. `chain_length`: the
// EAGLE-3 chain's K (block drafts propose their block).
absl::StatusOr<LoadedProposer> LoadProposer(const std::string& path,
                                            const std::string& target_dir, bool untrained,
                                            int64_t chain_length, uint64_t seed = 0);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_PROPOSER_H_
