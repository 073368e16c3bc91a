#include "common/chat_template.h"

#include <filesystem>

#include "common/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_tokenizer.h"

namespace specstream {
namespace {

std::vector<ChatMessage> TwoTurns() {
  return {{"system", "Be brief.", ""},
          {"user", "Hi!", ""},
          {"assistant", "Hello.", ""},
          {"user", "2+2?", ""},
          {"assistant", "4", ""}};
}

const ChatTemplate& Template(absl::string_view name) {
  auto t = FindChatTemplate(name);
  EXPECT_TRUE(t.ok()) << t.status();
  return **t;
}

// The trained text: the rendered text restricted to the trained spans.
std::string TrainedText(const RenderedText& r) {
  std::string out;
  for (auto [b, e] : r.trained_spans) out += r.text.substr(b, e - b);
  return out;
}

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::FromJson(testing::TinyTokenizerJson(testing::ChatSpecialTokens()));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = std::move(*t);
  }

  // Renders, tokenizes, and checks the mask selects exactly the trained text.
  void ExpectGolden(absl::string_view name, const std::vector<ChatMessage>& messages,
                    const std::string& text, const std::string& trained) {
    auto rendered = Template(name).Render(messages);
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(rendered->text, text);
    EXPECT_EQ(TrainedText(*rendered), trained);
    auto sample = TokenizeRendered(*tokenizer_, *rendered);
    ASSERT_TRUE(sample.ok()) << sample.status();
    EXPECT_EQ(sample->input_ids, *tokenizer_->EncodeIds(text));
    std::vector<int32_t> trained_ids;
    for (size_t i = 0; i < sample->input_ids.size(); ++i) {
      if (sample->loss_mask[i]) trained_ids.push_back(sample->input_ids[i]);
    }
    EXPECT_EQ(*tokenizer_->Decode(trained_ids), trained);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(ChatTemplateTest, Llama3Golden) {
  ExpectGolden("llama3", TwoTurns(),
               "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>",
               "Hello.<|eot_id|>4<|eot_id|>");
}

TEST_F(ChatTemplateTest, Llama3StripsContent) {
  ExpectGolden("llama3", {{"user", "  hi \n", ""}, {"assistant", "\n yo  ", ""}},
               "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>",
               "yo<|eot_id|>");
}

TEST_F(ChatTemplateTest, ChatMlGolden) {
  ExpectGolden("chatml", TwoTurns(),
               "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
               "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
               "<|im_start|>assistant\n4<|im_end|>\n",
               "Hello.<|im_end|>4<|im_end|>");
}

TEST_F(ChatTemplateTest, QwenAddsDefaultSystemPromptOnlyWhenMissing) {
  ExpectGolden("qwen", {{"user", "Hi!", ""}, {"assistant", "Hello.", ""}},
               "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
               "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n",
               "Hello.<|im_end|>");
  ExpectGolden("qwen", {{"system", "S", ""}, {"user", "Hi!", ""}, {"assistant", "Yo", ""}},
               "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
               "<|im_start|>assistant\nYo<|im_end|>\n",
               "Yo<|im_end|>");
}

TEST_F(ChatTemplateTest, Qwen3ThinkBlock) {
  // With reasoning: the think block is generated, hence trained.
  ExpectGolden("qwen3", {{"user", "2+2?", ""}, {"assistant", "\n4", "\nadd them\n"}},
               "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
               "<think>\nadd them\n</think>\n\n4<|im_end|>\n",
               "<think>\nadd them\n</think>\n\n4<|im_end|>");
  // Without: the empty block belongs to the prompt.
  ExpectGolden("qwen3", {{"user", "Hi", ""}, {"assistant", "Hello", ""}},
               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
               "<think>\n\n</think>\n\nHello<|im_end|>\n",
               "Hello<|im_end|>");
  // Content that carries its own block is kept verbatim.
  ExpectGolden("qwen3", {{"user", "Hi", ""}, {"assistant", "<think>\nx\n</think>\n\nHey", ""}},
               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
               "<think>\nx\n</think>\n\nHey<|im_end|>\n",
               "<think>\nx\n</think>\n\nHey<|im_end|>");
}

TEST_F(ChatTemplateTest, ParsesShareGptAndMessagesForms) {
  auto a = ParseConversation(nlohmann::json::parse(
      R"({"conversations":[{"from":"human","value":"q"},{"from":"gpt","value":"a"}]})"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)[0].role, "user");
  EXPECT_EQ((*a)[1].role, "assistant");
  EXPECT_EQ((*a)[1].content, "a");
  auto b = ParseConversation(nlohmann::json::parse(
      R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","reasoning_content":"r"}]})"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[1].reasoning, "r");
}

TEST_F(ChatTemplateTest, BadConversationsNameTheProblem) {
  auto expect_error = [](const char* json, const char* needle) {
    auto r = ParseConversation(nlohmann::json::parse(json));
    ASSERT_FALSE(r.ok()) << json;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  expect_error(R"({"conversations":[{"role":"robot","content":"x"}]})", "unknown role \"robot\"");
  expect_error(R"({"conversations":[{"role":"user"}]})", "message 0: missing \"content\"");
  expect_error(R"({"conversations":[{"role":"user","content":5}]})",
               "\"content\" must be a string");
  expect_error(R"({"conversations":{}})", "must be an array");
  expect_error(R"({"text":"x"})", "neither");
  EXPECT_FALSE(Template("chatml").Render({{"user", "only a question", ""}}).ok());
  EXPECT_EQ(FindChatTemplate("vicuna").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ChatTemplateTest, RecordsPretokenizedAndTruncated) {
  RecordOptions options;
  options.tokenizer = tokenizer_.get();
  options.chat_template = &Template("chatml");
  auto pre = SampleFromRecord(nlohmann::json::parse(R"({"input_ids":[5,6,7],"loss_mask":[0,1,1]})"),
                              options);
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_EQ(pre->input_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(pre->loss_mask, (std::vector<uint8_t>{0, 1, 1}));

  auto bad =
      SampleFromRecord(nlohmann::json::parse(R"({"input_ids":[5,6],"loss_mask":[1]})"), options);
  EXPECT_NE(bad.status().message().find("\"loss_mask\" has 1 entries"), std::string::npos);
  auto oov = SampleFromRecord(nlohmann::json::parse(R"({"input_ids":[5,100000]})"), options);
  EXPECT_NE(oov.status().message().find("\"input_ids\"[1]"), std::string::npos);

  options.max_length = 4;
  auto conv = SampleFromRecord(
      nlohmann::json::parse(R"({"conversations":[{"role":"user","content":"hello"},)"
                            R"({"role":"assistant","content":"world"}]})"),
      options);
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_EQ(conv->input_ids.size(), 4u);
  EXPECT_EQ(conv->loss_mask.size(), 4u);
}

// dump --regenerate's records: a prompt to answer, as text or ids; one that
// already holds an answer is refused, naming the field.
TEST_F(ChatTemplateTest, PromptRecordsEndWhereTheAnswerStarts) {
  RecordOptions options;
  options.tokenizer = tokenizer_.get();
  options.chat_template = &Template("chatml");
  auto text = PromptFromRecord(nlohmann::json::parse(R"({"id": 7, "prompt": "hello"})"), options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->id, 7);
  EXPECT_EQ(text->ids, *tokenizer_->EncodeIds("<|im_start|>user\nhello<|im_end|>\n"
                                              "<|im_start|>assistant\n"));
  EXPECT_EQ(*PromptIds(Template("chatml"), *tokenizer_, "hello"), text->ids);
  auto ids = PromptFromRecord(nlohmann::json::parse(R"({"input_ids": [5, 6]})"), options);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->ids, (std::vector<int32_t>{5, 6}));
  EXPECT_FALSE(ids->id.has_value());

  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"input_ids": [5, 6], "loss_mask": [0, 1]})", "\"loss_mask\": a record to regenerate"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", "\"messages\": a record to"},
      {R"({"prompt": "x", "input_ids": [5]})", "give one of them"},
      {R"({"id": "seven", "prompt": "x"})", "\"id\" must be an integer"},
      {R"({"question": "x"})", "needs \"prompt\" (a string) or \"input_ids\""},
      {R"({"input_ids": [5, 100000]})", "\"input_ids\"[1]"}};
  for (const auto& [record, message] : refused) {
    auto prompt = PromptFromRecord(nlohmann::json::parse(record), options);
    EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument) << record;
    EXPECT_NE(prompt.status().message().find(message), std::string::npos)
        << record << ": " << prompt.status();
  }
  options.chat_template = nullptr;
  EXPECT_NE(PromptFromRecord(nlohmann::json::parse(R"({"prompt": "x"})"), options)
                .status()
                .message()
                .find("need a tokenizer and a chat template"),
            std::string::npos);
}

