#include "student/trainer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/hf_config.h"
#include "common/logging.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_util.h"
#include "student/checkpoint.h"
#include "student/export.h"
#include "student/online_source.h"
#include "student/sampler.h"
#include "student/student_commands.h"
#include "student/tensorboard.h"

namespace specstream::student {
namespace {

// Builds the vocab map from the masked tokens of every sample in the store
// (deterministic, so every rank builds the same one).
absl::StatusOr<VocabMap> BuildMapFromSource(SampleSource& source, int64_t target_vocab,
                                            int64_t draft_vocab) {
  TokenCounter counter(target_vocab);
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (int64_t i = 0; i < source.size(); ++i) {
    RETURN_IF_ERROR(source.TokenIds(i, &ids, &mask));
    RETURN_IF_ERROR(counter.Add(ids, mask));
  }
  return BuildVocabMap(counter, draft_vocab);
}

}  // namespace

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
  c.in_flight = spec.data().in_flight() > 0 ? spec.data().in_flight() : 8;
  c.ledger_dir = spec.data().ledger_dir();
  if (!spec.data().transport().empty()) c.transport = spec.data().transport();
  c.target_dir = spec.model().target();
  const auto& draft = spec.model().draft();
  c.vocab_map = draft.vocab_map();
  c.draft_vocab_size = draft.draft_vocab_size();
  c.intermediate_size = draft.intermediate_size();
  c.num_attention_heads = draft.num_attention_heads();
  c.num_key_value_heads = draft.num_key_value_heads();
  c.head_dim = draft.head_dim();
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

double SimulatedAcceptLength(const std::vector<double>& acc_k) {
  double total = 0, product = 1;
  for (double a : acc_k) {
    product *= a;
    total += product;
  }
  return total;
}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerConfig config, int rank,
                                                         int world_size,
                                                         c10::intrusive_ptr<CommGroup> group,
                                                         c10::intrusive_ptr<c10d::Store> store) {
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
  trainer->config_ = std::move(config);
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
  if (c.ttt_steps < 1) return absl::InvalidArgumentError("training.ttt_steps must be >= 1");
  if ((c.epochs > 0) == (c.max_steps > 0)) {
    return absl::InvalidArgumentError("set exactly one of training.epochs and training.max_steps");
  }
  if ((c.batch_size > 0) == (c.batch_tokens > 0)) {
    return absl::InvalidArgumentError(
        "set exactly one of training.batch_size and training.batch_tokens");
  }
  ASSIGN_OR_RETURN(HfModelConfig target, LoadHfConfig(c.target_dir));
  std::string source_name;
  if (!c.teachers.empty()) {
    OnlineSourceOptions online;
    online.data = c.tokenized;
    online.teachers = c.teachers;
    online.connector = c.teacher_connector;
    online.rank = rank_;
    online.in_flight = c.in_flight;
    online.transport = c.transport;
    online.device = device_;
    online.token = c.job_token;
    online.nccl_channel_for_testing = c.nccl_channel_for_testing;
    if (!c.ledger_dir.empty()) {
      std::error_code error;
      std::filesystem::create_directories(c.ledger_dir, error);
      online.ledger = absl::StrCat(c.ledger_dir, "/ledger-rank", rank_, ".jsonl");
    }
    ASSIGN_OR_RETURN(source_, OnlineSource::Open(online));
    source_name = absl::StrCat("the teachers at ", absl::StrJoin(c.teachers, ", "));
  } else {
    ASSIGN_OR_RETURN(source_, StoreSource::Open(c.store));
    source_name = absl::StrCat("store ", c.store);
  }
  // The data must come from this target: same family, sizes and vocab.
  const ModelContract& model = source_->model();
  auto mismatch = [&](const char* field, const nlohmann::json& stored, const nlohmann::json& mine) {
    return absl::FailedPreconditionError(
        absl::StrCat(source_name, " served a different target: contract.model.", field, " is ",
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
  const std::vector<int> capture = model.capture_layer_ids;
  capture_ = capture;

  VocabMap map;
  if (!c.vocab_map.empty()) {
    ASSIGN_OR_RETURN(map, LoadVocabMap(c.vocab_map));
    if (map.target_vocab() != target.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.draft.vocab_map ", c.vocab_map, " covers ", map.target_vocab(),
                       " target ids but the target vocab is ", target.vocab_size));
    }
  } else {
    if (c.draft_vocab_size < 1 || c.draft_vocab_size > target.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("model.draft.draft_vocab_size ",
                                                     c.draft_vocab_size, " must be in [1, ",
                                                     target.vocab_size, "]"));
    }
    ASSIGN_OR_RETURN(map, BuildMapFromSource(*source_, target.vocab_size, c.draft_vocab_size));
  }

  DraftShape shape;
  shape.hidden_size = target.hidden_size;
  shape.target_hidden_size = target.hidden_size;
  shape.num_captures = static_cast<int64_t>(capture.size());
  shape.intermediate_size =
      c.intermediate_size > 0 ? c.intermediate_size : target.intermediate_size;
  shape.num_attention_heads =
      c.num_attention_heads > 0 ? c.num_attention_heads : target.num_attention_heads;
  shape.num_key_value_heads =
      c.num_key_value_heads > 0 ? c.num_key_value_heads : target.num_key_value_heads;
  shape.head_dim = c.head_dim > 0 ? c.head_dim : target.head_dim;
  shape.draft_vocab_size = map.draft_vocab();
  shape.target_vocab_size = target.vocab_size;
  shape.rms_norm_eps = target.rms_norm_eps;
  shape.rope_theta = target.rope_theta;
  shape.rope_scaling = target.rope_scaling;
  shape.max_position_embeddings = target.max_position_embeddings;
  RETURN_IF_ERROR(ValidateCpLayout(layout_, shape.num_attention_heads, shape.num_key_value_heads));
  RETURN_IF_ERROR(ConnectDeviceGroup());
  ASSIGN_OR_RETURN(cp_groups_, CreateCpGroups(layout_, store_, c.local_address,
                                              std::chrono::minutes(5), device_));
  ASSIGN_OR_RETURN(draft_, Eagle3Draft::Create(shape, c.target_dir, map, c.seed,
                                               !source_->has_target_ids(), device_));
  RETURN_IF_ERROR(BroadcastParameters());
  optimizer_ = std::make_unique<AdamW>(draft_->parameters(), c.adamw);
  // Gradients exist from the start (zeros), so a parameter without gradient
  // in some step is treated the same in a continuous and a resumed run.
  for (auto& [name, p] : draft_->parameters()) p.mutable_grad() = torch::zeros_like(p);
  SetUpGradientBuckets();

  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> plan, EpochPlan(0));
  steps_per_epoch_ = static_cast<int64_t>(plan.size());
  // A step holds its batch and the next one's (prefetched).
  size_t largest_batch = 0;
  for (const auto& batch : plan) largest_batch = std::max(largest_batch, batch.size());
  for (const auto& batch : token_batches_) largest_batch = std::max(largest_batch, batch.size());
  source_->ReserveOutstanding(2 * static_cast<int64_t>(largest_batch));
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
      "steps, draft vocab {}, K={}",
      rank_, world_size_, layout_.dp_rank(), layout_.dp_size(), layout_.cp_rank(), layout_.cp_size,
      layout_.ulysses, device_.str(), source_->size(), steps_per_epoch_, total_steps_,
      map.draft_vocab(), c.ttt_steps);
  if (c.resume) RETURN_IF_ERROR(TryResume());
  if (!c.tensorboard_dir.empty() && rank_ == 0) {
    ASSIGN_OR_RETURN(tensorboard_, TensorBoardWriter::Create(c.tensorboard_dir));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> Trainer::EpochPlan(int64_t epoch) {
  if (epoch == cached_epoch_) return cached_plan_;
  SamplerOptions options;
  options.seed = config_.seed;
  // The CP ranks of a DP group share its batches.
  options.dp_rank = layout_.dp_rank();
  options.dp_size = layout_.dp_size();
  std::vector<std::vector<int64_t>> plan;
  if (config_.batch_size > 0) {
    ASSIGN_OR_RETURN(auto sampler, DistributedSampler::Create(source_->size(), options));
    std::vector<int64_t> order = sampler->Indices(epoch);
    for (size_t i = 0; i < order.size(); i += config_.batch_size) {
      plan.emplace_back(order.begin() + i,
                        order.begin() + std::min(order.size(), i + config_.batch_size));
    }
  } else {
    // Token budgets: the samples are packed once, globally (by length, so a
    // batch pads little), and each epoch deals the packed batches to the
    // ranks in a shuffled order. Every rank and every epoch then has the same
    // number of steps, which keeps collectives in step and resume exact.
    if (token_batches_.empty()) {
      std::vector<int64_t> by_length(source_->size());
      std::iota(by_length.begin(), by_length.end(), 0);
      auto length = [&](int64_t index) {
        int64_t len = source_->Length(index);
        return config_.max_length > 0 ? std::min(len, config_.max_length) : len;
      };
      std::stable_sort(by_length.begin(), by_length.end(),
                       [&](int64_t a, int64_t b) { return length(a) < length(b); });
      std::vector<int64_t> current;
      int64_t longest = 0;
      for (int64_t index : by_length) {
        const int64_t len = length(index);
        const int64_t padded = (static_cast<int64_t>(current.size()) + 1) * std::max(longest, len);
        if (!current.empty() && padded > config_.batch_tokens) {
          token_batches_.push_back(std::move(current));
          current.clear();
          longest = 0;
        }
        current.push_back(index);
        longest = std::max(longest, len);
      }
      if (!current.empty()) token_batches_.push_back(std::move(current));
    }
    ASSIGN_OR_RETURN(auto sampler, DistributedSampler::Create(
                                       static_cast<int64_t>(token_batches_.size()), options));
    for (int64_t batch : sampler->Indices(epoch)) plan.push_back(token_batches_[batch]);
  }
  if (plan.empty()) return absl::FailedPreconditionError("an epoch has no batches");
  cached_epoch_ = epoch;
  cached_plan_ = plan;
  return plan;
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

absl::Status Trainer::BroadcastParameters() {
  if (world_size_ == 1) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : draft_->parameters()) {
    torch::Tensor data = p.detach();
    RETURN_IF_ERROR(Annotate(Broadcast(*device_group_, data, 0), name));
  }
  return absl::OkStatus();
}

void Trainer::SetUpGradientBuckets() {
  if (world_size_ == 1) return;
  // Gradients become ready roughly in reverse order of use, so buckets are
  // filled from the last parameter backwards. Each parameter's hook copies
  // its gradient into the bucket's flat buffer; the bucket's all-reduce
  // starts as soon as its last gradient arrives, overlapping the rest of the
  // backward pass.
  const auto& params = draft_->parameters();
  buckets_.clear();
  int64_t filled = 0;
  for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
    const int64_t numel = params[i].second.numel();
    if (buckets_.empty() || (filled > 0 && filled + numel > config_.ddp_bucket_elements)) {
      buckets_.emplace_back();
      filled = 0;
    }
    GradBucket& bucket = buckets_.back();
    bucket.params.push_back(static_cast<size_t>(i));
    bucket.offsets.push_back(filled);
    filled += numel;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    GradBucket& bucket = buckets_[b];
    int64_t total = 0;
    for (size_t j = 0; j < bucket.params.size(); ++j)
      total += params[bucket.params[j]].second.numel();
    bucket.flat = torch::zeros({total}, torch::TensorOptions(torch::kFloat32).device(device_));
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      torch::Tensor param = params[bucket.params[j]].second;
      const int64_t offset = bucket.offsets[j];
      param.register_hook([this, b, offset](torch::Tensor grad) {
        GradBucket& target = buckets_[b];
        target.flat.narrow(0, offset, grad.numel()).copy_(grad.reshape({-1}));
        --target.pending;
        // Collectives must be issued in the same order on every rank: launch
        // buckets strictly in index order, as soon as each and all before it
        // are complete.
        while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
          LaunchBucket(buckets_[next_bucket_++]);
        }
      });
    }
  }
}

