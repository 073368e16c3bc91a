#include "teacher/decode_target.h"

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

absl::StatusOr<spec::DecodeResult> TargetAnswers::Answer(const std::vector<int32_t>& prompt,
                                                         int64_t id) {
  if (prompt.empty()) return absl::InvalidArgumentError("an empty prompt has nothing to answer");
  spec::DecodeOptions options = options_;
  options.seed = options_.seed + static_cast<uint64_t>(id);
  return spec::Decode(target_, nullptr, prompt, options);
}

}  // namespace specstream::teacher
