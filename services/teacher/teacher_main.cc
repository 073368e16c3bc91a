// `specstream-teacher`: the target-model side.
//   init-random  write a random checkpoint in HF layout (tests, demo)
//   import-gguf  convert a llama.cpp GGUF (Llama) into an HF checkpoint
//   forward      run one sequence and print each capture's shape and checksum
//   dump         write the offline store for a dataset
//   serve        answer TeacherService streams (gRPC) until SIGTERM/SIGINT
//   tp-worker    (internal) one tensor-parallel rank, started by the others
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>

#include <filesystem>
#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#include "common/capture_layers.h"
#include "common/exit_code.h"
#include "common/file.h"
#include "common/grpc/auth.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/net_address.h"
#include "common/openmp_wait.h"
#include "common/shutdown_signal.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "common/torch/tensor_util.h"
#include "common/torch/threads.h"
#include "common/transport/shm_ring.h"
#include "services/daemon/registration.h"
#include "services/teacher/teacher_daemon.h"
#include "teacher/decode_target.h"
#include "teacher/dump.h"
#include "teacher/gguf_import.h"
#include "teacher/init_random.h"
#include "teacher/model_weights.h"
#include "teacher/sample_tensors.h"
#include "teacher/tp_launcher.h"
#if SPECSTREAM_WITH_NCCL
#include "common/transport/nccl_util.h"
#endif

namespace {

using namespace specstream;           // NOLINT(build/namespaces): a main file
using namespace specstream::teacher;  // NOLINT(build/namespaces)

int ExitCode(const absl::Status& status) { return ReportExit("specstream-teacher", status); }

absl::StatusOr<std::vector<int>> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", part, "\" is not an integer"));
    }
    out.push_back(value);
  }
  return out;
}

// Flags shared by every command that loads the target.
struct RuntimeFlags {
  std::string model;
  std::string devices = "cpu";
  std::string dtype = "auto";
  std::string capture;
  std::string runtime = "hf";
  std::string capture_for = "eagle3";  // what the captures feed: eagle3 | any
  int tp = 0;                          // 0: one rank per --devices entry
  int ep = 1;
  std::string log_level;  // the global --log-level, handed to the TP workers

  void Add(CLI::App* app) {
    app->add_option("--model", model, "Target checkpoint directory (HF layout)")->required();
    app->add_option("--devices", devices,
                    "One TP rank per device: cpu,cpu or cuda:0,cuda:1 (tensor parallel)");
    app->add_option("--tp", tp,
                    "Tensor-parallel ranks (default: one per --devices entry; with --devices "
                    "cpu, N cpu ranks)");
    app->add_option("--ep", ep,
                    "Expert-parallel ranks within the TP group (MoE models, --runtime sglang)");
    app->add_option("--dtype", dtype, "auto | float32 | bfloat16");
    app->add_option("--capture-layers", capture,
                    "Capture layer ids (default EAGLE-3's 1,L/2-1,L-4; block drafts name theirs)");
    app->add_option("--capture-for", capture_for,
                    "eagle3 (default: --capture-layers must be 3 ascending ids below L-1, what "
                    "an EAGLE-3 draft and its servers use) | any");
    app->add_option("--runtime", runtime, "Target runtime: hf | sglang (token-packed, fused)");
  }