void Trainer::LaunchBucket(GradBucket& bucket) {
  std::vector<torch::Tensor> flat{bucket.flat};
  bucket.work = device_group_->allreduce(flat);
}

void Trainer::PrepareGradientBuckets() {
  next_bucket_ = 0;
  for (GradBucket& bucket : buckets_) {
    bucket.flat.zero_();
    bucket.pending = static_cast<int64_t>(bucket.params.size());
    bucket.work.reset();
  }
}

absl::Status Trainer::SyncGradients() {
  if (world_size_ == 1) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  // The loss is already normalised by the global count, so the reduction is
  // a sum. Buckets whose parameters did not all receive a gradient this step
  // are reduced now (their missing parts are zeros).
  return CatchTorch("gradient all_reduce", [&] {
    const auto& params = draft_->parameters();
    // Buckets whose gradients did not all arrive (e.g. a 1-token batch
    // leaves the head without gradient) go now, still in index order.
    while (next_bucket_ < buckets_.size()) LaunchBucket(buckets_[next_bucket_++]);
    for (GradBucket& bucket : buckets_) {
      bucket.work->wait();
      for (size_t j = 0; j < bucket.params.size(); ++j) {
        torch::Tensor param = params[bucket.params[j]].second;
        torch::Tensor reduced =
            bucket.flat.narrow(0, bucket.offsets[j], param.numel()).view_as(param);
        if (param.grad().defined()) {
          param.mutable_grad().copy_(reduced);
        } else {
          param.mutable_grad() = reduced.clone();
        }
      }
    }
  });
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
  return RowRange{shard.begin, shard.begin + shard.padded_length,
                  shard.begin + shard.padded_length + config_.ttt_steps};
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
  return CollateShard(samples, config_.max_length, rows.begin, rows.end - rows.begin,
                      rows.halo_end - rows.end);
}

