#include "student/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hf_config.h"
#include "common/jobspec/job_spec.h"
#include "common/logging.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"
#include "student/ledger.h"
#include "student/online_source.h"

namespace specstream::student {
absl::StatusOr<torch::Device> ResolveTrainingDevice(const std::string& setting, int local_rank) {
  const std::string where = setting.empty() ? "auto" : setting;
  if (where == "auto") {
    if (!torch::cuda::is_available()) return torch::Device(torch::kCPU);
    return ParseDevice(absl::StrCat("cuda:", local_rank), "training.device auto (LOCAL_RANK)");
  }
  if (where == "cuda")
    return ParseDevice(absl::StrCat("cuda:", local_rank), "training.device cuda");
  if (where == "meta") {
    return absl::InvalidArgumentError(
        "training.device: \"meta\" is a test device, not one to train on");
  }
  return ParseDevice(where, "training.device");
}

absl::StatusOr<TrainerConfig> TrainerConfigFromJobSpec(const specstream::v1::JobSpec& spec,
                                                       const std::string& device_override,
                                                       int local_rank) {
  TrainerConfig c;
  ASSIGN_OR_RETURN(
      c.device,
      ResolveTrainingDevice(device_override.empty() ? spec.training().device() : device_override,
                            local_rank));
  c.store = spec.data().store();
  c.max_length = spec.data().max_length();
  c.tokenized = spec.data().tokenized();
  c.teachers.assign(spec.data().teachers().begin(), spec.data().teachers().end());
  c.in_flight = spec.data().in_flight() > 0 ? spec.data().in_flight() : jobspec::kDefaultInFlight;
  if (spec.data().has_teacher_grace_s()) {
    c.teacher_grace = absl::Seconds(spec.data().teacher_grace_s());
  }
  c.ledger_dir = spec.data().ledger_dir();
  if (spec.data().has_regenerate()) {
    const v1::RegenerateSpec& regenerate = spec.data().regenerate();
    c.regenerate.on = true;
    if (regenerate.max_new_tokens() > 0) c.regenerate.max_new_tokens = regenerate.max_new_tokens();
    c.regenerate.temperature = regenerate.temperature();
    c.regenerate.seed = regenerate.seed();
  }
  if (!spec.data().transport().empty()) c.transport = spec.data().transport();
  c.target_dir = spec.model().target();
  const auto& draft = spec.model().draft();
  c.vocab_map = draft.vocab_map();
  c.draft_vocab_size = draft.draft_vocab_size();
  c.intermediate_size = draft.intermediate_size();
  c.num_attention_heads = draft.num_attention_heads();
  c.num_key_value_heads = draft.num_key_value_heads();
  c.head_dim = draft.head_dim();
  c.draft_type = draft.type().empty() ? jobspec::kDraftTypeEagle3 : draft.type();
  ASSIGN_OR_RETURN(const DraftType* type, FindDraftType(c.draft_type));
  RETURN_IF_ERROR(type->configure(draft, &c));
  if (draft.hidden_size() != 0) {
    ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(c.target_dir));
    if (draft.hidden_size() != target.hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.draft.hidden_size: ", draft.hidden_size(), " must equal the target's hidden size ",
          target.hidden_size, " (the draft reuses the target's embeddings)"));
    }
  }
  const auto& opt = spec.optimizer();
  c.lr = opt.lr();
  if (opt.betas_size() == 2) {
    c.adamw.beta1 = opt.betas(0);
    c.adamw.beta2 = opt.betas(1);
  }
  c.adamw.eps = opt.eps();
  c.adamw.weight_decay = opt.weight_decay();
  c.grad_clip = opt.grad_clip();
  c.warmup_steps = opt.warmup_steps();
  c.warmup_ratio = opt.warmup_ratio();
  c.cosine = opt.schedule() != "constant";
  c.min_lr_ratio = opt.min_lr_ratio();
  const auto& training = spec.training();
  c.epochs = training.epochs();
  c.max_steps = training.max_steps();
  c.batch_size = training.batch_size();
  c.batch_tokens = training.batch_tokens();
  c.ttt_steps = static_cast<int>(training.ttt_steps());
  c.seed = training.seed();
  c.dtype = training.dtype() == "float32" ? torch::kFloat32 : torch::kBFloat16;
  c.log_every = training.log_every();
  c.max_bad_steps = training.max_bad_steps();
  c.checkpoint_dir = spec.checkpoint().dir();
  c.checkpoint_every = spec.checkpoint().every_steps();
  c.keep_last = spec.checkpoint().keep_last();
  c.export_dir = spec.export_().dir();
  c.metrics_jsonl = spec.metrics().jsonl();
  c.tensorboard_dir = spec.metrics().tensorboard_dir();
  const auto& parallel = spec.parallel();
  c.cp_size = std::max<int64_t>(1, parallel.cp_size());
  if (parallel.rendezvous_timeout_s() > 0) {
    c.rendezvous_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::llround(parallel.rendezvous_timeout_s() * 1000)));
  }
  if (parallel.cp_mode() == "ulysses") {
    c.ulysses_degree = c.cp_size;
  } else if (parallel.cp_mode() == "usp") {
    c.ulysses_degree = parallel.ulysses_degree();
  } else {
    c.ulysses_degree = 1;  // ring
  }
  return c;
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenSampleSource(const TrainerConfig& c, int rank) {
  if (c.teachers.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<StoreSource> store, StoreSource::Open(c.store));
    return std::unique_ptr<SampleSource>(std::move(store));
  }
  OnlineSourceOptions online;
  online.data = c.tokenized;
  online.max_length = c.max_length;
  online.regenerate = c.regenerate;
  online.teachers = c.teachers;
  online.connector = c.teacher_connector;
  online.rank = rank;
  online.in_flight = c.in_flight;
  online.teacher_grace = c.teacher_grace;
  online.stream.transport = c.transport;
  online.stream.device = c.device;
  online.stream.token = c.job_token;
  online.stream.nccl_channel_for_testing = c.nccl_channel_for_testing;
  {
    // The layers this draft type reads, when they are not the teachers'
    // default.
    ASSIGN_OR_RETURN(const DraftType* type, FindDraftType(c.draft_type));
    ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(c.target_dir));
    ASSIGN_OR_RETURN(online.capture_layer_ids, type->capture_layers(c, target));
  }
  if (!c.ledger_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(c.ledger_dir, error);
    online.ledger = LedgerPath(c.ledger_dir, rank);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<OnlineSource> source, OnlineSource::Open(online));
  return std::unique_ptr<SampleSource>(std::move(source));
}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerConfig config, int rank,
                                                         int world_size,
                                                         c10::intrusive_ptr<CommGroup> group,
                                                         c10::intrusive_ptr<c10d::Store> store) {
  ASSIGN_OR_RETURN(std::unique_ptr<SampleSource> source, OpenSampleSource(config, rank));
  return Create(std::move(config), std::move(source), rank, world_size, std::move(group),
                std::move(store));
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerConfig config,
                                                         std::unique_ptr<SampleSource> source,
                                                         int rank, int world_size,
                                                         c10::intrusive_ptr<CommGroup> group,
                                                         c10::intrusive_ptr<c10d::Store> store) {
  if (!source) return absl::InvalidArgumentError("the trainer needs a sample source");
  if (world_size > 1 && !group) {
    return absl::InvalidArgumentError("a world of several ranks needs a process group");
  }
  CpLayout layout{world_size, static_cast<int>(config.cp_size),
                  static_cast<int>(config.ulysses_degree), rank};
  // Heads are checked once the draft's shape is known (Init).
  RETURN_IF_ERROR(ValidateCpLayout(layout, 0, 0));
  if (layout.cp_size > 1 && !store) {
    return absl::InvalidArgumentError("context parallelism needs the world's rendezvous store");
  }
  TuneAllocatorForTensors();
  std::unique_ptr<Trainer> trainer(new Trainer());
  trainer->source_name_ =
      !config.teachers.empty()
          ? absl::StrCat("the teachers at ", absl::StrJoin(config.teachers, ", "))
          : absl::StrCat("store ", config.store);
  trainer->config_ = std::move(config);
  trainer->source_ = std::move(source);
  trainer->rank_ = rank;
  trainer->world_size_ = world_size;
  trainer->device_ = trainer->config_.device;
  trainer->group_ = std::move(group);
  trainer->store_ = std::move(store);
  trainer->layout_ = layout;
  RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

absl::Status Trainer::Init() {
  const TrainerConfig& c = config_;
  if ((c.epochs > 0) == (c.max_steps > 0)) {
    return absl::InvalidArgumentError("set exactly one of training.epochs and training.max_steps");
  }
  if ((c.batch_size > 0) == (c.batch_tokens > 0)) {
    return absl::InvalidArgumentError(
        "set exactly one of training.batch_size and training.batch_tokens");
  }
  ASSIGN_OR_RETURN(const DraftType* type, FindDraftType(c.draft_type));
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(c.target_dir));
  // The data must come from this target: same family, sizes and vocab.
  const ModelContract& model = source_->model();
  auto mismatch = [&](const char* field, const nlohmann::json& stored, const nlohmann::json& mine) {
    return absl::FailedPreconditionError(
        absl::StrCat(source_name_, " served a different target: contract.model.", field, " is ",
                     stored.dump(), " but ", c.target_dir, " has ", mine.dump()));
  };
  if (model.model_type != target.model_type) {
    return mismatch("model_type", model.model_type, target.model_type);
  }
  if (model.hidden_size != target.hidden_size) {
    return mismatch("hidden_size", model.hidden_size, target.hidden_size);
  }
  if (model.vocab_size != target.vocab_size) {
    return mismatch("vocab_size", model.vocab_size, target.vocab_size);
  }
  if (model.num_layers != target.num_hidden_layers) {
    return mismatch("num_layers", model.num_layers, target.num_hidden_layers);
  }
  capture_ = model.capture_layer_ids;
  const DraftContext context{c, target, *source_, source_name_, layout_, device_};
  ASSIGN_OR_RETURN(draft_, type->create(context));
  RETURN_IF_ERROR(ConnectDeviceGroup());
  // EAGLE-3's attention crosses shards (ring, Ulysses); a block draft's CP
  // group only gathers its context.
  ASSIGN_OR_RETURN(cp_groups_,
                   CreateCpGroups(layout_, store_, c.local_address, c.rendezvous_timeout, device_));
  SS_LOG_INFO("trainer: {}", draft_->Describe());
  return InitTraining();
}

