// A TargetRuntime with no weights, for tests of what sits above a runtime
// (the compute batcher, stream sessions, dump, the teacher service): its
// captures are a fixed function of each token id and position, so a test
// can compute the expected bytes itself (ExpectedAux / ExpectedLast), and it
// fails or holds a Forward on cue.
//
//   aux_hidden[t, c·H + h] = id_t + t / 1000 + (k_c·H + h) / 1e6 (float32)
//                       for the c-th capture layer k_c (the request's
//                       capture_layer_ids, else the described ones)
//   last_hidden[t, h] = -(id_t + h / 1000)
//   target_ids[t]     = (id_t + 1) % vocab
//
// Thread-safety: Forward is called by one thread at a time (as every
// runtime's); the cue setters and counters may be called from any thread.
#ifndef SPECSTREAM_TESTS_TESTING_FAKE_TARGET_RUNTIME_H_
#define SPECSTREAM_TESTS_TESTING_FAKE_TARGET_RUNTIME_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "teacher/target_runtime.h"

namespace specstream::testing {

struct FakeTargetRuntimeOptions {
  int64_t hidden_size = 8;
  int64_t vocab_size = 64;
  int64_t num_layers = 4;
  int64_t max_position_embeddings = 256;
  std::vector<int> capture_layer_ids = {1, 2};
};

class FakeTargetRuntime final : public teacher::TargetRuntime {
 public:
  explicit FakeTargetRuntime(FakeTargetRuntimeOptions options = {});

  const teacher::ModelDescription& Describe() const override { return description_; }
  // InvalidArgument for an empty sequence, an id outside the vocab or a
  // capture layer outside [0, num_layers) (as a real runtime); Internal for
  // a batch holding the poison id; waits while held.
  absl::StatusOr<std::vector<teacher::SequenceCapture>> Forward(
      const teacher::ForwardRequest& request) override;

  // Forward fails (Internal) for any batch holding this token id; -1: none.
  void set_poison_id(int32_t id);
  // Every Forward takes at least `delay` (a slow target: one call per batch,
  // whatever its size).
  void set_forward_delay(absl::Duration delay);
  // Forward waits until Release() while held (a slow target on cue).
  void Hold();
  void Release();
  // Forward calls so far, the batch sizes they had and the capture layers
  // they asked for (empty: the described ones).
  int64_t forward_calls() const;
  std::vector<int64_t> batch_sizes() const;
  std::vector<std::vector<int>> capture_requests() const;
  // The first token id of every sequence asked for, in the order computed.
  std::vector<int32_t> first_ids() const;
  // Waits until a Forward call waits on Hold (its batch taken, nothing of it
  // recorded yet); false past `timeout`.
  bool AwaitHeldForward(absl::Duration timeout) const;
  // Waits until Forward has been asked for at least `n` sequences in all;
  // false past `timeout`.
  bool AwaitSamples(int64_t n, absl::Duration timeout) const;

  // The captures Forward computes for `ids` (of `layers`; empty: the
  // described ones).
  torch::Tensor ExpectedAux(const std::vector<int32_t>& ids,
                            const std::vector<int>& layers = {}) const;
  torch::Tensor ExpectedLast(const std::vector<int32_t>& ids) const;

 private:
  teacher::ModelDescription description_;
  mutable absl::Mutex mu_;
  int32_t poison_id_ ABSL_GUARDED_BY(mu_) = -1;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;  // Forward calls waiting on held_
  absl::Duration forward_delay_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> batch_sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<int>> capture_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> first_ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_FAKE_TARGET_RUNTIME_H_
