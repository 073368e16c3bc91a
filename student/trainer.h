// The draft trainer: one instance per rank (DP ranks in a c10d
// group), deterministic data order, AdamW with warmup + cosine, global-norm
// clipping, bucketed gradient all-reduce, metrics, checkpoints and export.
// The trainer wires the pieces into a step: the samples come from an
// injected SampleSource (data_source.h), their order from epoch_plan.h, the
// DDP gradient sum from grad_reducer.h, checkpoints and exact resume from
// train_state.h, and the reports go to metrics_sink.h. The draft itself is
// a TrainableDraft of the job's model.draft.type (student/draft.h): the
// trainer never looks at which.
//
// Exactness contract: the loss at step k is normalised by the number of valid
// positions over all ranks, and gradients are summed across ranks, so N ranks
// with batch b train exactly like 1 rank with batch N·b (up to float
// summation order). Under context parallelism (world = DP × CP) the CP ranks
// of a DP group share one batch, each loading and computing only its shard
// of the sequence; the same normalisation and sum make CP = c train exactly
// like CP = 1 (the sum over CP is the gradient of the whole sequence; the
// sum over DP of globally normalised losses is the token-weighted DP mean).
//
// Devices: a rank trains on one device (TrainerConfig::device). A step
// queues its work there and reads back one flag, whether the gradient norm
// is finite, before the optimizer step; metrics are read back only on the
// steps that record them (log_every).
//
// Non-finite steps: a NaN or inf gradient norm (global: the same on every
// rank after the all-reduce) skips the update on every rank; after
// max_bad_steps such steps the run fails, naming the step.
#ifndef SPECSTREAM_STUDENT_TRAINER_H_
#define SPECSTREAM_STUDENT_TRAINER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"
#include "common/jobspec/job_spec.h"
#include "common/torch/compat.h"
#include "common/transport/payload_channel.h"
#include "specstream/v1/job.pb.h"
#include "student/block_draft.h"
#include "student/context_parallel.h"
#include "student/data_source.h"
#include "student/draft.h"
#include "student/draft_model.h"
#include "student/epoch_plan.h"
#include "student/grad_reducer.h"
#include "student/metrics_sink.h"
#include "student/online_source.h"
#include "student/optimizer.h"
#include "student/teacher_connection.h"
#include "student/train_state.h"

namespace specstream::student {

struct TrainerConfig {
  std::string store;  // offline store directory (or teachers below)
  // Online training (student/online_source.h): pre-tokenized samples and
  // the teacher daemons computing their hidden states.
  std::string tokenized;
  std::vector<std::string> teachers;
  int64_t in_flight = jobspec::kDefaultInFlight;  // samples outstanding per teacher stream
  // data.teacher_grace_s: how long lost teachers are reconnected to
  // (OnlineSourceOptions::teacher_grace).
  absl::Duration teacher_grace = absl::Seconds(60);
  std::string transport = "auto";  // auto | inline | shm | nccl (TeacherStreamOptions)
  std::string ledger_dir;          // ledger-rank<r>.jsonl of trained samples; empty: none
  RegenerateOptions regenerate;    // data.regenerate: the teachers write the answers
  std::string job_token;           // bearer token for teacher streams (coordinator jobs)
  // How the rank reaches the teachers (student/teacher_connection.h):
  // required for online training; specstream-student passes the gRPC one
  // (services/student/grpc_teacher_connection.h).
  std::shared_ptr<TeacherConnector> teacher_connector;
  // Tests only: TeacherStreamOptions::nccl_channel_for_testing.
  PayloadChannelFactory nccl_channel_for_testing;
  std::string target_dir;  // target checkpoint (embeddings, lm_head, config)
  std::string vocab_map;   // map file, or empty to build one of draft_vocab_size
  int64_t draft_vocab_size = 0;
  // model.draft.type, a name in DraftTypes() (student/draft.h): "eagle3"
  // (student/draft_model.h: the fields above, `eagle3` and ttt_steps) or
  // "dflash" / "dspark" (student/block_draft.h: `block`, whose kind the
  // type sets; no vocab map).
  std::string draft_type = "eagle3";
  Eagle3Options eagle3;
  // "peagle" (eagle3 with eagle3.parallel_drafting): COD sampling's shares
  // (student/cod_sampling.h); the mask token is mask_token_id's below.
  double down_sample_ratio = 0.7;
  double down_sample_ratio_min = 0.2;
  BlockDraftOptions block;
  // Resolved at Init when unset (common/block_draft.h): block.target_layer_ids
  // when empty, and the mask token from model.draft.mask_token_id.
  std::optional<int64_t> mask_token_id;
  // Draft shape overrides; 0 takes the target's.
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_length = 0;

