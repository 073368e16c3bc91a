#include "services/eval/eval_commands.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/chat_template.h"
#include "common/file.h"
#include "common/hf_config.h"
#include "common/jsonl.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "common/torch/speculative.h"
#include "nlohmann/json.hpp"
#include "student/proposer.h"
#include "teacher/decode_target.h"
#include "teacher/hf_runtime.h"

namespace specstream::services {
namespace {

struct Prompt {
  int64_t id = 0;
  std::string text;
  std::vector<int32_t> ids;  // rendered with the chat template, ready for the answer
};

absl::Status CheckSplit(const std::string& split) {
  if (split != "train" && split != "holdout" && split != "all") {
    return absl::InvalidArgumentError("--split must be train, holdout or all, not " + split);
  }
  return absl::OkStatus();
}

bool InSplit(int64_t id, const std::string& split) {
  const bool held_out = id % 10 == 9;
  return split == "all" || (split == "holdout") == held_out;
}

// The prompts of a split, rendered as a user turn followed by the template's
// assistant header.
absl::StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path, const std::string& split,
                                                const Tokenizer& tokenizer,
                                                const ChatTemplate& chat, int64_t limit) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<Prompt> prompts;
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_object() || !record.contains("id") || !record["id"].is_number_integer() ||
        !record.contains("prompt") || !record["prompt"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": expected {\"id\": integer, \"prompt\": string}"));
    }
    Prompt p;
    p.id = record["id"].get<int64_t>();
    if (!InSplit(p.id, split)) continue;
    p.text = record["prompt"].get<std::string>();
    ASSIGN_OR_RETURN(p.ids, PromptIds(chat, tokenizer, p.text));
    prompts.push_back(std::move(p));
    if (limit > 0 && static_cast<int64_t>(prompts.size()) >= limit) break;
  }
  if (prompts.empty()) return absl::InvalidArgumentError(path + ": no prompt in split " + split);
  return prompts;
}

// The target and what decoding needs around it.
struct TargetSetup {
  std::unique_ptr<teacher::HfRuntime> runtime;
  std::unique_ptr<Tokenizer> tokenizer;
  const ChatTemplate* chat = nullptr;
  std::vector<int32_t> stop_ids;
};

absl::StatusOr<TargetSetup> OpenTarget(const std::string& dir, const std::string& template_name,
                                       const std::string& dtype) {
  TargetSetup setup;
  teacher::HfRuntimeOptions options;
  options.model_dir = dir;
  options.dtype = dtype;
  // Decoding names its captures per draft (DecodeTarget); the described set
  // only has to be valid for any depth.
  options.capture_layer_ids = {0};
  ASSIGN_OR_RETURN(setup.runtime, teacher::HfRuntime::Create(options));
  ASSIGN_OR_RETURN(setup.tokenizer, Tokenizer::FromDirectory(dir));
  ASSIGN_OR_RETURN(setup.chat, FindChatTemplate(template_name));
  setup.stop_ids = teacher::StopIds(setup.runtime->config(), setup.tokenizer.get());
  return setup;
}

}  // namespace