absl::Status Trainer::TrainStep() {
  absl::Status status;
  RETURN_IF_ERROR(CatchTorch(absl::StrCat("training step ", step_ + 1),
                             [&] { status = TrainStepUnchecked(); }));
  return status;
}

absl::Status Trainer::TrainStepUnchecked() {
  if (!record_open_) {
    record_start_ = std::chrono::steady_clock::now();
    record_open_ = true;
  }
  const int64_t epoch = step_ / steps_per_epoch_;
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> plan, EpochPlan(epoch));
  const std::vector<int64_t> indices = plan[step_ % steps_per_epoch_];
  // Online sources compute this batch (if not yet asked) and the batches
  // after it while this step trains: at least the next one, and as many
  // more as data.in_flight samples reach, so that a teacher far away (a
  // round trip of tens of ms, slow start after each idle gap) streams
  // several steps ahead instead of one.
  source_->Prefetch(indices, BatchRows(indices));
  // The loop also stops after in_flight steps, so empty batches (which use
  // no budget) cannot make it walk the rest of training; the epoch plan is
  // fetched once per epoch it crosses, not once per step ahead.
  int64_t budget = config_.in_flight - static_cast<int64_t>(indices.size());
  std::vector<std::vector<int64_t>> ahead_plan = plan;
  int64_t ahead_epoch = epoch;
  for (int64_t ahead = step_ + 1; ahead < total_steps_ && ahead <= step_ + config_.in_flight;
       ++ahead) {
    if (ahead / steps_per_epoch_ != ahead_epoch) {
      ahead_epoch = ahead / steps_per_epoch_;
      ASSIGN_OR_RETURN(ahead_plan, EpochPlan(ahead_epoch));
    }
    const std::vector<int64_t>& next = ahead_plan[ahead % steps_per_epoch_];
    if (ahead > step_ + 1 && static_cast<int64_t>(next.size()) > budget) break;
    source_->Prefetch(next, BatchRows(next));
    budget -= static_cast<int64_t>(next.size());
  }
  ASSIGN_OR_RETURN(DraftBatch batch, LoadBatch(indices));
  const int k_steps = config_.ttt_steps;
  // Tokens of this rank's own rows (a CP shard counts only its part), from
  // the host's copy of the lengths.
  const int64_t own_rows = batch.aux_hidden.size(1);
  for (int64_t length : batch.host_lengths) {
    tokens_since_record_ += std::clamp<int64_t>(length - batch.offset, 0, own_rows);
  }
  batch = ToDevice(std::move(batch), device_);

  // From here to the metrics, work is only queued on the device.
  torch::Tensor global_valid;
  RETURN_IF_ERROR(
      CatchTorch("valid positions", [&] { global_valid = draft_->CountValid(batch, k_steps); }));
  RETURN_IF_ERROR(AllReduce(global_valid));

  for (auto& [name, p] : draft_->parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  PrepareGradientBuckets();
  const DraftParallel parallel{cp_groups_.ulysses.get(), cp_groups_.ring.get()};
  ASSIGN_OR_RETURN(TttOutputs out,
                   draft_->Forward(batch, k_steps, global_valid, config_.dtype, parallel));
  RETURN_IF_ERROR(CatchTorch("backward", [&] { out.weighted_loss.backward(); }));
  RETURN_IF_ERROR(SyncGradients());
  torch::Tensor grad_norm;
  RETURN_IF_ERROR(CatchTorch("gradient clipping", [&] {
    grad_norm = ClipGradNorm(draft_->parameters(), config_.grad_clip);
  }));
  const double lr = schedule_.At(step_);
  RETURN_IF_ERROR(CatchTorch("optimizer step", [&] { optimizer_->Step(lr); }));
  ++step_;
  RETURN_IF_ERROR(source_->Commit(step_, indices));

  if (RecordsMetrics(step_)) {
    ASSIGN_OR_RETURN(StepMetrics m, ReadMetrics(out, global_valid, grad_norm, lr));
    history_.push_back(m);
    if (rank_ == 0) Log(m);
  }
  if (!config_.checkpoint_dir.empty() && config_.checkpoint_every > 0 &&
      step_ % config_.checkpoint_every == 0 && step_ < total_steps_) {
    RETURN_IF_ERROR(SaveCheckpoint());
  }
  return absl::OkStatus();
}