absl::Status Trainer::InitTraining() {
  const TrainerConfig& c = config_;
  reducer_ = std::make_unique<GradReducer>(
      parameters(), world_size_ > 1 ? device_group_ : c10::intrusive_ptr<CommGroup>(),
      c.ddp_bucket_elements, device_);
  RETURN_IF_ERROR(reducer_->BroadcastParameters());
  optimizer_ = std::make_unique<AdamW>(parameters(), c.adamw);
  // Gradients exist from the start (zeros), so a parameter without gradient
  // in some step is treated the same in a continuous and a resumed run.
  for (const auto& [name, p] : parameters()) {
    torch::Tensor param = p;
    param.mutable_grad() = torch::zeros_like(param);
  }

  // The CP ranks of a DP group share its batches.
  EpochPlanOptions plan;
  plan.seed = c.seed;
  plan.dp_rank = layout_.dp_rank();
  plan.dp_size = layout_.dp_size();
  plan.batch_size = c.batch_size;
  plan.batch_tokens = c.batch_tokens;
  plan.max_length = c.max_length;
  std::vector<int64_t> lengths(source_->size());
  for (int64_t i = 0; i < source_->size(); ++i) lengths[i] = source_->Length(i);
  ASSIGN_OR_RETURN(plan_, EpochPlan::Create(plan, lengths));
  steps_per_epoch_ = plan_->steps_per_epoch();
  // A step holds its batch and the next one's (prefetched).
  source_->ReserveOutstanding(2 * plan_->largest_batch());
  total_steps_ = c.max_steps > 0 ? c.max_steps : c.epochs * steps_per_epoch_;
  schedule_.peak_lr = c.lr;
  schedule_.total_steps = total_steps_;
  schedule_.warmup_steps = c.warmup_steps > 0
                               ? c.warmup_steps
                               : static_cast<int64_t>(std::llround(c.warmup_ratio * total_steps_));
  schedule_.cosine = c.cosine;
  schedule_.min_lr_ratio = c.min_lr_ratio;
  SS_LOG_INFO(
      "trainer: rank {}/{} (dp {}/{}, cp {}/{}, ulysses {}) on {}, {} samples, {} steps/epoch, {} "
      "steps",
      rank_, world_size_, layout_.dp_rank(), layout_.dp_size(), layout_.cp_rank(), layout_.cp_size,
      layout_.ulysses, device_.str(), source_->size(), steps_per_epoch_, total_steps_);

  TrainRun run;
  run.checkpoint_dir = c.checkpoint_dir;
  run.keep_last = c.keep_last;
  run.rank = rank_;
  run.world_size = world_size_;
  run.cp_size = layout_.cp_size;
  run.ulysses_degree = layout_.ulysses;
  run.seed = c.seed;
  run.ttt_steps = c.ttt_steps;
  run.target_dir = c.target_dir;
  run.store = c.store;
  run.capture_layer_ids = capture_;
  run.steps_per_epoch = steps_per_epoch_;
  run.total_steps = total_steps_;
  run.schedule = schedule_;
  state_ = std::make_unique<TrainState>(std::move(run), parameters(), draft_->Record(), *optimizer_,
                                        group_);
  if (c.resume) {
    ASSIGN_OR_RETURN(step_, state_->Resume());
  }
  if (rank_ == 0) {
    MetricsSinkOptions sink;
    sink.total_steps = total_steps_;
    sink.log_lines = c.log_every > 0;
    sink.jsonl = c.metrics_jsonl;
    sink.tensorboard_dir = c.tensorboard_dir;
    ASSIGN_OR_RETURN(metrics_, MetricsSink::Create(sink));
  }
  return absl::OkStatus();
}