absl::Status Generate(const GenerateOptions& f) {
  RETURN_IF_ERROR(CheckSplit(f.split));
  ASSIGN_OR_RETURN(TargetSetup setup, OpenTarget(f.target, f.chat_template, f.dtype));
  ASSIGN_OR_RETURN(std::vector<Prompt> prompts,
                   ReadPrompts(f.prompts, f.split, *setup.tokenizer, *setup.chat, f.limit));
  spec::DecodeOptions options;
  options.max_new_tokens = f.max_new;
  options.temperature = f.temperature;
  options.seed = f.seed;
  options.stop_ids = setup.stop_ids;
  teacher::TargetAnswers answers(*setup.runtime, options);
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<int64_t> ids;
  for (const Prompt& p : prompts) {
    prompt_ids.push_back(p.ids);
    ids.push_back(p.id);
  }
  std::vector<std::string> records(prompts.size());  // in prompt order, whatever ends first
  int64_t tokens = 0;
  size_t finished = 0;
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(answers.AnswerAll(
      prompt_ids, ids, f.batch,
      [&](size_t i, const std::vector<int32_t>& answer_ids) -> absl::Status {
        const Prompt& p = prompts[i];
        const TokenizedSample sample = AnsweredSample(p.ids, answer_ids, /*max_length=*/0);
        ASSIGN_OR_RETURN(std::string answer, setup.tokenizer->Decode(answer_ids));
        nlohmann::json record = {
            {"id", p.id},       {"temperature", f.temperature},  {"prompt", p.text},
            {"answer", answer}, {"input_ids", sample.input_ids}, {"loss_mask", sample.loss_mask}};
        records[i] = record.dump() + "\n";
        tokens += static_cast<int64_t>(answer_ids.size());
        SS_LOG_INFO(
            "generate: prompt {} ({}/{}): {} tokens, {:.1f} s", p.id, ++finished, prompts.size(),
            answer_ids.size(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        return absl::OkStatus();
      }));
  const std::string lines = absl::StrJoin(records, "");
  RETURN_IF_ERROR(WriteFileAtomically(f.out, lines));
  std::cout << "generate: " << prompts.size() << " answers, " << tokens << " tokens -> " << f.out
            << "\n";
  return absl::OkStatus();
}

namespace {

// Teacher-forced replay of a T = 0 decode: the draft proposes at every
// position of the committed tokens from captures of one forward over the
// whole sequence; L(j) is the run of proposals equal to the tokens that
// follow position j. Real rounds commit 1 + L(j) from their start j, so a
// walk j -> j + 1 + L(j) from j = 0 replays the real decode's rounds.
struct TeacherForced {
  std::vector<int32_t> walk;  // the replayed rounds' lengths
  double position_sum = 0;    // Σ_j round length started at j
  int64_t positions = 0;      // positions j a round can start at
};

absl::StatusOr<TeacherForced> ReplayTeacherForced(spec::Target& target, spec::Draft& draft,
                                                  const std::vector<int32_t>& prompt,
                                                  const std::vector<int32_t>& out,
                                                  const spec::DecodeOptions& options) {
  TeacherForced tf;
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  target.Reset();
  ASSIGN_OR_RETURN(spec::Target::Rows rows, target.Extend(all, /*logit_rows=*/1));
  const int64_t p = static_cast<int64_t>(prompt.size()), n = static_cast<int64_t>(out.size());
  const bool stopped = n > 0 && std::find(options.stop_ids.begin(), options.stop_ids.end(),
                                          out.back()) != options.stop_ids.end();
  std::mt19937_64 unused_rng(0);
  spec::TokenChooser chooser(0, &unused_rng);
  std::vector<int32_t> length_at(n, 1);
  for (int64_t j = 0; j + 1 < n; ++j) {
    const int64_t remaining = options.max_new_tokens - (j + 1);
    if (remaining <= 1) break;
    std::vector<int32_t> ids(all.begin(), all.begin() + p + j + 1);
    std::vector<int32_t> proposal;
    RETURN_IF_ERROR(draft.Propose(ids, rows.aux_hidden.narrow(0, 0, p + j),
                                  std::min(draft.max_proposal(), remaining - 1), chooser,
                                  &proposal));
    int64_t matched = 0;
    while (matched < static_cast<int64_t>(proposal.size()) && j + 1 + matched < n &&
           proposal[matched] == out[j + 1 + matched]) {
      ++matched;
    }
    // A matched stop token ends the decode without a bonus token.
    const bool ends = stopped && j + 1 + matched == n;
    length_at[j] = static_cast<int32_t>(ends ? matched : matched + 1);
    tf.position_sum += length_at[j];
    ++tf.positions;
  }
  for (int64_t j = 0; j + 1 < n;) {
    const int64_t remaining = options.max_new_tokens - (j + 1);
    if (remaining <= 1) break;
    tf.walk.push_back(length_at[j]);
    j += length_at[j];
  }
  return tf;
}

struct Moments {
  double sum = 0, sum_sq = 0;
  int64_t n = 0;
  void Add(double x) {
    sum += x;
    sum_sq += x * x;
    ++n;
  }
  double mean() const { return n > 0 ? sum / n : 0; }
  double stderr_of_mean() const {
    if (n < 2) return 0;
    const double var = (sum_sq - sum * sum / n) / (n - 1);
    return std::sqrt(std::max(0.0, var) / n);
  }
};

// One draft's counts at one temperature.
struct DraftTally {
  spec::DecodeStats stats;
  Moments rounds;
  int64_t lossless_equal = 0, walk_rounds = 0, walk_tokens = 0, walk_mismatch = 0;
  int64_t replayed_exactly = 0;  // prompts whose real rounds are the replay's, one for one
  double position_sum = 0;
  int64_t positions = 0;
  // Per prompt: its id, prompt ids, new tokens and the tokens each round
  // committed (what an outside server's counts are recounted against).
  nlohmann::json per_prompt = nlohmann::json::array();
};

}  // namespace

absl::Status Speculate(const SpeculateOptions& f) {
  if (f.drafts.empty() && f.untrained_drafts.empty()) {
    return absl::InvalidArgumentError("speculate needs --draft or --untrained-draft");
  }
  RETURN_IF_ERROR(CheckSplit(f.split));
  ASSIGN_OR_RETURN(TargetSetup setup, OpenTarget(f.target, f.chat_template, f.dtype));
  struct Entry {
    student::LoadedProposer proposer;
    bool untrained = false;
    std::string path, label;
    std::unique_ptr<teacher::DecodeTarget> target;
  };
  std::vector<Entry> entries;
  for (bool untrained : {false, true}) {
    for (const std::string& path : untrained ? f.untrained_drafts : f.drafts) {
      Entry e;
      ASSIGN_OR_RETURN(e.proposer, student::LoadProposer(path, f.target, untrained, f.chain));
      e.untrained = untrained;
      e.path = path;
      e.label = absl::StrCat(e.proposer.type, untrained ? " (untrained)" : "", " ", path);
      e.target =
          std::make_unique<teacher::DecodeTarget>(*setup.runtime, e.proposer.capture_layer_ids);
      entries.push_back(std::move(e));
    }
  }
  ASSIGN_OR_RETURN(std::vector<Prompt> prompts,
                   ReadPrompts(f.prompts, f.split, *setup.tokenizer, *setup.chat, f.limit));
  std::vector<double> temperatures;
  for (absl::string_view t : absl::StrSplit(f.temperatures, ',')) {
    double value = 0;
    if (!absl::SimpleAtod(t, &value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--temperatures: ", t, " is not >= 0"));
    }
    temperatures.push_back(value);
  }
  std::string json_lines;
  for (double t : temperatures) {
    spec::DecodeStats base_stats;
    std::vector<DraftTally> tallies(entries.size());
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
      const Prompt& p = prompts[pi];
      spec::DecodeOptions options;
      options.max_new_tokens = f.max_new;
      options.temperature = t;
      options.seed = f.seed + static_cast<uint64_t>(p.id);
      options.stop_ids = setup.stop_ids;
      // Target-only decoding, once per prompt: the baseline of every draft.
      ASSIGN_OR_RETURN(spec::DecodeResult base,
                       spec::Decode(*entries[0].target, nullptr, p.ids, options));
      base_stats.Add(base.stats);
      for (size_t e = 0; e < entries.size(); ++e) {
        spec::Target& target = *entries[e].target;
        spec::Draft& draft = *entries[e].proposer.draft;
        DraftTally& tally = tallies[e];
        ASSIGN_OR_RETURN(spec::DecodeResult result, spec::Decode(target, &draft, p.ids, options));
        tally.stats.Add(result.stats);
        for (int32_t length : result.round_lengths) tally.rounds.Add(length);
        tally.per_prompt.push_back({{"id", p.id},
                                    {"prompt_ids", p.ids},
                                    {"tokens", result.tokens},
                                    {"round_lengths", result.round_lengths}});
        if (t > 0) continue;
        if (result.tokens == base.tokens) ++tally.lossless_equal;
        ASSIGN_OR_RETURN(TeacherForced tf,
                         ReplayTeacherForced(target, draft, p.ids, result.tokens, options));
        tally.position_sum += tf.position_sum;
        tally.positions += tf.positions;
        tally.walk_rounds += static_cast<int64_t>(tf.walk.size());
        for (int32_t length : tf.walk) tally.walk_tokens += length;
        if (tf.walk == result.round_lengths) ++tally.replayed_exactly;
        // Rounds from the first where the replay and the real decode part.
        for (size_t i = 0; i < tf.walk.size(); ++i) {
          if (i >= result.round_lengths.size() || tf.walk[i] != result.round_lengths[i]) {
            tally.walk_mismatch += static_cast<int64_t>(tf.walk.size() - i);
            break;
          }
        }
      }
      SS_LOG_INFO("speculate: T={} prompt {} ({}/{}) done", t, p.id, pi + 1, prompts.size());
    }
    for (size_t e = 0; e < entries.size(); ++e) {
      const DraftTally& tally = tallies[e];
      const spec::DecodeStats& s = tally.stats;
      const int64_t k = static_cast<int64_t>(s.reached.size());
      std::vector<double> accept(k, 0.0);
      for (int64_t i = 0; i < k; ++i) {
        accept[i] = s.rounds > 0 ? static_cast<double>(s.reached[i]) / s.rounds : 0.0;
      }
      const double speedup = s.seconds > 0 ? base_stats.seconds / s.seconds : 0.0;
      // The target's forwards: a verification of 1 + k rows against a
      // one-row step of target-only decoding (the cost τ must clear).
      auto per = [](double seconds, int64_t n) { return n > 0 ? 1e3 * seconds / n : 0.0; };
      const double verify_ms = per(s.verify_seconds, s.rounds);
      const double step_ms = per(base_stats.step_seconds, base_stats.steps);
      const double verify_rows = s.rounds > 0 ? static_cast<double>(s.verify_rows) / s.rounds : 0;
      const double verify_cost = step_ms > 0 ? verify_ms / step_ms : 0;
      nlohmann::json line = {{"draft", entries[e].proposer.type},
                             {"path", entries[e].path},
                             {"untrained", entries[e].untrained},
                             {"temperature", t},
                             {"prompts", prompts.size()},
                             {"max_new", f.max_new},
                             {"tau", s.tau()},
                             {"tau_stderr", tally.rounds.stderr_of_mean()},
                             {"accept", accept},
                             {"rounds", s.rounds},
                             {"new_tokens", s.new_tokens},
                             {"forwards", s.forwards},
                             {"forwards_saved", s.forwards_saved()},
                             {"target_only_forwards", base_stats.forwards},
                             {"seconds", s.seconds},
                             {"draft_seconds", s.draft_seconds},
                             {"target_only_seconds", base_stats.seconds},
                             {"speedup", speedup},
                             {"verify_ms", verify_ms},
                             {"verify_rows", verify_rows},
                             {"step_ms", step_ms},
                             {"verify_cost", verify_cost},
                             {"prefill_ms", per(s.prefill_seconds, s.sequences)},
                             {"per_prompt", tally.per_prompt}};
      std::string accept_text;
      for (double a : accept) absl::StrAppend(&accept_text, absl::StrFormat(" %.2f", a));
      std::cout << absl::StrFormat(
          "speculate: %s, %d prompts, T=%g: tau %.3f (±%.3f over %d rounds)\n"
          "  rounds reaching position 1..%d:%s\n"
          "  %d tokens in %d target forwards (target-only: %d; %d saved)\n"
          "  wall clock %.1f s (drafting %.1f s) vs target-only %.1f s: x%.2f (both decode on the "
          "KV cache)\n"
          "  target forwards: a verification of %.1f rows %.1f ms against a one-row step %.1f ms: "
          "x%.2f; a prompt's prefill %.1f ms\n",
          entries[e].label, prompts.size(), t, s.tau(), tally.rounds.stderr_of_mean(), s.rounds, k,
          accept_text, s.new_tokens, s.forwards, base_stats.forwards, s.forwards_saved(), s.seconds,
          s.draft_seconds, base_stats.seconds, speedup, verify_rows, verify_ms, step_ms,
          verify_cost, per(s.prefill_seconds, s.sequences));
      if (t == 0) {
        const double walk_tau =
            tally.walk_rounds > 0 ? static_cast<double>(tally.walk_tokens) / tally.walk_rounds : 0;
        const double position_tau = tally.positions > 0 ? tally.position_sum / tally.positions : 0;
        line["lossless_equal"] = tally.lossless_equal;
        line["tau_teacher_forced"] = walk_tau;
        line["tau_position_mean"] = position_tau;
        line["walk_rounds"] = tally.walk_rounds;
        line["walk_mismatched_rounds"] = tally.walk_mismatch;
        line["replayed_exactly"] = tally.replayed_exactly;
        std::cout << absl::StrFormat(
            "  lossless: %d of %d outputs equal target-only greedy token for token\n"
            "  teacher-forced replay: tau %.3f (%d rounds; %d of %d decodes replayed round for "
            "round, %d rounds from a divergence on); mean over all positions %.3f\n",
            tally.lossless_equal, prompts.size(), walk_tau, tally.walk_rounds,
            tally.replayed_exactly, prompts.size(), tally.walk_mismatch, position_tau);
      }
      absl::StrAppend(&json_lines, line.dump(), "\n");
    }
  }
  if (!f.json.empty()) RETURN_IF_ERROR(WriteFileAtomically(f.json, json_lines));
  return absl::OkStatus();
}

}  // namespace specstream::services
