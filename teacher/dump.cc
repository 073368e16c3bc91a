#include "teacher/dump.h"

#include <chrono>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/chat_template.h"
#include "common/jsonl.h"
#include "common/logging.h"
#include "common/model_contract.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "common/torch/tensor_util.h"
#include "teacher/decode_target.h"
#include "teacher/sample_tensors.h"

namespace specstream::teacher {
namespace {

struct PendingSample {
  int64_t id;
  TokenizedSample sample;
};

int64_t CountRecords(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) ++n;
  }
  return n;
}

// A prompt record's sample: the prompt (loss 0), then the target's answer
// (loss 1), at most options.max_length tokens.
absl::StatusOr<TokenizedSample> Regenerate(const nlohmann::json& record, int64_t index,
                                           const RecordOptions& options, TargetAnswers& answers) {
  ASSIGN_OR_RETURN(PromptRecord prompt, PromptFromRecord(record, options));
  RETURN_IF_ERROR(CheckRoomForAnswer(static_cast<int64_t>(prompt.ids.size()), options.max_length,
                                     "--max-length"));
  ASSIGN_OR_RETURN(spec::DecodeResult answer,
                   answers.Answer(prompt.ids, prompt.id.value_or(index)));
  return AnsweredSample(prompt.ids, answer.tokens, options.max_length);
}

}  // namespace

nlohmann::json DumpContract(const ModelDescription& model, bool keep_target_ids,
                            DType store_dtype) {
  SampleTensorsOptions tensors;
  tensors.hidden_dtype = store_dtype;
  tensors.keep_target_ids = keep_target_ids;
  ModelContract contract;
  contract.model_type = model.model_type;
  contract.runtime = model.runtime;
  contract.hidden_size = model.hidden_size;
  contract.vocab_size = model.vocab_size;
  contract.num_layers = model.num_layers;
  contract.capture_layer_ids = model.capture_layer_ids;
  return nlohmann::json{{"model", contract.ToJson()},
                        {"tensors", StoreTensorsContract(SampleTensorSpecs(model, tensors))}};
}

absl::StatusOr<DumpSummary> RunDump(TargetRuntime& runtime, const DumpOptions& options) {
  if (options.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (options.batch_tokens < 1) return absl::InvalidArgumentError("--batch-tokens must be >= 1");
  ASSIGN_OR_RETURN(DType store_dtype, ParseHiddenDType("--store-dtype", options.store_dtype));
  SampleTensorsOptions tensor_options;
  tensor_options.hidden_dtype = store_dtype;
  tensor_options.keep_target_ids = options.keep_target_ids;
  const ModelDescription& model = runtime.Describe();

  std::unique_ptr<Tokenizer> tokenizer;
  const ChatTemplate* chat_template = nullptr;
  if (!options.tokenizer_dir.empty()) {
    ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromDirectory(options.tokenizer_dir));
    if (tokenizer->vocab_size() > model.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("--tokenizer has ", tokenizer->vocab_size(),
                                                     " ids but the model's vocab is ",
                                                     model.vocab_size));
    }
  }
  if (!options.template_name.empty()) {
    auto found = FindChatTemplate(options.template_name);
    if (!found.ok())
      return absl::InvalidArgumentError(absl::StrCat("--template: ", found.status().message()));
    chat_template = *found;
  }
  RecordOptions record_options;
  record_options.tokenizer = tokenizer.get();
  record_options.chat_template = chat_template;
  record_options.vocab_size = model.vocab_size;
  record_options.max_length =
      options.max_length > 0 ? options.max_length : model.max_position_embeddings;

  ASSIGN_OR_RETURN(
      auto writer,
      StoreWriter::Open(options.out, DumpContract(model, options.keep_target_ids, store_dtype),
                        options.store));
  DumpSummary summary;
  const auto start = std::chrono::steady_clock::now();
  ProgressOptions progress_options;
  progress_options.label = "dump";
  progress_options.total = CountRecords(options.data);
  progress_options.unit = "samples";
  progress_options.terminal = options.progress_terminal;
  ProgressReporter progress(progress_options);
  int64_t records_seen = 0;
  int64_t tokens_seen = 0;

  std::vector<PendingSample> batch;
  int64_t batch_max_len = 0;
  auto flush = [&]() -> absl::Status {
    if (batch.empty()) return absl::OkStatus();
    ForwardRequest request;
    request.want_target_ids = options.keep_target_ids;
    for (const PendingSample& p : batch) request.sequences.push_back(p.sample.input_ids);
    ASSIGN_OR_RETURN(std::vector<SequenceCapture> captures, runtime.Forward(request));
    for (size_t i = 0; i < batch.size(); ++i) {
      const TokenizedSample& s = batch[i].sample;
      const int64_t t = static_cast<int64_t>(s.input_ids.size());
      ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors,
                       SampleTensors(s.input_ids, s.loss_mask, captures[i], tensor_options, 0, t));
      std::vector<TensorView> views;
      for (const NamedTensor& tensor : tensors) views.push_back(ViewOf(tensor.name, tensor.tensor));
      RETURN_IF_ERROR(
          Annotate(writer->Add(batch[i].id, views), absl::StrCat("sample ", batch[i].id)));
      ++summary.samples_written;
      summary.tokens_written += t;
    }
    batch.clear();
    batch_max_len = 0;
    return absl::OkStatus();
  };

  int64_t next_id = 0;
  RETURN_IF_ERROR(
      ForEachJsonLine(options.data, [&](int64_t, const nlohmann::json& record) -> absl::Status {
        const int64_t id = next_id++;
        ++records_seen;
        if (writer->Contains(id)) {
          ++summary.samples_skipped;
          progress.Update(records_seen, tokens_seen);
          return absl::OkStatus();
        }
        TokenizedSample sample;
        if (options.answers != nullptr) {
          ASSIGN_OR_RETURN(sample, Regenerate(record, id, record_options, *options.answers));
        } else {
          ASSIGN_OR_RETURN(sample, SampleFromRecord(record, record_options));
        }
        const int64_t len = static_cast<int64_t>(sample.input_ids.size());
        // A sequence joins the batch while the padded batch stays in budget.
        const int64_t padded =
            (static_cast<int64_t>(batch.size()) + 1) * std::max(batch_max_len, len);
        if (!batch.empty() && padded > options.batch_tokens) RETURN_IF_ERROR(flush());
        batch_max_len = std::max(batch_max_len, len);
        batch.push_back({id, std::move(sample)});
        tokens_seen += len;
        if (static_cast<int64_t>(batch.size()) * batch_max_len >= options.batch_tokens) {
          RETURN_IF_ERROR(flush());
        }
        progress.Update(records_seen, tokens_seen);
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(flush());
  RETURN_IF_ERROR(writer->Finish());
  progress.Update(records_seen, tokens_seen);
  progress.Finish();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SS_LOG_INFO("dump: wrote {} samples ({} tokens), skipped {} already stored, in {:.1f} s to {}",
              summary.samples_written, summary.tokens_written, summary.samples_skipped,
              summary.seconds, options.out);
  return summary;
}

}  // namespace specstream::teacher