bool Trainer::RecordsMetrics(int64_t step) const {
  return config_.log_every <= 0 || step % config_.log_every == 0 || step == total_steps_;
}

absl::StatusOr<StepMetrics> Trainer::ReadMetrics(const TttOutputs& out,
                                                 const torch::Tensor& global_valid,
                                                 const torch::Tensor& grad_norm, double lr) {
  const int k_steps = config_.ttt_steps;
  // One tensor, one all-reduce, one copy to the host: loss and correct
  // sums per step (over all ranks), this record's tokens (all ranks), the
  // global valid counts (already summed) and the grad norm (the same on
  // every rank) ride along.
  torch::Tensor host;
  RETURN_IF_ERROR(CatchTorch("metrics", [&] {
    torch::Tensor summed =
        torch::cat({out.loss_sum.to(torch::kFloat64), out.correct.to(torch::kFloat64),
                    torch::full({1}, static_cast<double>(tokens_since_record_),
                                out.loss_sum.options().dtype(torch::kFloat64))});
    absl::Status reduced = AllReduce(summed);
    TORCH_CHECK(reduced.ok(), reduced.ToString());
    host = torch::cat({summed, global_valid.to(torch::kFloat64), grad_norm.reshape({1})})
               .to(torch::kCPU);
  }));
  const double* v = host.data_ptr<double>();
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - record_start_).count();
  record_open_ = false;
  tokens_since_record_ = 0;
  StepMetrics m;
  m.step = step_;
  m.lr = lr;
  m.grad_norm = v[3 * k_steps + 1];
  m.positions = static_cast<int64_t>(v[2 * k_steps + 1]);
  double decay = 1;
  for (int k = 0; k < k_steps; ++k) {
    const double denominator = std::max(1.0, v[2 * k_steps + 1 + k]);
    m.loss_k.push_back(v[k] / denominator);
    m.acc_k.push_back(v[k_steps + k] / denominator);
    m.loss += decay * m.loss_k.back();
    decay *= 0.8;
  }
  m.sim_accept_len = SimulatedAcceptLength(m.acc_k);
  m.tokens = static_cast<int64_t>(v[2 * k_steps]);
  m.tokens_per_second = static_cast<double>(m.tokens) / std::max(seconds, 1e-9);
  return m;
}

