// `specstream-eval`: what a draft gives a real target (docs/evaluation.md).
// The flags of the commands in services/eval/eval_commands.h.
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/exit_code.h"
#include "common/logging.h"
#include "common/openmp_wait.h"
#include "common/torch/threads.h"
#include "services/eval/eval_commands.h"

namespace {

using namespace specstream;            // NOLINT(build/namespaces): a main file
using namespace specstream::services;  // NOLINT(build/namespaces)

int ExitCode(const absl::Status& status) { return ReportExit("specstream-eval", status); }

}  // namespace

int main(int argc, char** argv) {
  // Before any thread: may re-execute this binary (common/openmp_wait.h).
  specstream::PreferPassiveOpenMpWait(argv);
  CLI::App app{"specstream-eval: speculative decoding with a trained draft on a real target"};
  app.require_subcommand(1);
  GenerateOptions gen;
  CLI::App* gen_cmd =
      app.add_subcommand("generate", "The target's own answers to prompts (JSON lines)");
  gen_cmd->add_option("--target", gen.target, "Target checkpoint directory")->required();
  gen_cmd->add_option("--prompts", gen.prompts, "Prompts, JSON lines {id, prompt}")->required();
  gen_cmd->add_option("--out", gen.out, "Output JSON lines")->required();
  gen_cmd->add_option("--split", gen.split, "train | holdout | all (holdout: id % 10 == 9)");
  gen_cmd->add_option("--template", gen.chat_template, "Chat template");
  gen_cmd->add_option("--max-new", gen.max_new, "Tokens per answer at most");
  gen_cmd->add_option("--temperature", gen.temperature, "0: greedy");
  gen_cmd->add_option("--seed", gen.seed, "Sampling seed (plus the prompt id)");
  gen_cmd->add_option("--limit", gen.limit, "First N prompts of the split (0: all)");
  gen_cmd->add_option("--batch", gen.batch,
                      "Answers decoded together (1: one at a time, bit for bit; more: faster)");
  gen_cmd->add_option("--dtype", gen.dtype, "float32 | bfloat16 | auto");

  SpeculateOptions sp;
  CLI::App* sp_cmd =
      app.add_subcommand("speculate", "Speculative decoding against target-only decoding");
  sp_cmd->add_option("--target", sp.target, "Target checkpoint directory")->required();
  sp_cmd->add_option("--draft", sp.drafts, "A draft checkpoint or export (repeatable)");
  sp_cmd->add_option("--untrained-draft", sp.untrained_drafts,
                     "A draft whose architecture is evaluated freshly initialised (repeatable)");
  sp_cmd->add_option("--prompts", sp.prompts, "Prompts, JSON lines {id, prompt}")->required();
  sp_cmd->add_option("--split", sp.split, "train | holdout | all");
  sp_cmd->add_option("--template", sp.chat_template, "Chat template");
  sp_cmd->add_option("--max-new", sp.max_new, "Tokens per answer at most");
  sp_cmd->add_option("--temperatures", sp.temperatures, "Comma-separated, e.g. 0,1");
  sp_cmd->add_option("--k", sp.chain,
                     "EAGLE-3 / EAGLE 3.1 chain length; at most a P-EAGLE draft's K (block drafts "
                     "propose their block)");
  sp_cmd->add_option("--seed", sp.seed, "Sampling seed (plus the prompt id)");
  sp_cmd->add_option("--limit", sp.limit, "First N prompts of the split (0: all)");
  sp_cmd->add_option("--dtype", sp.dtype, "float32 | bfloat16 | auto");
  sp_cmd->add_option("--json", sp.json, "Also write one JSON line per temperature here");
  CLI11_PARSE(app, argc, argv);
  ConfigureComputeThreads();
  if (gen_cmd->parsed()) return ExitCode(Generate(gen));
  return ExitCode(Speculate(sp));
}
