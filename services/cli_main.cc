// `specstream`: the user-facing CLI. Links no LibTorch.
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "services/data_commands.h"

namespace {

int Finish(const absl::Status& status) {
  if (status.ok()) return 0;
  std::cerr << "specstream: " << status.message() << "\n";
  return specstream::services::ExitCodeFor(status);
}

}  // namespace

int main(int argc, char** argv) {
  using specstream::services::RenderOptions;
  using specstream::services::TokenizeOptions;
  using specstream::services::VocabMapOptions;

  CLI::App app{"SpecStream: train speculative-decoding drafts from live teachers"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");

  CLI::App* data = app.add_subcommand("data", "Prepare training data offline");
  data->require_subcommand(1);

  TokenizeOptions tokenize;
  CLI::App* tokenize_cmd = data->add_subcommand(
      "tokenize", "{\"text\"} lines -> {\"ids\"} lines (no special tokens added)");
  tokenize_cmd
      ->add_option("--tokenizer", tokenize.tokenizer_dir, "Directory holding tokenizer.json")
      ->required();
  tokenize_cmd->add_option("--input", tokenize.input, "Input JSON lines")->required();
  tokenize_cmd->add_option("--out", tokenize.output, "Output file (default: stdout)");

  RenderOptions render;
  CLI::App* render_cmd = data->add_subcommand(
      "render", "Conversations -> {\"input_ids\",\"loss_mask\"} lines (assistant-only mask)");
  render_cmd->add_option("--tokenizer", render.tokenizer_dir, "Directory holding tokenizer.json")
      ->required();
  render_cmd->add_option("--template", render.template_name, "llama3 | chatml | qwen | qwen3")
      ->required();
  render_cmd->add_option("--input", render.input, "Conversation JSON lines")->required();
  render_cmd->add_option("--out", render.output, "Output file (default: stdout)");
  render_cmd->add_option("--max-length", render.max_length,
                         "Truncate to this many tokens (0: off)");

  VocabMapOptions vocab;
  CLI::App* vocab_cmd = data->add_subcommand(
      "vocab-map", "Token frequencies -> draft vocab map (d2t, t2d) as safetensors");
  vocab_cmd->add_option("--input", vocab.input, "Tokenized or rendered JSON lines")->required();
  vocab_cmd->add_option("--draft-vocab", vocab.draft_vocab, "Draft vocabulary size")->required();
  vocab_cmd->add_option("--out", vocab.output, "Output map.safetensors")->required();
  vocab_cmd->add_option("--target-vocab", vocab.target_vocab,
                        "Target vocabulary size (default: --model's, else max id + 1)");
  vocab_cmd->add_option("--model", vocab.model_dir, "Target checkpoint (reads config.json)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  specstream::LoggingOptions logging;
  logging.role = "cli";
  logging.level = log_level;
  if (!specstream::InitLogging(logging)) {
    std::cerr << "specstream: unknown --log-level \"" << log_level << "\"\n";
    return 2;
  }

  if (*tokenize_cmd) return Finish(specstream::services::RunTokenize(tokenize, std::cout));
  if (*render_cmd) return Finish(specstream::services::RunRender(render, std::cout));
  if (*vocab_cmd) return Finish(specstream::services::RunVocabMap(vocab).status());
  return 2;
}