  double lr = 1e-4;
  AdamWOptions adamw;
  double grad_clip = 0.5;
  int64_t warmup_steps = 0;
  double warmup_ratio = 0.0;
  bool cosine = true;
  double min_lr_ratio = 0.0;

  int64_t epochs = 0;  // one of epochs / max_steps
  int64_t max_steps = 0;
  int64_t batch_size = 1;  // samples per rank per step (or batch_tokens)
  int64_t batch_tokens = 0;
  int ttt_steps = 7;
  uint64_t seed = 0;
  torch::Dtype dtype = torch::kBFloat16;
  // Where this rank trains (ResolveTrainingDevice): the draft, its optimizer
  // state, the batches and the gradient buckets live there, and the
  // collectives on them run over NCCL when it is a CUDA device.
  torch::Device device = torch::kCPU;
  // Steps between metric records (history, metrics.jsonl, TensorBoard, log
  // lines); the last step always records. Only these steps read metrics back
  // from the device (one all-reduce, one copy). 0: every step, without log
  // lines (tests and benchmarks).
  int64_t log_every = 1;
  // training.max_bad_steps: non-finite steps skipped before the run fails.
  int64_t max_bad_steps = 0;

  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int64_t keep_last = 0;
  std::string export_dir;
  std::string metrics_jsonl;
  std::string tensorboard_dir;  // event files when set (rank 0)
  bool resume = false;
  int progress_terminal = -1;
  // DDP gradient bucket size in fp32 elements (16 MiB by default).
  int64_t ddp_bucket_elements = int64_t{4} << 20;
  // Context parallelism (DESIGN.md §6, student/context_parallel.h): world =
  // DP × cp_size; ulysses_degree divides cp_size (1: ring only; cp_size:
  // Ulysses only; in between: USP).
  int64_t cp_size = 1;
  int64_t ulysses_degree = 1;
  // This rank's own address, which the device and CP groups bind (the one
  // the world group bound: ResolveLocalAddress).
  std::string local_address = "127.0.0.1";
  // parallel.rendezvous_timeout_s: the deadline for every rank to join.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(120)};
};

class Trainer final {
 public:
  // `group` is the world's Gloo group (null when world_size is 1): control
  // messages (checkpoint RNG, barriers) and, on CPU, every collective.
  // `store` is the world's rendezvous store, needed for the CP groups when
  // cp_size > 1 and for the NCCL world group when config.device is CUDA.
  // `source` feeds the samples; must describe the target at
  // config.target_dir (its model contract is checked).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      TrainerConfig config, std::unique_ptr<SampleSource> source, int rank, int world_size,
      c10::intrusive_ptr<CommGroup> group, c10::intrusive_ptr<c10d::Store> store = {});
  // The same over OpenSampleSource(config, rank).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      TrainerConfig config, int rank, int world_size, c10::intrusive_ptr<CommGroup> group,
      c10::intrusive_ptr<c10d::Store> store = {});
  ~Trainer();

  // Trains until max_steps / epochs are done (resuming first when asked).
  absl::Status Run();
  // Runs `n` more steps (tests); stops early at the end of training.
  absl::Status RunSteps(int64_t n);

  int64_t step() const { return step_; }
  int64_t total_steps() const { return total_steps_; }
  // The metric records so far (one per log_every steps and the last).
  const std::vector<StepMetrics>& history() const { return history_; }
  // The draft being trained, and its trainable tensors.
  TrainableDraft& draft() { return *draft_; }
  const NamedTensors& parameters() const { return draft_->parameters(); }
  SampleSource& source() { return *source_; }

 private:
  Trainer() = default;
  absl::Status Init();
  // The optimizer, DDP reducer, data plan, checkpoint state and metrics of
  // the draft Init made.
  absl::Status InitTraining();
  // device_group_: group_ on CPU, an NCCL world group on a CUDA device.
  absl::Status ConnectDeviceGroup();
  // One step behind one Status: a LibTorch error anywhere in it (an
  // out-of-memory, a shape bug) ends the step with Internal (InvalidArgument
  // for a value or index error) naming the step, instead of aborting.
  absl::Status TrainStep();
  absl::Status TrainStepUnchecked();
  // Asks the source for this step's batch and the ones after it.
  void PrefetchFrom(const std::vector<int64_t>& indices);
  // The rows of each sample of a batch this rank reads: all of them, or
  // its CP shard plus the TTT halo.
  RowRange BatchRows(const std::vector<int64_t>& indices) const;
  // This rank's batch (its CP shard of it under context parallelism).
  absl::StatusOr<DraftBatch> LoadBatch(const std::vector<int64_t>& indices);
  // SUM over the world of a tensor on the device (the device group).
  absl::Status AllReduce(torch::Tensor& t);
  // Whether step `step` (1-based) records metrics (log_every).
  bool RecordsMetrics(int64_t step) const;
  // The metrics of the step just taken: its sums added over the world and
  // read back from the device (one collective, one copy).
  absl::StatusOr<StepMetrics> ReadMetrics(MetricSums sums, const torch::Tensor& grad_norm,
                                          double lr);
  // Closes the metrics record: the seconds since it opened.
  double CloseRecord();

  TrainerConfig config_;
  int rank_ = 0;
  int world_size_ = 1;
  torch::Device device_ = torch::kCPU;
  c10::intrusive_ptr<CommGroup> group_;         // Gloo: control messages
  c10::intrusive_ptr<CommGroup> device_group_;  // tensors on device_ (group_ on CPU)
  c10::intrusive_ptr<c10d::Store> store_;
  CpLayout layout_;
  CpGroups cp_groups_;
  std::unique_ptr<SampleSource> source_;
  std::string source_name_;  // for errors: where the samples come from
  std::unique_ptr<TrainableDraft> draft_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<TrainState> state_;
  std::unique_ptr<MetricsSink> metrics_;  // rank 0
  std::optional<EpochPlan> plan_;
  LrSchedule schedule_;
  int64_t steps_per_epoch_ = 0;
  int64_t total_steps_ = 0;
  int64_t step_ = 0;       // completed optimizer steps
  int64_t bad_steps_ = 0;  // steps skipped for a non-finite gradient norm
  std::vector<StepMetrics> history_;
  // Since the last metric record: this rank's tokens and when the first
  // step after it began.
  int64_t tokens_since_record_ = 0;
  bool record_open_ = false;
  std::chrono::steady_clock::time_point record_start_;
  CaptureLayerIds capture_;
};

// The samples a config names: the teachers' streams (online: needs
// config.teacher_connector) or the offline store.
absl::StatusOr<std::unique_ptr<SampleSource>> OpenSampleSource(const TrainerConfig& config,
                                                               int rank);

// A rank's device from a training.device setting (job_config.h) and its
// LOCAL_RANK: "auto" is cuda:LOCAL_RANK when this LibTorch sees CUDA, else
// cpu; "cuda" is cuda:LOCAL_RANK; "cpu" and "cuda:N" as written.
// FailedPrecondition for a CUDA device this build or machine lacks.
absl::StatusOr<torch::Device> ResolveTrainingDevice(const std::string& setting, int local_rank);

// The trainer settings of a validated job spec (ValidateJobSpec first);
// `device_override` (train --device) replaces training.device when set.
absl::StatusOr<TrainerConfig> TrainerConfigFromJobSpec(const specstream::v1::JobSpec& spec,
                                                       const std::string& device_override = "",
                                                       int local_rank = 0);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_TRAINER_H_
