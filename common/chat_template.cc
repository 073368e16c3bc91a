#include "common/chat_template.h"

#include <algorithm>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jsonl.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace specstream {
namespace {

absl::StatusOr<std::string> StringField(const nlohmann::json& message, size_t index,
                                        const char* field, bool required) {
  auto it = message.find(field);
  if (it == message.end() || it->is_null()) {
    if (!required) return std::string();
    return absl::InvalidArgumentError(
        absl::StrCat("conversation message ", index, ": missing \"", field, "\""));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("conversation message ", index, ": \"", field, "\" must be a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::string> NormalizeRole(absl::string_view role, size_t index) {
  // ShareGPT speaker names map onto chat roles.
  static const auto* kRoles = new std::map<std::string, std::string, std::less<>>{
      {"system", "system"}, {"user", "user"},       {"human", "user"}, {"assistant", "assistant"},
      {"gpt", "assistant"}, {"model", "assistant"}, {"tool", "tool"}};
  auto it = kRoles->find(role);
  if (it == kRoles->end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("conversation message ", index, ": unknown role \"", role,
                     "\" (expected system, user/human, assistant/gpt, tool)"));
  }
  return it->second;
}

absl::string_view StripWhitespace(absl::string_view s) { return absl::StripAsciiWhitespace(s); }

absl::string_view StripNewlines(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Appends text; when `trained`, records its span.
class TextBuilder final {
 public:
  void Add(absl::string_view piece) { out_.text.append(piece.data(), piece.size()); }
  void AddTrained(absl::string_view piece) {
    size_t begin = out_.text.size();
    Add(piece);
    if (!out_.trained_spans.empty() && out_.trained_spans.back().second == begin) {
      out_.trained_spans.back().second = out_.text.size();
    } else if (!piece.empty()) {
      out_.trained_spans.emplace_back(begin, out_.text.size());
    }
  }
  RenderedText Finish() { return std::move(out_); }

 private:
  RenderedText out_;
};

absl::Status RequireAssistantTurn(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return absl::InvalidArgumentError("conversation is empty");
  for (const ChatMessage& m : messages) {
    if (m.role == "assistant") return absl::OkStatus();
  }
  return absl::InvalidArgumentError("conversation has no assistant turn (nothing to train)");
}

// Llama-3 instruct: <|begin_of_text|> then per message
// <|start_header_id|>role<|end_header_id|>\n\n{content stripped}<|eot_id|>.
class Llama3Template final : public ChatTemplate {
 public:
  absl::string_view name() const override { return "llama3"; }
  absl::StatusOr<RenderedText> Render(const std::vector<ChatMessage>& messages) const override {
    RETURN_IF_ERROR(RequireAssistantTurn(messages));
    TextBuilder b;
    b.Add("<|begin_of_text|>");
    for (const ChatMessage& m : messages) {
      b.Add(absl::StrCat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n"));
      if (m.role == "assistant") {
        b.AddTrained(StripWhitespace(m.content));
        b.AddTrained("<|eot_id|>");
      } else {
        b.Add(StripWhitespace(m.content));
        b.Add("<|eot_id|>");
      }
    }
    return b.Finish();
  }
};

// ChatML (Qwen2/Qwen2.5): <|im_start|>role\n{content}<|im_end|>\n.
// `default_system` is inserted when the first message is not a system one;
// `think` renders Qwen3's reasoning block in assistant turns:
//   <think>\n{reasoning}\n</think>\n\n{content}   (trained), or, when the turn
// has no reasoning and its content does not open a block itself, the empty
// block Qwen3 uses with thinking disabled (part of the prompt, not trained).
class ChatMlTemplate final : public ChatTemplate {
 public:
  ChatMlTemplate(std::string name, std::string default_system, bool think)
      : name_(std::move(name)), default_system_(std::move(default_system)), think_(think) {}

  absl::string_view name() const override { return name_; }

  absl::StatusOr<RenderedText> Render(const std::vector<ChatMessage>& messages) const override {
    RETURN_IF_ERROR(RequireAssistantTurn(messages));
    TextBuilder b;
    if (!default_system_.empty() && messages.front().role != "system") {
      b.Add(absl::StrCat("<|im_start|>system\n", default_system_, "<|im_end|>\n"));
    }
    for (const ChatMessage& m : messages) {
      b.Add(absl::StrCat("<|im_start|>", m.role, "\n"));
      if (m.role != "assistant") {
        b.Add(m.content);
        b.Add("<|im_end|>\n");
        continue;
      }
      if (think_) {
        if (!m.reasoning.empty()) {
          b.AddTrained(absl::StrCat("<think>\n", StripNewlines(m.reasoning), "\n</think>\n\n"));
          absl::string_view content = m.content;
          while (!content.empty() && content.front() == '\n') content.remove_prefix(1);
          b.AddTrained(content);
        } else if (absl::StrContains(m.content, "<think>")) {
          b.AddTrained(m.content);
        } else {
          // What Qwen3 puts in the prompt with thinking disabled: the model
          // does not generate it, so it is not trained.
          b.Add("<think>\n\n</think>\n\n");
          b.AddTrained(m.content);
        }
      } else {
        b.AddTrained(m.content);
      }
      b.AddTrained("<|im_end|>");
      b.Add("\n");
    }
    return b.Finish();
  }

 private:
  std::string name_;
  std::string default_system_;
  bool think_;
};

const std::vector<std::unique_ptr<ChatTemplate>>& Registry() {
  static const auto* registry = [] {
    auto* r = new std::vector<std::unique_ptr<ChatTemplate>>();
    r->push_back(std::make_unique<Llama3Template>());
    r->push_back(std::make_unique<ChatMlTemplate>("chatml", "", false));
    r->push_back(std::make_unique<ChatMlTemplate>("qwen", "You are a helpful assistant.", false));
    r->push_back(std::make_unique<ChatMlTemplate>("qwen3", "", true));
    return r;
  }();
  return *registry;
}

}  // namespace

absl::StatusOr<std::vector<ChatMessage>> ParseConversation(const nlohmann::json& record) {
  if (!record.is_object()) return absl::InvalidArgumentError("record must be a JSON object");
  const char* key = record.contains("conversations") ? "conversations" : "messages";
  auto it = record.find(key);
  if (it == record.end()) {
    return absl::InvalidArgumentError(
        "record has neither \"conversations\" nor \"messages\" nor \"input_ids\"");
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an array"));
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& m = (*it)[i];
    if (!m.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("conversation message ", i, " is not an object"));
    }
    bool sharegpt = m.contains("from");
    ASSIGN_OR_RETURN(std::string role, StringField(m, i, sharegpt ? "from" : "role", true));
    ASSIGN_OR_RETURN(std::string content, StringField(m, i, sharegpt ? "value" : "content", true));
    ASSIGN_OR_RETURN(std::string reasoning, StringField(m, i, "reasoning_content", false));
    ASSIGN_OR_RETURN(role, NormalizeRole(role, i));
    messages.push_back({std::move(role), std::move(content), std::move(reasoning)});
  }
  return messages;
}

absl::StatusOr<const ChatTemplate*> FindChatTemplate(absl::string_view name) {
  for (const auto& t : Registry()) {
    if (t->name() == name) return t.get();
  }
  return absl::NotFoundError(absl::StrCat("unknown chat template \"", name, "\" (known: ",
                                          absl::StrJoin(ChatTemplateNames(), ", "), ")"));
}

std::vector<std::string> ChatTemplateNames() {
  std::vector<std::string> names;
  for (const auto& t : Registry()) names.emplace_back(t->name());
  return names;
}

absl::StatusOr<TokenizedSample> TokenizeRendered(const Tokenizer& tokenizer,
                                                 const RenderedText& rendered) {
  ASSIGN_OR_RETURN(Encoding encoding, tokenizer.Encode(rendered.text));
  TokenizedSample sample;
  sample.input_ids = std::move(encoding.ids);
  sample.loss_mask.assign(sample.input_ids.size(), 0);
  // Spans and token offsets are both sorted: one merge pass.
  size_t span = 0;
  for (size_t i = 0; i < sample.input_ids.size(); ++i) {
    size_t begin = encoding.offsets[i].first;
    while (span < rendered.trained_spans.size() && rendered.trained_spans[span].second <= begin) {
      ++span;
    }
    if (span < rendered.trained_spans.size() && rendered.trained_spans[span].first <= begin) {
      sample.loss_mask[i] = 1;
    }
  }
  return sample;
}

absl::StatusOr<std::vector<int32_t>> PromptIds(const ChatTemplate& chat, const Tokenizer& tokenizer,
                                               const std::string& text) {
  // The assistant turn's trained span starts where the answer goes.
  ASSIGN_OR_RETURN(RenderedText rendered,
                   chat.Render({{"user", text, ""}, {"assistant", "x", ""}}));
  if (rendered.trained_spans.empty()) {
    return absl::InternalError(
        absl::StrCat("the chat template ", chat.name(), " marked no assistant span"));
  }
  return tokenizer.EncodeIds(rendered.text.substr(0, rendered.trained_spans[0].first));
}

absl::StatusOr<PromptRecord> PromptFromRecord(const nlohmann::json& record,
                                              const RecordOptions& options) {
  if (!record.is_object()) return absl::InvalidArgumentError("record must be a JSON object");
  for (const char* answered : {"loss_mask", "conversations", "messages"}) {
    if (record.contains(answered)) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", answered,
                       "\": a record to regenerate is a prompt, {\"prompt\": text} or "
                       "{\"input_ids\": prompt ids}; this one already holds an answer"));
    }
  }
  PromptRecord prompt;
  if (record.contains("id")) {
    if (!record["id"].is_number_integer()) {
      return absl::InvalidArgumentError("\"id\" must be an integer");
    }
    prompt.id = record["id"].get<int64_t>();
  }
  if (record.contains("input_ids")) {
    if (record.contains("prompt")) {
      return absl::InvalidArgumentError("\"prompt\" and \"input_ids\": give one of them");
    }
    ASSIGN_OR_RETURN(TokenizedSample sample, SampleFromRecord(record, options));
    prompt.ids = std::move(sample.input_ids);
    return prompt;
  }
  if (!record.contains("prompt") || !record["prompt"].is_string()) {
    return absl::InvalidArgumentError(
        "a record to regenerate needs \"prompt\" (a string) or \"input_ids\"");
  }
  if (options.tokenizer == nullptr || options.chat_template == nullptr) {
    return absl::InvalidArgumentError("\"prompt\" records need a tokenizer and a chat template");
  }
  ASSIGN_OR_RETURN(prompt.ids, PromptIds(*options.chat_template, *options.tokenizer,
                                         record["prompt"].get<std::string>()));
  if (prompt.ids.empty()) return absl::InvalidArgumentError("\"prompt\" renders to no tokens");
  return prompt;
}