// With the real Qwen3 / Llama-3 tokenizers (fetched fixtures), the mask still
// selects exactly the trained text.
TEST(ChatTemplateFixtureTest, RealTokenizersMaskExactlyTheAssistantText) {
  struct Case {
    const char* tokenizer;
    const char* chat_template;
    const char* trained;
  };
  for (Case c : {Case{"qwen3", "qwen3", "Hello.<|im_end|>4<|im_end|>"},
                 Case{"qwen3", "chatml", "Hello.<|im_end|>4<|im_end|>"},
                 Case{"llama3", "llama3", "Hello.<|eot_id|>4<|eot_id|>"}}) {
    std::string dir = testing::FixturesDir() + "/tokenizers/" + c.tokenizer;
    if (!std::filesystem::exists(dir + "/tokenizer.json")) {
      if (testing::RunningInCi()) FAIL() << "missing fixture " << dir;
      GTEST_SKIP() << "fixture " << dir << " not fetched (tests/testing/fetch_fixtures.sh)";
    }
    auto tokenizer = Tokenizer::FromDirectory(dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    auto rendered = Template(c.chat_template).Render(TwoTurns());
    ASSERT_TRUE(rendered.ok());
    auto sample = TokenizeRendered(**tokenizer, *rendered);
    ASSERT_TRUE(sample.ok());
    std::vector<int32_t> trained;
    for (size_t i = 0; i < sample->input_ids.size(); ++i) {
      if (sample->loss_mask[i]) trained.push_back(sample->input_ids[i]);
    }
    EXPECT_EQ(*(*tokenizer)->Decode(trained), std::string(c.trained))
        << c.tokenizer << "/" << c.chat_template;
  }
}

}  // namespace
}  // namespace specstream