  // The launch these flags describe. `check_machine` false checks what can
  // be checked anywhere (names, numbers, the TP/EP layout), not that this
  // machine has the devices (--check-config).
  absl::StatusOr<RuntimeSpec> Spec(bool check_machine) const {
    RuntimeSpec spec;
    if (runtime != "hf" && runtime != "sglang") {
      return absl::InvalidArgumentError(
          absl::StrCat("--runtime \"", runtime, "\" (available: hf, sglang)"));
    }
    // The loader's own dtype rule ("auto" resolved later, from config.json).
    RETURN_IF_ERROR(ResolveComputeDtype(dtype, HfModelConfig{}).status());
    spec.runtime = runtime;
    spec.model_dir = model;
    spec.dtype = dtype;
    ASSIGN_OR_RETURN(spec.capture_layer_ids, ParseIntList("--capture-layers", capture));
    ASSIGN_OR_RETURN(spec.devices, ParseDevices(devices, check_machine));
    if (tp < 0) return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, " must be positive"));
    if (tp > 0 && spec.devices == std::vector<std::string>{"cpu"}) {
      spec.devices.assign(tp, "cpu");
    } else if (tp > 0 && tp != static_cast<int>(spec.devices.size())) {
      return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, " does not match the ",
                                                     spec.devices.size(), " --devices given"));
    }
    RETURN_IF_ERROR(CheckExpertParallelSize(ep, static_cast<int>(spec.devices.size())));
    spec.ep_size = ep;
    spec.log_level = log_level;
    return spec;
  }

  // Explicit --capture-layers meant for EAGLE-3 that no EAGLE-3 draft or
  // server can use, refused before the model loads rather than after a
  // dump or a training run.
  absl::Status CheckCaptureLayers(const RuntimeSpec& spec) const {
    if (capture_for != "eagle3" && capture_for != "any") {
      return absl::InvalidArgumentError(
          absl::StrCat("--capture-for \"", capture_for, "\" (available: eagle3, any)"));
    }
    if (capture_for != "eagle3" || spec.capture_layer_ids.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(const HfModelConfig config, LoadHfConfig(model));
    if (absl::Status valid =
            ValidateEagle3CaptureLayers(spec.capture_layer_ids, config.num_hidden_layers);
        !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--capture-layers: ", valid.message(), " (", config.num_hidden_layers,
                       " layers; these feed an EAGLE-3 draft: --capture-for any to capture "
                       "other layers)"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<LaunchedRuntime>> Launch() const {
    ASSIGN_OR_RETURN(RuntimeSpec spec, Spec(/*check_machine=*/true));
    RETURN_IF_ERROR(CheckCaptureLayers(spec));
    ASSIGN_OR_RETURN(spec.worker_executable, SelfExecutable());
    return LaunchRuntime(spec);
  }
};

// dump --regenerate: the target writes each prompt's answer.
struct RegenerateFlags {
  bool on = false;
  int64_t max_new = 128;
  double temperature = 0;
  uint64_t seed = 0;

  // Before the model loads.
  absl::Status Check(const RuntimeFlags& runtime) const {
    if (!on) return absl::OkStatus();
    if (max_new < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--max-new ", max_new, " must be >= 1"));
    }
    if (!(temperature >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--temperature ", temperature, " must be >= 0 (0: greedy)"));
    }
    if (runtime.runtime != "hf" || runtime.tp > 1 || absl::StrContains(runtime.devices, ",")) {
      return absl::InvalidArgumentError(
          "--regenerate decodes on the hf runtime's KV cache on one device: --runtime hf, no --tp, "
          "one --devices entry");
    }
    return absl::OkStatus();
  }
};

absl::Status RunDumpCommand(const RuntimeFlags& flags, const RegenerateFlags& regenerate,
                            DumpOptions dump) {
  RETURN_IF_ERROR(regenerate.Check(flags));
  ASSIGN_OR_RETURN(auto launched, flags.Launch());
  std::unique_ptr<TargetAnswers> answers;
  if (regenerate.on) {
    auto* hf = dynamic_cast<HfRuntime*>(&launched->runtime());
    if (hf == nullptr) return absl::InternalError("--regenerate: the launched runtime is not hf");
    spec::DecodeOptions options;
    options.max_new_tokens = regenerate.max_new;
    options.temperature = regenerate.temperature;
    options.seed = regenerate.seed;
    // The stop ids `specstream-eval generate` uses: the model's eos ids and
    // its tokenizer's end-of-turn tokens (--tokenizer, else the model's).
    ASSIGN_OR_RETURN(options.stop_ids,
                     AnswerStopIds(hf->config(), flags.model, dump.tokenizer_dir));
    answers = std::make_unique<TargetAnswers>(*hf, std::move(options));
    dump.answers = answers.get();
  }
  absl::StatusOr<DumpSummary> summary = RunDump(launched->runtime(), dump);
  answers.reset();
  absl::Status shutdown = launched->Shutdown();
  RETURN_IF_ERROR(summary.status());
  return shutdown;
}

absl::Status RunForward(const RuntimeFlags& flags, const std::string& ids_text) {
  ASSIGN_OR_RETURN(std::vector<int> ids, ParseIntList("--ids", ids_text));
  ASSIGN_OR_RETURN(auto launched, flags.Launch());
  ForwardRequest request;
  request.sequences = {std::vector<int32_t>(ids.begin(), ids.end())};
  request.want_target_ids = true;
  ASSIGN_OR_RETURN(auto captures, launched->runtime().Forward(request));
  const SequenceCapture& c = captures[0];
  auto print = [](const char* name, const torch::Tensor& t) {
    torch::Tensor f = t.to(torch::kFloat64);
    std::cout << name << " " << c10::toString(t.scalar_type()) << " ["
              << absl::StrJoin(ShapeOf(t), ", ") << "] sum=" << f.sum().item<double>()
              << " abs_sum=" << f.abs().sum().item<double>() << "\n";
  };
  std::cout << "capture_layer_ids ["
            << absl::StrJoin(launched->runtime().Describe().capture_layer_ids, ", ") << "]\n";
  print("aux_hidden", c.aux_hidden);
  print("last_hidden", c.last_hidden);
  print("target_ids", c.target_ids);
  std::cout << "target_ids "
            << absl::StrJoin(
                   std::vector<int32_t>(c.target_ids.data_ptr<int32_t>(),
                                        c.target_ids.data_ptr<int32_t>() + c.target_ids.numel()),
                   ",")
            << "\n";
  return launched->Shutdown();
}

// Everything serve's flags say that can be checked before the model loads
// and away from the machine they are meant for: the runtime's names and
// TP/EP layout (not that the devices exist) and the daemon's
// (CheckTeacherDaemonOptions). RunServe runs it first; `serve
// --check-config` runs only it (the Kubernetes manifest checks run each
// overlay's flags through it). Returns a one-line summary.
absl::StatusOr<std::string> CheckServeConfig(const RuntimeFlags& flags,
                                             const services::TeacherDaemonOptions& serve) {
  ASSIGN_OR_RETURN(const RuntimeSpec spec, flags.Spec(/*check_machine=*/false));
  RETURN_IF_ERROR(services::CheckTeacherDaemonOptions(serve));
  return absl::StrCat("runtime ", spec.runtime, ", ", spec.devices.size(), " TP rank(s) on ",
                      absl::StrJoin(spec.devices, ","), ", EP ", spec.ep_size, ", ", spec.dtype,
                      ", payloads ", serve.payload_dtype, ", port ", serve.port,
                      serve.coordinator.empty() ? "" : ", coordinator " + serve.coordinator);
}

absl::Status RunServe(const RuntimeFlags& flags, services::TeacherDaemonOptions serve) {
  RETURN_IF_ERROR(CheckServeConfig(flags, serve).status());
  // Handlers first, so a signal that arrives while the model loads still
  // ends in an orderly shutdown once it has loaded.
  RETURN_IF_ERROR(InstallShutdownSignals());
  serve.devices = flags.devices;
  serve.model = flags.model;
  serve.on_listening = [](const std::string& address) {
    std::cout << "listening on " << address << std::endl;
  };
  // Who may stream, decided before the model loads (which can take minutes).
  ASSIGN_OR_RETURN(std::unique_ptr<services::TeacherDaemon> daemon,
                   services::TeacherDaemon::Create(serve));
  ASSIGN_OR_RETURN(auto launched, flags.Launch());
  RETURN_IF_ERROR(daemon->Start(launched->runtime()));
  const int signal_number = WaitForShutdownSignal();
  SS_LOG_INFO("serve: {} received; draining streams (deadline {} s)", strsignal(signal_number),
              serve.shutdown_timeout_s);
  daemon->Stop();
  return launched->Shutdown();
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread: may re-execute this binary (common/openmp_wait.h).
  specstream::PreferPassiveOpenMpWait(argv);
  CLI::App app{
      "SpecStream teacher: runs the target model and captures the hidden states drafts train on"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");

  InitRandomOptions init;
  CLI::App* init_cmd = app.add_subcommand("init-random", "Write a random checkpoint in HF layout");
  init_cmd->add_option("--arch", init.arch, "llama | qwen2 | qwen3 | mistral | qwen3_moe | mixtral")
      ->required();
  init_cmd->add_option("--layers", init.layers, "Decoder layers")->required();
  init_cmd->add_option("--hidden", init.hidden, "Hidden size")->required();
  init_cmd->add_option("--heads", init.heads, "Attention heads")->required();
  init_cmd->add_option("--kv-heads", init.kv_heads, "Key/value heads")->required();
  init_cmd->add_option("--intermediate", init.intermediate, "MLP size")->required();
  init_cmd->add_option("--vocab", init.vocab, "Vocabulary size")->required();
  init_cmd->add_option("--shards", init.shards, "Number of safetensors shards");
  init_cmd->add_option("--seed", init.seed, "Random seed");
  init_cmd->add_option("--dtype", init.dtype, "float32 | bfloat16");
  init_cmd->add_flag("--tie-embeddings", init.tie_embeddings, "Share embed_tokens as lm_head");
  init_cmd->add_option("--head-dim", init.head_dim, "Head dim (default hidden/heads)");
  init_cmd->add_option("--max-position", init.max_position, "max_position_embeddings");
  init_cmd->add_option("--rope-theta", init.rope_theta, "RoPE base");
  init_cmd->add_option("--out", init.out, "Output directory")->required();
  init_cmd->add_option("--experts", init.experts, "MoE archs: number of experts");
  init_cmd->add_option("--top-k", init.top_k, "MoE archs: experts per token");
  init_cmd->add_option("--shared-expert-intermediate", init.shared_expert_intermediate,
                       "qwen3_moe: size of a shared expert (default none)");
  init_cmd
      ->add_option("--mlp-only-layers", init.mlp_only_layers,
                   "qwen3_moe: layers with a dense MLP instead of experts, e.g. 0,3")
      ->delimiter(',');

  specstream::teacher::GgufImportOptions import;
  CLI::App* import_cmd = app.add_subcommand(
      "import-gguf", "Convert a GGUF file (Llama) into an HF checkpoint directory");
  import_cmd->add_option("--gguf", import.gguf, "GGUF file")->required();
  import_cmd->add_option("--out", import.out, "Output directory")->required();

  RuntimeFlags forward_flags;
  std::string ids;
  CLI::App* forward_cmd =
      app.add_subcommand("forward", "Print each captured tensor's shape and checksum");
  forward_flags.Add(forward_cmd);
  forward_cmd->add_option("--ids", ids, "Comma-separated token ids")->required();

  RuntimeFlags dump_flags;
  DumpOptions dump;
  std::string store_bytes = "512";
  CLI::App* dump_cmd = app.add_subcommand("dump", "Write the offline store for a dataset");
  dump_flags.Add(dump_cmd);
  dump_cmd->add_option("--data", dump.data, "Conversations or pre-tokenized JSON lines")
      ->required();
  dump_cmd->add_option("--tokenizer", dump.tokenizer_dir, "Tokenizer directory (conversations)");
  dump_cmd->add_option("--template", dump.template_name, "Chat template (conversations)");
  dump_cmd->add_option("--out", dump.out, "Store directory")->required();
  dump_cmd->add_option("--batch-tokens", dump.batch_tokens, "Padded tokens per forward");
  dump_cmd->add_option("--max-length", dump.max_length, "Truncate samples (0: model max)");
  dump_cmd->add_flag("--keep-target-ids", dump.keep_target_ids,
                     "Store the full-vocab argmax per position");
  dump_cmd->add_option("--store-dtype", dump.store_dtype,
                       "bfloat16 | float32 | float16 hidden states");
  dump_cmd->add_option("--shard-mib", dump.store.max_shard_bytes, "Shard size in MiB")
      ->transform([](std::string value) {
        int64_t mib = 0;
        if (!absl::SimpleAtoi(value, &mib) || mib < 1)
          throw CLI::ValidationError("--shard-mib", "must be >= 1");
        return std::to_string(mib << 20);
      });
  dump_cmd->add_option("--shard-samples", dump.store.max_shard_samples,
                       "Samples per shard (0: by size only)");
  RegenerateFlags regenerate;
  dump_cmd->add_flag("--regenerate", regenerate.on,
                     "Records are prompts ({\"prompt\": text} or {\"input_ids\": prompt ids}); "
                     "the target writes the answers it is trained on");
  dump_cmd->add_option("--max-new", regenerate.max_new, "--regenerate: answer tokens at most");
  dump_cmd->add_option("--temperature", regenerate.temperature,
                       "--regenerate: sampling temperature (0: greedy)");
  dump_cmd->add_option("--seed", regenerate.seed,
                       "--regenerate: sampling seed (plus the record's id, else its index)");

  RuntimeFlags serve_flags;
  services::TeacherDaemonOptions serve;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve", "Serve TeacherService (gRPC) until SIGTERM/SIGINT, then drain and exit 0");
  serve_flags.Add(serve_cmd);
  serve_cmd->add_option("--host", serve.host, "Listening address (default 127.0.0.1)");
  serve_cmd->add_option("--port", serve.port, "Listening port; 0 picks a free one")->required();
  serve_cmd->add_option("--port-file", serve.port_file,
                        "Write the port (decimal, one line) here once listening, atomically");
  serve_cmd->add_option("--payload-dtype", serve.payload_dtype,
                        "bfloat16 | float32 | float16 hidden states (as dump --store-dtype)");
  serve_cmd->add_flag("--keep-target-ids", serve.keep_target_ids,
                      "Send the full-vocab argmax per position");
  serve_cmd->add_option("--max-tokens", serve.max_tokens,
                        "Longest sample accepted (0: the model's max positions)");
  serve_cmd->add_option("--batch-tokens", serve.batch_tokens, "Padded tokens per forward");
  serve_cmd->add_option("--answer-batch", serve.answer_batch,
                        "Answers (data.regenerate) decoded together, a token each per forward "
                        "(1: one at a time, bit for bit what specstream-eval generate writes)");
  serve_cmd->add_option("--chunk-kib", serve.chunk_kib, "Payload chunk size in KiB");
  serve_cmd->add_option("--max-queued-mib", serve.max_queued_mib,
                        "MiB that SampleRequests waiting for a credit may hold over all streams "
                        "(default 256); past it a request is refused RESOURCE_EXHAUSTED");
  serve_cmd->add_option("--max-queued-mib-per-stream", serve.max_queued_mib_per_stream,
                        "The same bound for one stream (default 16; --max-queued-mib when less)");
  serve_cmd->add_option("--max-streams", serve.max_streams,
                        "Streams open at once (default 512); one more is refused "
                        "RESOURCE_EXHAUSTED");
  serve_cmd->add_option("--max-streams-per-peer", serve.max_streams_per_peer,
                        "Streams open at once from one address (default 64)");
  serve_cmd->add_option("--nccl-device", serve.nccl_device,
                        "CUDA device of TRANSPORT_NCCL payloads: auto (the leader's GPU when "
                        "serving on CUDA, else device 0 when the build has NCCL and one is "
                        "visible), none, or an index");
  serve_cmd->add_option("--nccl-timeout", serve.nccl_timeout_s,
                        "Seconds an NCCL stream waits for the student to join or receive a "
                        "payload");
  serve_cmd->add_option("--shutdown-timeout", serve.shutdown_timeout_s,
                        "Seconds to finish in-flight samples after SIGTERM/SIGINT");
  serve_cmd->add_option("--coordinator", serve.coordinator,
                        "Register with this coordinator (host:port) and serve only its "
                        "running jobs' tokens");
  serve_cmd->add_option("--name", serve.name, "Daemon name (default: advertised host:port)");
  serve_cmd->add_option("--model-name", serve.model_name,
                        "Short model name jobs may give as model.target");
  serve_cmd->add_option("--advertise", serve.advertise,
                        "Host students dial (default: --host; the hostname for 0.0.0.0)");
  serve_cmd->add_option("--token-file", serve.token_file,
                        "Standalone: the bearer token students must present (else "
                        "$SPECSTREAM_TOKEN). With --coordinator: this daemon's credential there");
  serve_cmd->add_flag("--insecure-no-auth", serve.insecure_no_auth,
                      "Serve without authentication on a non-loopback --host (warns)");
  serve_cmd->add_option("--tls-ca", serve.tls_ca, "PEM CA to verify a TLS coordinator");
  serve_cmd->add_option("--tls-cert", serve.tls.cert, "PEM certificate: TeacherService over TLS");
  serve_cmd->add_option("--tls-key", serve.tls.key, "PEM private key for --tls-cert");
  serve_cmd->add_option("--tls-client-ca", serve.tls.client_ca,
                        "PEM CA bundle: require student certificates signed by it (mTLS)");
  serve_cmd->add_option("--metrics-port", serve.metrics_port,
                        "Prometheus /metrics HTTP port (0: any free one; default off)");
  serve_cmd->add_option("--metrics-port-file", serve.metrics_port_file,
                        "Write the metrics port here");
  bool check_config = false;
  serve_cmd->add_flag("--check-config", check_config,
                      "Check the flags (names, values, device names and TP/EP layout; not the "
                      "model or the devices themselves), print OK and exit");

  WorkerOptions worker;
  std::string worker_capture;
  CLI::App* worker_cmd = app.add_subcommand("tp-worker", "(internal) one tensor-parallel rank");
  worker_cmd->group("");  // hidden from --help
  worker_cmd->add_option("--runtime", worker.runtime);
  worker_cmd->add_option("--model", worker.model_dir)->required();
  worker_cmd->add_option("--dtype", worker.dtype);
  worker_cmd->add_option("--capture-layers", worker_capture);
  worker_cmd->add_option("--rank", worker.rank)->required();
  worker_cmd->add_option("--world-size", worker.world_size)->required();
  worker_cmd->add_option("--ep", worker.ep_size);
  worker_cmd->add_option("--master-addr", worker.master_addr);
  worker_cmd->add_option("--master-port", worker.master_port)->required();
  worker_cmd->add_option("--device", worker.device);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  LoggingOptions logging;
  logging.role = "teacher";
  logging.level = log_level;
  for (RuntimeFlags* flags : {&forward_flags, &dump_flags, &serve_flags}) {
    flags->log_level = log_level;
  }
  if (*worker_cmd) logging.rank = worker.rank;
  if (!InitLogging(logging)) {
    std::cerr << "specstream-teacher: unknown --log-level \"" << log_level << "\"\n";
    return 2;
  }
  SS_LOG_DEBUG("compute threads: {}", ConfigureComputeThreads());

  if (*init_cmd) return ExitCode(WriteRandomCheckpoint(init));
  if (*import_cmd) return ExitCode(specstream::teacher::ImportGguf(import));
  if (*forward_cmd) return ExitCode(RunForward(forward_flags, ids));
  if (*dump_cmd) return ExitCode(RunDumpCommand(dump_flags, regenerate, dump));
  if (*serve_cmd && check_config) {
    absl::StatusOr<std::string> summary = CheckServeConfig(serve_flags, serve);
    if (!summary.ok()) return ExitCode(summary.status());
    std::cout << "specstream-teacher serve: configuration OK: " << *summary << "\n";
    return 0;
  }
  if (*serve_cmd) return ExitCode(RunServe(serve_flags, serve));
  if (*worker_cmd) {
    auto capture = ParseIntList("--capture-layers", worker_capture);
    if (!capture.ok()) return ExitCode(capture.status());
    worker.capture_layer_ids = *capture;
    return ExitCode(RunTpWorker(worker));
  }
  return 2;
}