absl::Status Trainer::ConnectDeviceGroup() {
  device_group_ = group_;
  if (world_size_ == 1 || !device_.is_cuda()) return absl::OkStatus();
  if (!store_) {
    return absl::InvalidArgumentError(
        "training on a CUDA device with several ranks needs the world's rendezvous store");
  }
  RendezvousOptions options;
  options.rank = rank_;
  options.world_size = world_size_;
  options.local_addr = config_.local_address;
  options.join_timeout = config_.rendezvous_timeout;
  ASSIGN_OR_RETURN(
      device_group_,
      CreateNcclGroup(options, c10::make_intrusive<c10d::PrefixStore>("device/world", store_),
                      device_));
  return absl::OkStatus();
}

absl::Status Trainer::AllReduce(torch::Tensor& t) {
  if (world_size_ == 1) return absl::OkStatus();
  return AllReduceSum(*device_group_, t);
}

RowRange Trainer::BatchRows(const std::vector<int64_t>& indices) const {
  constexpr int64_t kAll = std::numeric_limits<int64_t>::max();
  if (layout_.cp_size == 1) return RowRange{0, kAll, kAll};
  // Every CP rank of the DP group sees the same indices, so they agree on
  // the padded length without communicating; each reads only its shard and
  // the TTT halo (the next ttt_steps rows).
  int64_t longest = 0;
  for (int64_t index : indices) {
    const int64_t len = source_->Length(index);
    longest = std::max(longest, config_.max_length > 0 ? std::min(len, config_.max_length) : len);
  }
  const CpShard shard = ShardRange(longest, layout_.cp_size, layout_.cp_rank());
  const int64_t halo = draft_->halo_rows();
  return RowRange{shard.begin, shard.begin + shard.padded_length,
                  shard.begin + shard.padded_length + halo};
}