void Trainer::Log(const StepMetrics& m) {
  auto fmt = [](const std::vector<double>& v) {
    return absl::StrJoin(v, ",", [](std::string* out, double x) {
      absl::StrAppend(out, absl::StrFormat("%.4f", x));
    });
  };
  if (config_.log_every > 0) {
    SS_LOG_INFO(
        "step {}/{} loss {:.4f} acc [{}] accept_len {:.3f} lr {:.3g} grad_norm {:.3f} "
        "{:.0f} tok/s",
        m.step, total_steps_, m.loss, fmt(m.acc_k), m.sim_accept_len, m.lr, m.grad_norm,
        m.tokens_per_second);
  }
  if (!config_.metrics_jsonl.empty()) {
    nlohmann::json line = {{"step", m.step},
                           {"total_steps", total_steps_},
                           {"loss", m.loss},
                           {"loss_k", m.loss_k},
                           {"acc_k", m.acc_k},
                           {"sim_accept_len", m.sim_accept_len},
                           {"lr", m.lr},
                           {"grad_norm", m.grad_norm},
                           {"tokens_per_s", m.tokens_per_second},
                           {"positions", m.positions}};
    std::ofstream out(config_.metrics_jsonl, std::ios::app);
    out << line.dump() << "\n";
  }
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> scalars = {
        {"train/loss", m.loss},
        {"train/sim_accept_len", m.sim_accept_len},
        {"train/lr", m.lr},
        {"train/grad_norm", m.grad_norm},
        {"train/tokens_per_s", m.tokens_per_second}};
    for (size_t k = 0; k < m.acc_k.size(); ++k) {
      scalars.emplace_back(absl::StrCat("train/acc_", k), m.acc_k[k]);
      scalars.emplace_back(absl::StrCat("train/loss_", k), m.loss_k[k]);
    }
    absl::Status s = tensorboard_->WriteScalars(m.step, scalars);
    if (!s.ok()) SS_LOG_WARN("tensorboard: {}", std::string(s.message()));
  }
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
  if (!config_.checkpoint_dir.empty()) RETURN_IF_ERROR(SaveCheckpoint());
  if (!config_.export_dir.empty() && rank_ == 0) RETURN_IF_ERROR(Export());
  return absl::OkStatus();
}