absl::Status CheckRoomForAnswer(int64_t length, int64_t max_length, absl::string_view field) {
  if (max_length > 0 && length >= max_length) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt's ", length,
                                                   " tokens leave no room for an answer under ",
                                                   field, " ", max_length));
  }
  return absl::OkStatus();
}

TokenizedSample AnsweredSample(const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& answer, int64_t max_length) {
  TokenizedSample sample;
  sample.input_ids = prompt;
  sample.loss_mask.assign(prompt.size(), 0);
  sample.input_ids.insert(sample.input_ids.end(), answer.begin(), answer.end());
  sample.loss_mask.resize(sample.input_ids.size(), 1);
  if (max_length > 0 && static_cast<int64_t>(sample.input_ids.size()) > max_length) {
    sample.input_ids.resize(max_length);
    sample.loss_mask.resize(max_length);
  }
  return sample;
}

absl::StatusOr<TokenizedSample> SampleFromRecord(const nlohmann::json& record,
                                                 const RecordOptions& options) {
  if (!record.is_object()) return absl::InvalidArgumentError("record must be a JSON object");
  TokenizedSample sample;
  if (record.contains("input_ids")) {
    int64_t vocab = options.vocab_size;
    if (vocab == 0 && options.tokenizer != nullptr) vocab = options.tokenizer->vocab_size();
    std::vector<int64_t> ids;
    RETURN_IF_ERROR(ReadIntArray(record, "input_ids", 0, vocab > 0 ? vocab - 1 : INT32_MAX, &ids));
    sample.input_ids.assign(ids.begin(), ids.end());
    if (record.contains("loss_mask")) {
      std::vector<int64_t> mask;
      RETURN_IF_ERROR(ReadIntArray(record, "loss_mask", 0, 1, &mask));
      if (mask.size() != ids.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"loss_mask\" has ", mask.size(), " entries but \"input_ids\" has ", ids.size()));
      }
      sample.loss_mask.assign(mask.begin(), mask.end());
    } else {
      sample.loss_mask.assign(ids.size(), 1);
    }
  } else {
    if (options.tokenizer == nullptr || options.chat_template == nullptr) {
      return absl::InvalidArgumentError(
          "conversation records need a tokenizer and a chat template");
    }
    ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ParseConversation(record));
    ASSIGN_OR_RETURN(RenderedText rendered, options.chat_template->Render(messages));
    ASSIGN_OR_RETURN(sample, TokenizeRendered(*options.tokenizer, rendered));
  }
  if (sample.input_ids.empty()) return absl::InvalidArgumentError("sample has no tokens");
  if (options.max_length > 0 &&
      static_cast<int64_t>(sample.input_ids.size()) > options.max_length) {
    sample.input_ids.resize(options.max_length);
    sample.loss_mask.resize(options.max_length);
  }
  return sample;
}

}  // namespace specstream