absl::StatusOr<DraftBatch> Trainer::LoadBatch(const std::vector<int64_t>& indices) {
  std::vector<TrainingSample> samples;
  if (layout_.cp_size == 1) {
    for (int64_t index : indices) {
      ASSIGN_OR_RETURN(TrainingSample s, source_->Get(index));
      samples.push_back(std::move(s));
    }
    return Collate(samples, config_.max_length);
  }
  const RowRange rows = BatchRows(indices);
  for (int64_t index : indices) {
    ASSIGN_OR_RETURN(TrainingSample s, source_->GetRows(index, rows));
    samples.push_back(std::move(s));
  }
  DraftBatch batch = CollateShard(samples, config_.max_length, rows.begin, rows.end - rows.begin,
                                  rows.halo_end - rows.end);
  const bool whole_ids = draft_->reads_whole_token_ids();
  if (whole_ids || draft_->plans_on_whole_loss_mask()) {
    // The whole token ids and loss mask of each sample (cheap: no hidden
    // states), padded to the CP group's cp·Tpad positions: in place of the
    // shard's for a draft that reads them, else beside them for its plan.
    const int64_t total = layout_.cp_size * (rows.end - rows.begin);
    torch::Tensor whole_input_ids =
        torch::zeros({static_cast<int64_t>(indices.size()), total}, torch::kInt64);
    torch::Tensor whole_loss_mask =
        torch::zeros({static_cast<int64_t>(indices.size()), total}, torch::kUInt8);
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    for (size_t row = 0; row < indices.size(); ++row) {
      RETURN_IF_ERROR(source_->TokenIds(indices[row], &ids, &mask));
      const int64_t len = std::min<int64_t>(batch.host_lengths[row], total);
      if (static_cast<int64_t>(ids.size()) < len || static_cast<int64_t>(mask.size()) < len) {
        return absl::DataLossError(absl::StrCat(source_name_, ": sample ", indices[row], " has ",
                                                ids.size(), " token ids for length ", len));
      }
      auto id_row = whole_input_ids.accessor<int64_t, 2>()[row];
      auto mask_row = whole_loss_mask.accessor<uint8_t, 2>()[row];
      for (int64_t t = 0; t < len; ++t) {
        id_row[t] = ids[t];
        mask_row[t] = mask[t];
      }
    }
    if (whole_ids) {
      batch.input_ids = whole_input_ids;
      batch.loss_mask = whole_loss_mask;
    } else {
      batch.whole_loss_mask = whole_loss_mask;
    }
  }
  return batch;
}

