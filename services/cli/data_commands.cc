#include "services/cli/data_commands.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat_template.h"
#include "common/file.h"
#include "common/hf_config.h"
#include "common/jsonl.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "common/vocab_map.h"
#include "nlohmann/json.hpp"

namespace specstream::services {
namespace {

constexpr int64_t kProgressEvery = 10000;

// Collects output lines; they reach the file (atomically) or stdout only on
// Finish(), so a failed run leaves nothing behind.
class LineOutput final {
 public:
  static absl::StatusOr<LineOutput> Open(const std::string& path) {
    LineOutput out;
    if (!path.empty()) {
      ASSIGN_OR_RETURN(out.file_, AtomicOutputFile::Create(path));
    }
    return out;
  }

  absl::Status Write(const nlohmann::json& value) {
    std::string line = value.dump();
    line.push_back('\n');
    if (file_) return file_->Append(line);
    buffer_ += line;
    return absl::OkStatus();
  }

  absl::Status Finish(std::ostream& stdout_stream) {
    if (file_) return file_->Commit();
    stdout_stream << buffer_;
    stdout_stream.flush();
    if (!stdout_stream) return absl::DataLossError("cannot write to stdout");
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<AtomicOutputFile> file_;
  std::string buffer_;
};

void ReportProgress(const char* what, int64_t count) {
  if (count % kProgressEvery == 0) SS_LOG_INFO("{}: {} lines", what, count);
}

}  // namespace

absl::Status RunTokenize(const TokenizeOptions& options, std::ostream& stdout_stream) {
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromDirectory(options.tokenizer_dir));
  ASSIGN_OR_RETURN(LineOutput out, LineOutput::Open(options.output));
  int64_t count = 0;
  RETURN_IF_ERROR(
      ForEachJsonLine(options.input, [&](int64_t, const nlohmann::json& record) -> absl::Status {
        auto text = record.is_object() ? record.find("text") : record.end();
        if (!record.is_object() || text == record.end() || !text->is_string()) {
          return absl::InvalidArgumentError("expected an object with a string \"text\"");
        }
        ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         tokenizer->EncodeIds(text->get_ref<const std::string&>()));
        ReportProgress("tokenize", ++count);
        return out.Write(nlohmann::json{{"ids", ids}});
      }));
  RETURN_IF_ERROR(out.Finish(stdout_stream));
  SS_LOG_INFO("tokenize: {} lines done", count);
  return absl::OkStatus();
}

absl::Status RunRender(const RenderOptions& options, std::ostream& stdout_stream) {
  if (options.max_length < 0) return absl::InvalidArgumentError("--max-length must be >= 0");
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromDirectory(options.tokenizer_dir));
  auto chat_template = FindChatTemplate(options.template_name);
  if (!chat_template.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--template: ", chat_template.status().message()));
  }
  RecordOptions record_options;
  record_options.tokenizer = tokenizer.get();
  record_options.chat_template = *chat_template;
  record_options.max_length = options.max_length;
  ASSIGN_OR_RETURN(LineOutput out, LineOutput::Open(options.output));
  int64_t count = 0;
  int64_t trained = 0;
  RETURN_IF_ERROR(
      ForEachJsonLine(options.input, [&](int64_t, const nlohmann::json& record) -> absl::Status {
        ASSIGN_OR_RETURN(TokenizedSample sample, SampleFromRecord(record, record_options));
        for (uint8_t m : sample.loss_mask) trained += m;
        ReportProgress("render", ++count);
        return out.Write(
            nlohmann::json{{"input_ids", sample.input_ids}, {"loss_mask", sample.loss_mask}});
      }));
  RETURN_IF_ERROR(out.Finish(stdout_stream));
  SS_LOG_INFO("render: {} records, {} trained tokens", count, trained);
  return absl::OkStatus();
}

absl::StatusOr<VocabMapSummary> RunVocabMap(const VocabMapOptions& options) {
  if (options.output.empty()) return absl::InvalidArgumentError("--out is required");
  if (options.draft_vocab < 1) return absl::InvalidArgumentError("--draft-vocab must be >= 1");
  int64_t target_vocab = options.target_vocab;
  if (target_vocab == 0 && !options.model_dir.empty()) {
    ASSIGN_OR_RETURN(HfModelConfig config, LoadHfConfig(options.model_dir));
    target_vocab = config.vocab_size;
  }
  // Read once to validate every line and find the vocab bound; the counter
  // then needs the final size.
  std::vector<std::pair<std::vector<int32_t>, std::vector<uint8_t>>> records;
  int64_t max_id = -1;
  RETURN_IF_ERROR(
      ForEachJsonLine(options.input, [&](int64_t, const nlohmann::json& record) -> absl::Status {
        if (!record.is_object()) return absl::InvalidArgumentError("record must be an object");
        const char* field = record.contains("input_ids") ? "input_ids" : "ids";
        std::vector<int64_t> ids;
        RETURN_IF_ERROR(
            ReadIntArray(record, field, 0, target_vocab > 0 ? target_vocab - 1 : INT32_MAX, &ids));
        std::vector<int64_t> mask;
        if (record.contains("loss_mask")) {
          RETURN_IF_ERROR(ReadIntArray(record, "loss_mask", 0, 1, &mask));
          if (mask.size() != ids.size()) {
            return absl::InvalidArgumentError(absl::StrCat("\"loss_mask\" has ", mask.size(),
                                                           " entries but \"", field, "\" has ",
                                                           ids.size()));
          }
        }
        for (int64_t id : ids) max_id = std::max(max_id, id);
        records.emplace_back(std::vector<int32_t>(ids.begin(), ids.end()),
                             std::vector<uint8_t>(mask.begin(), mask.end()));
        ReportProgress("vocab-map", static_cast<int64_t>(records.size()));
        return absl::OkStatus();
      }));
  if (target_vocab == 0) {
    target_vocab = std::max<int64_t>(max_id + 1, options.draft_vocab);
    SS_LOG_WARN(
        "vocab-map: target vocab inferred as {} from the data; pass --target-vocab "
        "or --model to size t2d to the target model",
        target_vocab);
  }
  TokenCounter counter(target_vocab);
  for (const auto& [ids, mask] : records) RETURN_IF_ERROR(counter.Add(ids, mask));
  ASSIGN_OR_RETURN(VocabMap map, BuildVocabMap(counter, options.draft_vocab));
  RETURN_IF_ERROR(SaveVocabMap(map, options.output));
  VocabMapSummary summary{static_cast<int64_t>(records.size()), counter.total(), target_vocab,
                          options.draft_vocab, map.coverage};
  SS_LOG_INFO("vocab-map: {} records, {} counted tokens, draft vocab {} of {} covers {:.2f}%",
              summary.records, summary.counted_tokens, summary.draft_vocab, summary.target_vocab,
              100.0 * summary.coverage);
  return summary;
}

}  // namespace specstream::services