absl::Status Trainer::SaveCheckpoint() {
  torch::NoGradGuard no_grad;
  // Every rank's RNG state travels to rank 0, which writes the checkpoint;
  // the barrier keeps ranks from racing ahead of a checkpoint in progress.
  std::map<int, std::string> rng;
  torch::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  if (world_size_ > 1) {
    std::vector<std::vector<torch::Tensor>> gathered(1);
    for (int r = 0; r < world_size_; ++r) gathered[0].push_back(torch::empty_like(state));
    std::vector<torch::Tensor> input{state};
    RETURN_IF_ERROR(
        CatchTorch("rng all_gather", [&] { group_->allgather(gathered, input)->wait(); }));
    for (int r = 0; r < world_size_; ++r) {
      const torch::Tensor& t = gathered[0][r];
      rng[r] = std::string(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
  } else {
    rng[0] = std::string(static_cast<const char*>(state.data_ptr()), state.nbytes());
  }
  absl::Status status;
  if (rank_ == 0) {
    CheckpointContents contents;
    // Checkpoints are host tensors, whatever the device.
    for (const auto& [name, p] : draft_->parameters()) {
      contents.draft[name] = p.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    const VocabMap& map = draft_->vocab_map();
    contents.draft["d2t"] = torch::tensor(map.d2t, torch::kInt64);
    contents.draft["t2d"] =
        torch::tensor(std::vector<int64_t>(map.t2d.begin(), map.t2d.end())).to(torch::kBool);
    for (const auto& [name, t] : optimizer_->State()) {
      contents.optimizer[name] = t.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    contents.rng_by_rank = rng;
    contents.state = {{"step", step_},
                      {"epoch", step_ / steps_per_epoch_},
                      {"batch_in_epoch", step_ % steps_per_epoch_},
                      {"steps_per_epoch", steps_per_epoch_},
                      {"total_steps", total_steps_},
                      {"world_size", world_size_},
                      {"cp_size", layout_.cp_size},
                      {"ulysses_degree", layout_.ulysses},
                      {"seed", config_.seed},
                      {"ttt_steps", config_.ttt_steps},
                      {"target_dir", config_.target_dir},
                      {"capture_layer_ids", capture_},
                      {"draft_shape", DraftShapeJson(draft_->shape())},
                      {"store", config_.store},
                      {"scheduler",
                       {{"peak_lr", schedule_.peak_lr},
                        {"warmup_steps", schedule_.warmup_steps},
                        {"total_steps", schedule_.total_steps},
                        {"cosine", schedule_.cosine},
                        {"min_lr_ratio", schedule_.min_lr_ratio}}}};
    auto manager = CheckpointManager::Create(
        {config_.checkpoint_dir, static_cast<int>(config_.keep_last), {}});
    status = manager.ok() ? (*manager)->Save(step_, contents) : manager.status();
  }
  if (world_size_ > 1) {
    RETURN_IF_ERROR(CatchTorch("barrier", [&] { group_->barrier()->wait(); }));
  }
  return status;
}

absl::Status Trainer::TryResume() {
  // Only rank 0 may clean up leftovers; the others read.
  CheckpointOptions options;
  options.root = config_.checkpoint_dir;
  options.keep_last = static_cast<int>(config_.keep_last);
  options.read_only = rank_ != 0;
  ASSIGN_OR_RETURN(auto manager, CheckpointManager::Create(options));
  ASSIGN_OR_RETURN(std::optional<int64_t> latest, manager->LatestStep());
  if (!latest) {
    SS_LOG_INFO("resume: no checkpoint in {}, starting from step 0", config_.checkpoint_dir);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(CheckpointContents contents, manager->Load(*latest));
  const nlohmann::json& state = contents.state;
  if (state.value("world_size", 0) != world_size_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint step ", *latest, " was written by ", state.value("world_size", 0),
                     " ranks; exact resume needs the same world size (", world_size_, ")"));
  }
  if (state.value("cp_size", 1) != layout_.cp_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint step ", *latest, " was written with cp_size ", state.value("cp_size", 1),
        "; exact resume needs the same (", layout_.cp_size, ")"));
  }
  if (state.value("steps_per_epoch", int64_t{0}) != steps_per_epoch_) {
    return absl::FailedPreconditionError(
        "checkpoint was taken with a different data plan "
        "(store or batch settings changed)");
  }
  torch::NoGradGuard no_grad;
  const VocabMap& map = draft_->vocab_map();
  auto d2t = contents.draft.find("d2t");
  if (d2t == contents.draft.end() ||
      !torch::equal(d2t->second, torch::tensor(map.d2t, torch::kInt64))) {
    return absl::FailedPreconditionError("checkpoint's draft vocab map differs from this job's");
  }
  for (auto& [name, p] : draft_->parameters()) {
    auto it = contents.draft.find(name);
    if (it == contents.draft.end() || !it->second.sizes().equals(p.sizes())) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint lacks draft tensor ", name, " of this shape"));
    }
    p.detach().copy_(it->second);
  }
  RETURN_IF_ERROR(optimizer_->LoadState(contents.optimizer));
  auto rng = contents.rng_by_rank.find(rank_);
  if (rng != contents.rng_by_rank.end()) {
    torch::Tensor bytes = torch::empty({static_cast<int64_t>(rng->second.size())}, torch::kUInt8);
    std::memcpy(bytes.data_ptr(), rng->second.data(), rng->second.size());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(bytes);
  }
  step_ = state.value("step", int64_t{0});
  if (world_size_ > 1) {
    // Every rank must have picked the same checkpoint.
    torch::Tensor low = torch::tensor({step_}, torch::kInt64), high = low.clone();
    RETURN_IF_ERROR(CatchTorch("resume step check", [&] {
      c10d::AllreduceOptions min_options, max_options;
      min_options.reduceOp = c10d::ReduceOp::MIN;
      max_options.reduceOp = c10d::ReduceOp::MAX;
      std::vector<torch::Tensor> a{low}, b{high};
      group_->allreduce(a, min_options)->wait();
      group_->allreduce(b, max_options)->wait();
    }));
    if (low.item<int64_t>() != high.item<int64_t>()) {
      return absl::FailedPreconditionError(
          absl::StrCat("ranks resumed from different checkpoints (steps ", low.item<int64_t>(),
                       " to ", high.item<int64_t>(), ")"));
    }
  }
  SS_LOG_INFO("resume: continuing from step {} of {}", step_, total_steps_);
  return absl::OkStatus();
}

