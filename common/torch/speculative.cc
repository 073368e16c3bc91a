#include "common/torch/speculative.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream::spec {

torch::Tensor Distribution(const torch::Tensor& logits, double temperature) {
  return torch::softmax(logits.to(torch::kCPU, torch::kFloat64) / temperature, -1);
}

int32_t SampleFrom(const torch::Tensor& probs, std::mt19937_64& rng) {
  const torch::Tensor cumulative = probs.to(torch::kCPU, torch::kFloat64).contiguous().cumsum(0);
  const double* c = cumulative.data_ptr<double>();
  const int64_t n = cumulative.numel();
  const double u = std::uniform_real_distribution<double>(0.0, c[n - 1])(rng);
  // The first index whose running sum exceeds u, skipping zero-probability
  // entries (equal running sums).
  const int64_t i = std::upper_bound(c, c + n, u) - c;
  return static_cast<int32_t>(std::min(i, n - 1));
}

int32_t TokenChooser::Choose(const torch::Tensor& logits) {
  if (temperature_ <= 0) return static_cast<int32_t>(logits.argmax().item<int64_t>());
  torch::Tensor q = Distribution(logits, temperature_);
  const int32_t token = SampleFrom(q, *rng_);
  distributions_.push_back(std::move(q));
  return token;
}

absl::Status CheckProposalInputs(const std::vector<int32_t>& ids, const torch::Tensor& aux,
                                 const char* who) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n < 2 || aux.dim() != 2 || aux.size(0) != n - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ", n, " ids need captures [n-1, features] (got ", aux.dim(),
                     " dimensions, ", aux.dim() > 0 ? aux.size(0) : 0, " rows)"));
  }
  return absl::OkStatus();
}

void DecodeStats::Add(const DecodeStats& o) {
  sequences += o.sequences;
  new_tokens += o.new_tokens;
  forwards += o.forwards;
  rounds += o.rounds;
  round_tokens += o.round_tokens;
  draft_tokens += o.draft_tokens;
  seconds += o.seconds;
  draft_seconds += o.draft_seconds;
  prefill_seconds += o.prefill_seconds;
  step_seconds += o.step_seconds;
  verify_seconds += o.verify_seconds;
  steps += o.steps;
  verify_rows += o.verify_rows;
  const size_t k = std::max(reached.size(), o.reached.size());
  reached.resize(k, 0);
  proposed.resize(k, 0);
  for (size_t i = 0; i < o.reached.size(); ++i) {
    reached[i] += o.reached[i];
    proposed[i] += o.proposed[i];
  }
}

absl::StatusOr<DecodeResult> Decode(Target& target, Draft* draft,
                                    const std::vector<int32_t>& prompt,
                                    const DecodeOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("decode: the prompt is empty");
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError("decode: max_new_tokens must be at least 1");
  }
  const auto start = std::chrono::steady_clock::now();
  const double t = options.temperature;
  std::mt19937_64 rng(options.seed);
  TokenChooser chooser(t, &rng);
  DecodeResult result;
  DecodeStats& stats = result.stats;
  stats.sequences = 1;
  const int64_t k_max = draft != nullptr ? draft->max_proposal() : 0;
  stats.reached.assign(k_max, 0);
  stats.proposed.assign(k_max, 0);
  auto is_stop = [&](int32_t token) {
    return std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
           options.stop_ids.end();
  };
  // The target's pick from one row of logits.
  auto target_pick = [&](const torch::Tensor& row) {
    if (t <= 0) return static_cast<int32_t>(row.argmax().item<int64_t>());
    return SampleFrom(Distribution(row, t), rng);
  };

  target.Reset();
  std::vector<int32_t> ids = prompt;
  const auto since = [](std::chrono::steady_clock::time_point begin) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  };
  auto forward_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(Target::Rows rows, target.Extend(prompt, /*logit_rows=*/1));
  stats.prefill_seconds += since(forward_start);
  ++stats.forwards;
  torch::Tensor aux = rows.aux_hidden;
  int64_t kept = static_cast<int64_t>(prompt.size());  // positions the target holds
  std::vector<int32_t>& out = result.tokens;
  int32_t next = target_pick(rows.logits[0]);

  while (true) {
    ids.push_back(next);
    out.push_back(next);
    const int64_t remaining = options.max_new_tokens - static_cast<int64_t>(out.size());
    if (is_stop(next) || remaining <= 0) break;
    // The proposal: at most what can still be committed besides the bonus.
    std::vector<int32_t> proposal;
    if (draft != nullptr && remaining > 1) {
      chooser.Clear();
      const auto proposing = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(draft->Propose(ids, aux, std::min(k_max, remaining - 1), chooser, &proposal));
      stats.draft_seconds += since(proposing);
    }
    std::vector<int32_t> run = {next};
    run.insert(run.end(), proposal.begin(), proposal.end());
    forward_start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(rows, target.Extend(run, static_cast<int64_t>(run.size())));
    ++stats.forwards;
    const int64_t k = static_cast<int64_t>(proposal.size());
    if (k > 0) {
      stats.verify_seconds += since(forward_start);
      stats.verify_rows += 1 + k;
    } else {
      stats.step_seconds += since(forward_start);
      ++stats.steps;
    }
    int64_t accepted = 0;
    std::vector<int32_t> committed;
    bool stopped = false;
    for (; accepted < k && !stopped; ++accepted) {
      const int32_t d = proposal[accepted];
      const torch::Tensor row = rows.logits[accepted];
      ++stats.proposed[accepted];
      bool keep;
      int32_t replacement = -1;
      if (t <= 0) {
        replacement = static_cast<int32_t>(row.argmax().item<int64_t>());
        keep = replacement == d;
      } else {
        const torch::Tensor p = Distribution(row, t);
        const torch::Tensor& q = chooser.distributions()[accepted];
        const double pd = p[d].item<double>(), qd = q[d].item<double>();
        keep = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * qd < pd;
        if (!keep) {
          torch::Tensor residual = (p - q).clamp_min(0);
          // p == q everywhere leaves no residual; then p itself is exact.
          replacement = SampleFrom(residual.sum().item<double>() > 0 ? residual : p, rng);
        }
      }
      if (!keep) {
        committed.push_back(replacement);
        break;
      }
      ++stats.reached[accepted];
      committed.push_back(d);
      stopped = is_stop(d);
    }
    if (!stopped && static_cast<int64_t>(committed.size()) == accepted) {
      // Every proposed token accepted: the bonus token from the last row.
      committed.push_back(target_pick(rows.logits[k]));
    }
    // The target keeps `next` and the accepted proposals; the last committed
    // token (a bonus or a correction) runs in the next forward.
    kept += 1 + accepted;
    target.Truncate(kept);
    aux = torch::cat({aux, rows.aux_hidden.narrow(0, 0, 1 + accepted)}, 0);
    if (k > 0) {
      ++stats.rounds;
      stats.draft_tokens += k;
      result.round_lengths.push_back(static_cast<int32_t>(committed.size()));
      stats.round_tokens += static_cast<int64_t>(committed.size());
    }
    // All but the last committed token are final now; the last becomes
    // `next` (or ends the decode).
    for (size_t i = 0; i + 1 < committed.size(); ++i) {
      ids.push_back(committed[i]);
      out.push_back(committed[i]);
    }
    next = committed.back();
    if (stopped) {
      out.push_back(next);
      break;
    }
  }
  stats.new_tokens = static_cast<int64_t>(out.size());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace specstream::spec
