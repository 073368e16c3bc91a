// What a training step reports, and where the reports go: log lines,
// metrics.jsonl and TensorBoard (rank 0 writes them). LibTorch-free.
//
// The TTT loss contract the reports share with the draft's loss
// (draft_model.h): step k of the K test-time-training steps weighs
// kTttLossDecay^k, and per-step means are sums over valid positions divided
// by max(1, valid positions at that step).
#ifndef SPECSTREAM_STUDENT_METRICS_SINK_H_
#define SPECSTREAM_STUDENT_METRICS_SINK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/jsonl.h"

namespace specstream::student {

class TensorBoardWriter;

// The weight ratio between consecutive TTT steps' losses (EAGLE-3's 0.8).
inline constexpr double kTttLossDecay = 0.8;

// Per-TTT-step means of sums over valid positions.
struct TttMeans {
  std::vector<double> loss_k;
  std::vector<double> acc_k;
  double loss = 0;            // Σ_k kTttLossDecay^k · loss_k
  double sim_accept_len = 0;  // SimulatedAcceptLength(acc_k)
};
// `loss_sum`, `correct` and `valid` hold k_steps sums each.
TttMeans TttMeansFromSums(const double* loss_sum, const double* correct, const double* valid,
                          int k_steps);

// Σ_k Π_{j≤k} acc_j.
double SimulatedAcceptLength(const std::vector<double>& acc_k);

struct StepMetrics {
  int64_t step = 0;  // 1-based, after the update
  double loss = 0;   // Σ_k 0.8^k L_k
  std::vector<double> loss_k;
  std::vector<double> acc_k;
  double sim_accept_len = 0;
  double lr = 0;
  double grad_norm = 0;
  // Over the steps since the previous record (all ranks): their tokens over
  // the wall time they took.
  double tokens_per_second = 0;
  int64_t tokens = 0;     // tokens in the batches of those steps, all ranks
  int64_t positions = 0;  // valid positions at step 0 of this step, all ranks
  // Block drafts (DFlash, DSpark): acc_k is per slot (over the slots that
  // weigh something; DFlash's slot 0 never does), loss_k is empty,
  // sim_accept_len is Σ_k Π_{j≤k} acc_j over the trained slots, positions
  // counts the first trained slot's weighted tokens, and:
  std::optional<double> tau;  // mean accepted length of the kept blocks, bonus included
  std::optional<double> calibration_error;  // DSpark's confidence head (10-bin ECE)
};

struct MetricsSinkOptions {
  int64_t total_steps = 0;
  bool log_lines = true;        // an info line per record
  std::string jsonl;            // metrics.jsonl to append to; empty: none
  std::string tensorboard_dir;  // event files; empty: none
};

// Thread-safety: one thread at a time.
class MetricsSink final {
 public:
  // Opens the outputs; errors name the file that cannot be written.
  static absl::StatusOr<std::unique_ptr<MetricsSink>> Create(const MetricsSinkOptions& options);
  ~MetricsSink();
  // One record to every output. A metrics.jsonl write failure is returned
  // (DataLoss naming the file); TensorBoard failures are logged and skipped.
  absl::Status Write(const StepMetrics& m);

 private:
  MetricsSink() = default;
  MetricsSinkOptions options_;
  std::unique_ptr<JsonlWriter> jsonl_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_METRICS_SINK_H_