absl::Status Trainer::TrainStep() {
  absl::Status status;
  RETURN_IF_ERROR(CatchTorch(absl::StrCat("training step ", step_ + 1),
                             [&] { status = TrainStepUnchecked(); }));
  return status;
}

void Trainer::PrefetchFrom(const std::vector<int64_t>& indices) {
  // Online sources compute this batch (if not yet asked) and the batches
  // after it while this step trains: at least the next one, and as many
  // more as data.in_flight samples reach, so that a teacher far away (a
  // round trip of tens of ms, slow start after each idle gap) streams
  // several steps ahead instead of one.
  source_->Prefetch(indices, BatchRows(indices));
  // The loop also stops after in_flight steps, so empty batches (which use
  // no budget) cannot make it walk the rest of training.
  int64_t budget = config_.in_flight - static_cast<int64_t>(indices.size());
  for (int64_t ahead = step_ + 1; ahead < total_steps_ && ahead <= step_ + config_.in_flight;
       ++ahead) {
    const std::vector<int64_t> next = plan_->Batch(ahead);
    if (ahead > step_ + 1 && static_cast<int64_t>(next.size()) > budget) break;
    source_->Prefetch(next, BatchRows(next));
    budget -= static_cast<int64_t>(next.size());
  }
}

absl::Status Trainer::TrainStepUnchecked() {
  if (!record_open_) {
    record_start_ = std::chrono::steady_clock::now();
    record_open_ = true;
  }
  const std::vector<int64_t> indices = plan_->Batch(step_);
  PrefetchFrom(indices);
  ASSIGN_OR_RETURN(DraftBatch batch, LoadBatch(indices));
  // Tokens of this rank's own rows (a CP shard counts only its part), from
  // the host's copy of the lengths.
  const int64_t own_rows = batch.aux_hidden.size(1);
  for (int64_t length : batch.host_lengths) {
    tokens_since_record_ += std::clamp<int64_t>(length - batch.offset, 0, own_rows);
  }
  // What the draft decides on the host (a block draft's anchors, keyed by
  // the samples' indices and the step: the same on any rank, and after a
  // resume).
  ASSIGN_OR_RETURN(std::unique_ptr<StepPlan> plan,
                   draft_->Plan(batch, indices, config_.seed, step_, layout_));
  batch = ToDevice(std::move(batch), device_);

  // From here to the metrics, work is only queued on the device, except
  // what Empty reads back (a block draft's global weight: a batch with no
  // anchor on any rank is skipped on every rank).
  ASSIGN_OR_RETURN(torch::Tensor global_norm, draft_->LossNormaliser(batch, *plan));
  RETURN_IF_ERROR(AllReduce(global_norm));
  ASSIGN_OR_RETURN(const bool empty, draft_->Empty(global_norm));

  for (const auto& [name, p] : parameters()) {
    torch::Tensor param = p;
    if (param.grad().defined()) param.mutable_grad().zero_();
  }
  reducer_->Prepare();
  ASSIGN_OR_RETURN(DraftStep forward,
                   draft_->Forward(batch, *plan, global_norm, config_.dtype, cp_groups_));
  RETURN_IF_ERROR(CatchTorch("backward", [&] { forward.loss.backward(); }));
  RETURN_IF_ERROR(reducer_->Finish());
  torch::Tensor grad_norm;
  RETURN_IF_ERROR(CatchTorch("gradient clipping",
                             [&] { grad_norm = ClipGradNorm(parameters(), config_.grad_clip); }));
  const double lr = schedule_.At(step_);
  // The norm is global, so every rank takes the same branch.
  bool finite = true;
  RETURN_IF_ERROR(
      CatchTorch("finite check", [&] { finite = torch::isfinite(grad_norm).item<bool>(); }));
  if (empty) {
    SS_LOG_INFO("training step {}: no anchor in the batch on any rank; update skipped", step_ + 1);
  } else if (finite) {
    RETURN_IF_ERROR(CatchTorch("optimizer step", [&] { optimizer_->Step(lr); }));
  } else {
    ++bad_steps_;
    const std::string what =
        absl::StrCat("training step ", step_ + 1, ": the gradient norm is ",
                     grad_norm.item<double>(), " (a loss or gradient that is not finite)");
    if (bad_steps_ > config_.max_bad_steps) {
      return absl::InternalError(absl::StrCat(what, "; ", bad_steps_,
                                              " such step(s), training.max_bad_steps is ",
                                              config_.max_bad_steps));
    }
    SS_LOG_WARN("{}; update skipped ({} of training.max_bad_steps {})", what, bad_steps_,
                config_.max_bad_steps);
  }
  ++step_;
  RETURN_IF_ERROR(source_->Commit(step_, indices));

  if (RecordsMetrics(step_)) {
    ASSIGN_OR_RETURN(StepMetrics m, ReadMetrics(std::move(forward.sums), grad_norm, lr));
    history_.push_back(m);
    if (metrics_) RETURN_IF_ERROR(metrics_->Write(m));
  }
  if (!config_.checkpoint_dir.empty() && config_.checkpoint_every > 0 &&
      step_ % config_.checkpoint_every == 0 && step_ < total_steps_) {
    RETURN_IF_ERROR(state_->Save(step_));
  }
  return absl::OkStatus();
}

