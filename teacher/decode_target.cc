#include "teacher/decode_target.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace specstream::teacher {

absl::StatusOr<spec::Target::Rows> DecodeTarget::Extend(const std::vector<int32_t>& ids,
                                                        int64_t logit_rows) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (logit_rows < 1 || logit_rows > n) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeTarget::Extend: logit_rows ", logit_rows,
                                                   " outside 1..", n, " (the ids run)"));
  }
  ASSIGN_OR_RETURN(SequenceCapture capture, runtime_.Extend(cache_, ids, captures_));
  Rows rows;
  rows.logits =
      runtime_.Logits(capture.last_hidden.narrow(0, n - logit_rows, logit_rows)).to(torch::kCPU);
  rows.aux_hidden = capture.aux_hidden;
  return rows;
}

std::vector<int32_t> StopIds(const HfModelConfig& config, const Tokenizer* tokenizer) {
  std::vector<int32_t> stop;
  for (int64_t id : config.eos_token_ids) stop.push_back(static_cast<int32_t>(id));
  if (tokenizer != nullptr) {
    for (const char* token : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"}) {
      if (auto id = tokenizer->TokenToId(token)) stop.push_back(*id);
    }
  }
  return stop;
}

absl::StatusOr<std::vector<int32_t>> AnswerStopIds(const HfModelConfig& config,
                                                   const std::string& model_dir,
                                                   const std::string& tokenizer_dir) {
  std::unique_ptr<Tokenizer> tokenizer;
  if (!tokenizer_dir.empty() || std::filesystem::exists(model_dir + "/tokenizer.json")) {
    ASSIGN_OR_RETURN(tokenizer,
                     Tokenizer::FromDirectory(tokenizer_dir.empty() ? model_dir : tokenizer_dir));
  }
  return StopIds(config, tokenizer.get());
}

absl::Status AnswerDecoder::Start(HfRuntime& runtime, const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return absl::InvalidArgumentError("an empty prompt has nothing to answer");
  if (options_.max_new_tokens < 1) {
    return absl::InvalidArgumentError("decode: max_new_tokens must be at least 1");
  }
  cache_.Truncate(0);
  tokens_.clear();
  done_ = false;
  ASSIGN_OR_RETURN(SequenceCapture capture, runtime.Extend(cache_, prompt));
  const int64_t n = static_cast<int64_t>(prompt.size());
  Pick(runtime.Logits(capture.last_hidden.narrow(0, n - 1, 1)).to(torch::kCPU)[0]);
  return absl::OkStatus();
}

void AnswerDecoder::Pick(const torch::Tensor& logits) {
  const double t = options_.temperature;
  const int32_t token = t <= 0 ? static_cast<int32_t>(logits.argmax().item<int64_t>())
                               : spec::SampleFrom(spec::Distribution(logits, t), rng_);
  tokens_.push_back(token);
  done_ = static_cast<int64_t>(tokens_.size()) >= options_.max_new_tokens ||
          std::find(options_.stop_ids.begin(), options_.stop_ids.end(), token) !=
              options_.stop_ids.end();
}

absl::Status StepAnswers(HfRuntime& runtime, const std::vector<AnswerDecoder*>& answers) {
  std::vector<AnswerDecoder*> going;
  std::vector<KvCache*> caches;
  std::vector<int32_t> ids;
  for (AnswerDecoder* answer : answers) {
    if (answer->done_ || answer->tokens_.empty()) continue;
    going.push_back(answer);
    caches.push_back(&answer->cache_);
    ids.push_back(answer->tokens_.back());
  }
  if (going.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(torch::Tensor last, runtime.DecodeStep(caches, ids));
  const torch::Tensor logits = runtime.Logits(last).to(torch::kCPU);
  for (size_t b = 0; b < going.size(); ++b) going[b]->Pick(logits[static_cast<int64_t>(b)]);
  return absl::OkStatus();
}

spec::DecodeOptions TargetAnswers::OptionsFor(int64_t id) const {
  spec::DecodeOptions options = options_;
  options.seed = options_.seed + static_cast<uint64_t>(id);
  return options;
}

absl::Status TargetAnswers::AnswerAll(const std::vector<std::vector<int32_t>>& prompts,
                                      const std::vector<int64_t>& ids, int64_t batch,
                                      const AnswerSink& done) {
  if (prompts.size() != ids.size() || batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("AnswerAll: ", prompts.size(), " prompts, ",
                                                   ids.size(), " ids, batch ", batch));
  }
  struct Going {
    size_t index;
    std::unique_ptr<AnswerDecoder> answer;
  };
  std::vector<Going> going;
  size_t next = 0;
  while (next < prompts.size() || !going.empty()) {
    while (next < prompts.size() && static_cast<int64_t>(going.size()) < batch) {
      Going g{next, std::make_unique<AnswerDecoder>(OptionsFor(ids[next]))};
      RETURN_IF_ERROR(g.answer->Start(runtime_, prompts[next]));
      going.push_back(std::move(g));
      ++next;
    }
    std::vector<AnswerDecoder*> answers;
    for (Going& g : going) answers.push_back(g.answer.get());
    RETURN_IF_ERROR(StepAnswers(runtime_, answers));
    for (auto it = going.begin(); it != going.end();) {
      if (!it->answer->done()) {
        ++it;
        continue;
      }
      RETURN_IF_ERROR(done(it->index, it->answer->tokens()));
      it = going.erase(it);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<spec::DecodeResult> TargetAnswers::Answer(const std::vector<int32_t>& prompt,
                                                         int64_t id) {
  const auto start = std::chrono::steady_clock::now();
  AnswerDecoder answer(OptionsFor(id));
  RETURN_IF_ERROR(answer.Start(runtime_, prompt));
  while (!answer.done()) RETURN_IF_ERROR(StepAnswers(runtime_, {&answer}));
  spec::DecodeResult result;
  result.tokens = answer.tokens();
  result.stats.sequences = 1;
  result.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace specstream::teacher
