// The EAGLE-3 draft vocabulary map (shared/DESIGN.md §3).
//
// Token frequencies are counted where loss_mask is set; the `draft_vocab` most
// frequent target ids are kept (ties: smaller id first), padded with the
// smallest unseen ids when fewer were seen, and sorted ascending:
//   used[i]  = the target id of draft id i
//   d2t[i]   = used[i] - i            (int64, as SGLang and vLLM load it)
//   t2d[v]   = v is in the draft vocab (bool over the target vocab)
// Saved as safetensors with tensors "d2t" (I64 [draft_vocab]) and "t2d"
// (BOOL [target_vocab]). One map per job, shared by every rank.
#ifndef SPECSTREAM_COMMON_VOCAB_MAP_H_
#define SPECSTREAM_COMMON_VOCAB_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace specstream {

// Counts target-token frequencies. Not thread-safe.
class TokenCounter final {
 public:
  explicit TokenCounter(int64_t target_vocab) : counts_(target_vocab, 0) {}

  // Counts ids[i] where mask[i] != 0 (mask empty: all). InvalidArgument on
  // an id outside [0, target_vocab) or a length mismatch; nothing is counted
  // then.
  absl::Status Add(absl::Span<const int32_t> ids, absl::Span<const uint8_t> mask);

  int64_t target_vocab() const { return static_cast<int64_t>(counts_.size()); }
  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t total() const { return total_; }

 private:
  std::vector<int64_t> counts_;
  int64_t total_ = 0;
};

struct VocabMap {
  std::vector<int64_t> used;  // sorted target ids, size draft_vocab
  std::vector<int64_t> d2t;   // used[i] - i
  std::vector<uint8_t> t2d;   // size target_vocab, 0/1

  int64_t draft_vocab() const { return static_cast<int64_t>(d2t.size()); }
  int64_t target_vocab() const { return static_cast<int64_t>(t2d.size()); }
  // Fraction of counted tokens the draft vocab covers (set by BuildVocabMap).
  double coverage = 0.0;
};

// InvalidArgument when draft_vocab is not in [1, target_vocab].
absl::StatusOr<VocabMap> BuildVocabMap(const TokenCounter& counter, int64_t draft_vocab);

// Writes d2t/t2d (+ metadata draft_vocab, target_vocab) atomically.
absl::Status SaveVocabMap(const VocabMap& map, const std::string& path);
// Reads and checks consistency (d2t strictly increasing targets, t2d agrees).
absl::StatusOr<VocabMap> LoadVocabMap(const std::string& path);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_VOCAB_MAP_H_