bool Trainer::RecordsMetrics(int64_t step) const {
  return config_.log_every <= 0 || step % config_.log_every == 0 || step == total_steps_;
}

absl::StatusOr<StepMetrics> Trainer::ReadMetrics(MetricSums sums, const torch::Tensor& grad_norm,
                                                 double lr) {
  // This record's tokens (all ranks) ride along in the one all-reduce.
  constexpr char kTokens[] = "trainer.tokens";
  RETURN_IF_ERROR(CatchTorch("metrics", [&] {
    sums[kTokens] = torch::full({1}, static_cast<double>(tokens_since_record_),
                                grad_norm.options().dtype(torch::kFloat64));
  }));
  ASSIGN_OR_RETURN(MetricSums host,
                   ReduceToHost(sums, world_size_ > 1 ? device_group_.get() : nullptr));
  StepMetrics m;
  RETURN_IF_ERROR(CatchTorch("metrics", [&] {
    m.tokens = static_cast<int64_t>(host.at(kTokens).item<double>());
    host.erase(kTokens);
    // The same on every rank (the norm of the all-reduced gradients).
    m.grad_norm = grad_norm.item<double>();
  }));
  const DraftMetrics d = draft_->Metrics(host);
  m.step = step_;
  m.lr = lr;
  m.loss = d.loss;
  m.loss_k = d.loss_k;
  m.acc_k = d.acc_k;
  m.sim_accept_len = d.sim_accept_len;
  m.positions = d.positions;
  m.tau = d.tau;
  m.calibration_error = d.calibration_error;
  m.tokens_per_second = static_cast<double>(m.tokens) / std::max(CloseRecord(), 1e-9);
  return m;
}

