// Chat templates and conversation records -> (input_ids, loss_mask).
//
// Records (one JSON object a line):
//   {"conversations": [{"role": "user", "content": "..."}, ...]}   ShareGPT,
//   also {"from": "human"|"gpt"|"system", "value": "..."} and "messages".
//   Assistant turns may carry "reasoning_content" (rendered by qwen3).
//   {"input_ids": [...], "loss_mask": [...]}   pre-tokenized; passes through
//   (loss_mask optional: all ones).
//
// Templates are a registry of named renderers. Rendering produces the text
// plus the byte spans that are trained (each assistant turn's content and its
// end-of-turn token); the whole text is tokenized once and a token is trained
// when its first byte lies in a trained span, so the ids are exactly those of
// tokenizing the rendered text.
#ifndef SPECSTREAM_COMMON_CHAT_TEMPLATE_H_
#define SPECSTREAM_COMMON_CHAT_TEMPLATE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace specstream {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | "tool"
  std::string content;
  std::string reasoning;  // optional chain of thought (assistant only)
};

// Parses the "conversations" / "messages" array of a record. Errors name the
// message index and field.
absl::StatusOr<std::vector<ChatMessage>> ParseConversation(const nlohmann::json& record);

struct RenderedText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained_spans;  // [begin, end) bytes
};

struct TokenizedSample {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;  // 1 = trained
};

// The registered templates. Names: "llama3", "chatml", "qwen" (chatml with a
// default system prompt), "qwen3" (chatml with the think block).
class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::StatusOr<RenderedText> Render(const std::vector<ChatMessage>& messages) const = 0;
};

// NotFound listing the known names when `name` is not registered.
absl::StatusOr<const ChatTemplate*> FindChatTemplate(absl::string_view name);
std::vector<std::string> ChatTemplateNames();

// Options for turning records into samples.
struct RecordOptions {
  const Tokenizer* tokenizer = nullptr;         // required for conversations
  const ChatTemplate* chat_template = nullptr;  // required for conversations
  int64_t max_length = 0;                       // 0: no truncation
  int64_t vocab_size = 0;                       // 0: take the tokenizer's
};

// Renders + tokenizes a conversation record, or validates a pre-tokenized one.
// Errors name the field and the reason.
absl::StatusOr<TokenizedSample> SampleFromRecord(const nlohmann::json& record,
                                                 const RecordOptions& options);

// The ids of a prompt to answer: `text` as a user turn, then the template's
// assistant header, where the answer starts. What `specstream-eval generate`
// and `specstream-teacher dump --regenerate` decode after.
absl::StatusOr<std::vector<int32_t>> PromptIds(const ChatTemplate& chat, const Tokenizer& tokenizer,
                                               const std::string& text);

// A record to answer (dump --regenerate): {"prompt": text} (PromptIds: needs
// the tokenizer and the template) or {"input_ids": the prompt's ids, ending
// where the answer starts}, either with an optional integer "id" (the
// sampling seed's offset). A record that already holds an answer
// ("loss_mask", "conversations", "messages") is refused, naming the field.
struct PromptRecord {
  std::vector<int32_t> ids;
  std::optional<int64_t> id;
};
absl::StatusOr<PromptRecord> PromptFromRecord(const nlohmann::json& record,
                                              const RecordOptions& options);
// InvalidArgument when a prompt of `length` tokens leaves no room for an
// answer under `max_length` (0: no limit), which `field` names.
absl::Status CheckRoomForAnswer(int64_t length, int64_t max_length, absl::string_view field);
// A regenerated sample: `prompt` (loss 0), then `answer` (loss 1), cut to
// `max_length` tokens (0: no limit).
TokenizedSample AnsweredSample(const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& answer, int64_t max_length);

// Tokenizes `rendered.text` and builds the loss mask from its trained spans.
absl::StatusOr<TokenizedSample> TokenizeRendered(const Tokenizer& tokenizer,
                                                 const RenderedText& rendered);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_CHAT_TEMPLATE_H_