absl::Status Trainer::Export() {
  ASSIGN_OR_RETURN(ExportInput in, DraftExportInput(*draft_, config_.target_dir, capture_));
  RETURN_IF_ERROR(ExportDraft(in, config_.export_dir));
  SS_LOG_INFO("export: draft written to {}", config_.export_dir);
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Evaluate(Eagle3Draft& draft, SampleSource& source, int ttt_steps,
                                    int64_t max_length, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  // Per-step sums on the draft's device: loss, correct, valid.
  torch::Tensor sums =
      torch::zeros({3, ttt_steps}, torch::TensorOptions(torch::kFloat64).device(draft.device()));
  for (int64_t i = 0; i < source.size(); ++i) {
    ASSIGN_OR_RETURN(TrainingSample s, source.Get(i));
    const DraftBatch batch = ToDevice(Collate({s}, max_length), draft.device());
    torch::Tensor counts;
    RETURN_IF_ERROR(CatchTorch("eval", [&] { counts = draft.CountValid(batch, ttt_steps); }));
    ASSIGN_OR_RETURN(TttOutputs out, draft.Forward(batch, ttt_steps, counts, dtype));
    sums += torch::stack({out.loss_sum.to(torch::kFloat64), out.correct.to(torch::kFloat64),
                          out.valid.to(torch::kFloat64)});
  }
  const torch::Tensor host = sums.to(torch::kCPU).contiguous();
  const double* loss_sum = host.data_ptr<double>();
  const double* correct = loss_sum + ttt_steps;
  const double* valid = correct + ttt_steps;
  EvalResult result;
  double decay = 1;
  for (int k = 0; k < ttt_steps; ++k) {
    const double denominator = std::max(valid[k], 1.0);
    result.loss += decay * loss_sum[k] / denominator;
    result.acc_k.push_back(correct[k] / denominator);
    decay *= 0.8;
  }
  result.sim_accept_len = SimulatedAcceptLength(result.acc_k);
  result.positions = static_cast<int64_t>(valid[0]);
  return result;
}

}  // namespace specstream::student
