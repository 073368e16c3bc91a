// `specstream`: the user-facing CLI. Links no LibTorch.
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/exit_code.h"
#include "common/logging.h"
#include "services/cli/data_commands.h"
#include "services/cli/job_commands.h"

namespace {

int Finish(const absl::Status& status) { return specstream::ReportExit("specstream", status); }

// The connection and output options every job command takes.
void AddRemoteOptions(CLI::App* command, specstream::services::RemoteOptions& remote,
                      const std::string& timeout_help) {
  command->add_option("-o,--output", remote.output, "Output format: table | json")
      ->check(CLI::IsMember({"table", "json"}));
  command->add_option("--address", remote.address,
                      "Coordinator host:port (default: $SPECSTREAM_ADDRESS)");
  command->add_option("--token-file", remote.token_file,
                      "File holding the bearer token (default: $SPECSTREAM_TOKEN)");
  command->add_option("--tls-ca", remote.tls_ca, "PEM CA bundle: use TLS and verify the server");
  command->add_option("--timeout", remote.timeout_seconds, timeout_help)
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

int main(int argc, char** argv) {
  using specstream::services::RemoteOptions;
  using specstream::services::RenderOptions;
  using specstream::services::SubmitOptions;
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

  // Remote job commands (JobService on the coordinator).
  const std::string rpc_timeout_help = "Seconds to wait for the coordinator's answer (default 30)";
  RemoteOptions remote;
  SubmitOptions submit;
  CLI::App* submit_cmd =
      app.add_subcommand("submit", "Submit a job spec (YAML) to the coordinator");
  submit_cmd->add_option("spec", submit.spec_path, "Job spec YAML file")->required();
  submit_cmd->add_option("--id", submit.id, "Job id (default: <name>-<8 hex>)");
  auto* wait_flag = submit_cmd->add_flag("--wait", submit.wait,
                                         "Wait for the job to end (exit 0 only if it SUCCEEDED)");
  submit_cmd
      ->add_flag("--follow,-f", submit.follow,
                 "Stream logs and progress until the job ends (exit 0 only if it SUCCEEDED)")
      ->excludes(wait_flag);
  AddRemoteOptions(submit_cmd, remote,
                   "Seconds for the coordinator's answer and, with --wait/--follow, for the job "
                   "to end (exit 124)");

  std::string job_id;
  CLI::App* status_cmd = app.add_subcommand("status", "Show a job");
  status_cmd->add_option("id", job_id, "Job id")->required();
  AddRemoteOptions(status_cmd, remote, rpc_timeout_help);

  int32_t list_limit = 0;
  CLI::App* list_cmd = app.add_subcommand("list", "List jobs, newest first");
  list_cmd->add_option("--limit", list_limit, "At most this many jobs (0: all)")
      ->check(CLI::NonNegativeNumber);
  AddRemoteOptions(list_cmd, remote, rpc_timeout_help);

  bool logs_follow = false;
  CLI::App* logs_cmd = app.add_subcommand("logs", "Print a job's log lines");
  logs_cmd->add_option("id", job_id, "Job id")->required();
  logs_cmd->add_flag("-f,--follow", logs_follow, "Keep printing until the job ends");
  AddRemoteOptions(logs_cmd, remote, rpc_timeout_help + "; with -f, for the job to end");

  std::string stop_reason;
  CLI::App* stop_cmd = app.add_subcommand("stop", "Stop a queued or running job");
  stop_cmd->add_option("id", job_id, "Job id")->required();
  stop_cmd->add_option("--reason", stop_reason, "Why (recorded as the job's reason)");
  AddRemoteOptions(stop_cmd, remote, rpc_timeout_help);

  std::string validate_path;
  std::string validate_output = "table";
  CLI::App* validate_cmd = app.add_subcommand(
      "validate", "Check a job spec locally, as submit would (exit 2 naming the field)");
  validate_cmd->add_option("spec", validate_path, "Job spec YAML file")->required();
  validate_cmd->add_option("-o,--output", validate_output, "table | json (defaults filled)")
      ->check(CLI::IsMember({"table", "json"}));

  CLI::App* wait_cmd =
      app.add_subcommand("wait", "Wait for a job to end (exit 0 SUCCEEDED, 1 FAILED/STOPPED)");
  wait_cmd->add_option("id", job_id, "Job id")->required();
  AddRemoteOptions(wait_cmd, remote, "Give up after this many seconds (exit 124)");

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
  namespace svc = specstream::services;
  if (*submit_cmd) return Finish(svc::RunSubmit(remote, submit, std::cout, std::cerr));
  if (*status_cmd) return Finish(svc::RunStatus(remote, job_id, std::cout));
  if (*list_cmd) return Finish(svc::RunList(remote, list_limit, std::cout));
  if (*logs_cmd) return Finish(svc::RunLogs(remote, job_id, logs_follow, std::cout, std::cerr));
  if (*stop_cmd) return Finish(svc::RunStop(remote, job_id, stop_reason, std::cout));
  if (*wait_cmd) return Finish(svc::RunWait(remote, job_id, std::cout, std::cerr));
  if (*validate_cmd) return Finish(svc::RunValidate(validate_path, validate_output, std::cout));
  return 2;
}