double Trainer::CloseRecord() {
  const auto now = std::chrono::steady_clock::now();
  record_open_ = false;
  tokens_since_record_ = 0;
  return std::chrono::duration<double>(now - record_start_).count();
}

absl::Status Trainer::RunSteps(int64_t n) {
  for (int64_t i = 0; i < n && step_ < total_steps_; ++i) RETURN_IF_ERROR(TrainStep());
  return absl::OkStatus();
}

absl::Status Trainer::Run() {
  ProgressOptions progress_options;
  progress_options.label = "train";
  progress_options.total = total_steps_;
  progress_options.unit = "steps";
  progress_options.terminal = rank_ == 0 ? config_.progress_terminal : 0;
  progress_options.log_every_seconds = 1e9;  // the step log lines already report progress
  ProgressReporter progress(progress_options);
  int64_t tokens = 0;
  while (step_ < total_steps_) {
    const size_t records = history_.size();
    RETURN_IF_ERROR(TrainStep());
    if (history_.size() > records) tokens += history_.back().tokens;
    if (rank_ == 0) progress.Update(step_, tokens);
  }
  if (rank_ == 0) progress.Finish();
  if (!config_.checkpoint_dir.empty()) RETURN_IF_ERROR(state_->Save(step_));
  if (!config_.export_dir.empty() && rank_ == 0) {
    ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(config_.target_dir));
    RETURN_IF_ERROR(draft_->Export(target, config_.export_dir));
    SS_LOG_INFO("export: {} draft written to {}", draft_->type(), config_.export_dir);
  }
  return absl::OkStatus();
}

}  // namespace specstream::student
