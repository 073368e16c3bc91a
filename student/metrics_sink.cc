#include "student/metrics_sink.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "student/tensorboard.h"

namespace specstream::student {

double SimulatedAcceptLength(const std::vector<double>& acc_k) {
  double total = 0, product = 1;
  for (double a : acc_k) {
    product *= a;
    total += product;
  }
  return total;
}

TttMeans TttMeansFromSums(const double* loss_sum, const double* correct, const double* valid,
                          int k_steps) {
  TttMeans means;
  double weight = 1;
  for (int k = 0; k < k_steps; ++k) {
    const double denominator = std::max(1.0, valid[k]);
    means.loss_k.push_back(loss_sum[k] / denominator);
    means.acc_k.push_back(correct[k] / denominator);
    means.loss += weight * means.loss_k.back();
    weight *= kTttLossDecay;
  }
  means.sim_accept_len = SimulatedAcceptLength(means.acc_k);
  return means;
}

MetricsSink::~MetricsSink() = default;

absl::StatusOr<std::unique_ptr<MetricsSink>> MetricsSink::Create(
    const MetricsSinkOptions& options) {
  std::unique_ptr<MetricsSink> sink(new MetricsSink());
  sink->options_ = options;
  if (!options.jsonl.empty()) {
    absl::StatusOr<std::unique_ptr<JsonlWriter>> jsonl = JsonlWriter::Open(options.jsonl);
    if (!jsonl.ok()) return Annotate(jsonl.status(), "metrics.jsonl");
    sink->jsonl_ = *std::move(jsonl);
  }
  if (!options.tensorboard_dir.empty()) {
    ASSIGN_OR_RETURN(sink->tensorboard_, TensorBoardWriter::Create(options.tensorboard_dir));
  }
  return sink;
}

absl::Status MetricsSink::Write(const StepMetrics& m) {
  if (options_.log_lines) {
    const std::string acc = absl::StrJoin(m.acc_k, ",", [](std::string* out, double x) {
      absl::StrAppend(out, absl::StrFormat("%.4f", x));
    });
    std::string block;
    if (m.tau) absl::StrAppend(&block, absl::StrFormat(" tau %.3f", *m.tau));
    if (m.calibration_error) {
      absl::StrAppend(&block, absl::StrFormat(" conf_ece %.4f", *m.calibration_error));
    }
    SS_LOG_INFO(
        "step {}/{} loss {:.4f} acc [{}] accept_len {:.3f}{} lr {:.3g} grad_norm {:.3f} "
        "{:.0f} tok/s",
        m.step, options_.total_steps, m.loss, acc, m.sim_accept_len, block, m.lr, m.grad_norm,
        m.tokens_per_second);
  }
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> scalars = {
        {"train/loss", m.loss},
        {"train/sim_accept_len", m.sim_accept_len},
        {"train/lr", m.lr},
        {"train/grad_norm", m.grad_norm},
        {"train/tokens_per_s", m.tokens_per_second}};
    for (size_t k = 0; k < m.acc_k.size(); ++k) {
      scalars.emplace_back(absl::StrCat("train/acc_", k), m.acc_k[k]);
    }
    for (size_t k = 0; k < m.loss_k.size(); ++k) {
      scalars.emplace_back(absl::StrCat("train/loss_", k), m.loss_k[k]);
    }
    if (m.tau) scalars.emplace_back("train/tau", *m.tau);
    if (m.calibration_error) scalars.emplace_back("train/conf_ece", *m.calibration_error);
    absl::Status s = tensorboard_->WriteScalars(m.step, scalars);
    if (!s.ok()) SS_LOG_WARN("tensorboard: {}", std::string(s.message()));
  }
  if (jsonl_) {
    nlohmann::json line = {{"step", m.step},
                           {"total_steps", options_.total_steps},
                           {"loss", m.loss},
                           {"loss_k", m.loss_k},
                           {"acc_k", m.acc_k},
                           {"sim_accept_len", m.sim_accept_len},
                           {"lr", m.lr},
                           {"grad_norm", m.grad_norm},
                           {"tokens_per_s", m.tokens_per_second},
                           {"positions", m.positions}};
    if (m.tau) line["tau"] = *m.tau;
    if (m.calibration_error) line["conf_ece"] = *m.calibration_error;
    return Annotate(jsonl_->Append(line), "metrics.jsonl");
  }
  return absl::OkStatus();
}

}  // namespace specstream::student
