#include "teacher/teacher_core.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/transport/contract.h"
#include "common/transport/framing.h"
#if SPECSTREAM_WITH_NCCL
#include "common/transport/nccl_channel.h"
#include "common/transport/nccl_util.h"
#endif
#include "teacher/decode_target.h"
#include "teacher/hf_runtime.h"
#include "teacher/sample_tensors.h"
#include "teacher/target_runtime.h"

namespace specstream::teacher {
namespace {

// Bound on every StreamResponse that is not a payload chunk: Opened, a
// SampleHeader (a contract of at most five tensors is a few hundred bytes)
// and SampleError (messages are cut to 4 KiB).
constexpr uint64_t kMaxControlMessageBytes = 64 << 10;

absl::Status ValidateOptions(const TeacherServiceOptions& options) {
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: ", options.max_tokens, " < 0"));
  }
  if (options.chunk_bytes < kMinChunkBytes || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk_bytes: %d not in [%d, %d]", options.chunk_bytes, kMinChunkBytes, kMaxChunkBytes));
  }
  if (options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError("max_batch_tokens: must be >= 1");
  }
  if (options.answer_batch < 1) return absl::InvalidArgumentError("answer_batch: must be >= 1");
  if (options.answer_cache_tokens < 0) {
    return absl::InvalidArgumentError("answer_cache_tokens: must be >= 0");
  }
  if (options.max_samples_per_stream < 1) {
    return absl::InvalidArgumentError("max_samples_per_stream: must be >= 1");
  }
  if (options.max_queued_requests < 1) {
    return absl::InvalidArgumentError("max_queued_requests: must be >= 1");
  }
  if (options.max_queued_request_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_queued_request_bytes: ", options.max_queued_request_bytes, " must be > 0"));
  }
  if (options.max_queued_request_bytes_per_stream <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_queued_request_bytes_per_stream: ", options.max_queued_request_bytes_per_stream,
        " must be > 0"));
  }
  if (options.max_streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_streams: ", options.max_streams, " must be >= 1"));
  }
  if (options.max_streams_per_peer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_streams_per_peer: ", options.max_streams_per_peer, " must be >= 1"));
  }
  if (options.shm_space_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("shm_space_timeout: must be > 0");
  }
  if (options.nccl_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl_timeout: must be > 0");
  }
  if (options.nccl_device >= 0) {
#if SPECSTREAM_WITH_NCCL
    const int devices = CudaDeviceCount();
    if (options.nccl_device >= devices) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "nccl_device: CUDA device %d, but %d are visible", options.nccl_device, devices));
    }
#else
    return absl::InvalidArgumentError(
        "nccl_device: this teacher was built without NCCL (SPECSTREAM_WITH_NCCL=0)");
#endif
  }
  return absl::OkStatus();
}

// How this teacher joins NCCL payload channels (rank 0): the test channel
// when set, NCCL when built with it and given a device, else none.
PayloadChannelJoin NcclJoin(const TeacherServiceOptions& options) {
  if (options.nccl_channel_for_testing) return options.nccl_channel_for_testing;
#if SPECSTREAM_WITH_NCCL
  if (options.nccl_device >= 0) {
    return [](absl::string_view id, PayloadChannelOptions channel) {
      return JoinNcclChannel(id, std::move(channel));
    };
  }
#endif
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TeacherCore>> TeacherCore::Create(TargetRuntime& runtime,
                                                                 TeacherServiceOptions options) {
  const ModelDescription& model = runtime.Describe();
  ASSIGN_OR_RETURN(DType payload_dtype, ParseHiddenDType("payload_dtype", options.payload_dtype));
  RETURN_IF_ERROR(ValidateOptions(options));
  int64_t max_tokens = options.max_tokens;
  if (max_tokens == 0) {
    if (model.max_position_embeddings <= 0) {
      return absl::InvalidArgumentError(
          "max_tokens: the model has no max_position_embeddings; set max_tokens");
    }
    max_tokens = model.max_position_embeddings;
  } else if (model.max_position_embeddings > 0 && max_tokens > model.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: ", max_tokens,
                                                   " is over the model's max_position_embeddings ",
                                                   model.max_position_embeddings));
  }

  std::unique_ptr<TeacherCore> core(new TeacherCore(std::move(options)));
  const TeacherServiceOptions& o = core->options_;
  core->max_tokens_ = max_tokens;
  v1::DescribeResponse& d = core->description_;
  d.set_model_type(model.model_type);
  d.set_hidden_size(model.hidden_size);
  d.set_vocab_size(model.vocab_size);
  d.set_num_layers(model.num_layers);
  for (int id : model.capture_layer_ids) d.add_capture_layer_ids(id);
  d.set_per_stream_capture_layers(true);
  d.set_dtype(ToProtoDType(payload_dtype));
  d.set_max_tokens(max_tokens);
  d.add_transports(v1::TRANSPORT_INLINE);
  d.set_hostname(LocalHostname());
  d.set_boot_id(LocalBootId());
  // Without a boot id a student could not tell that it shares the host.
  if (!d.boot_id().empty() && !d.hostname().empty()) d.add_transports(v1::TRANSPORT_SHM);
  if (core->offers_nccl()) d.add_transports(v1::TRANSPORT_NCCL);
  if (const auto* hf = dynamic_cast<const HfRuntime*>(&runtime);
      hf != nullptr && hf->can_decode()) {
    d.set_answers(true);
    core->answer_stop_ids_ =
        o.answer_stop_ids.empty() ? StopIds(hf->config(), nullptr) : o.answer_stop_ids;
  }
  d.set_max_message_bytes(static_cast<int64_t>(
      std::max<uint64_t>(o.chunk_bytes + kMaxChunkHeaderBytes, kMaxControlMessageBytes)));

  ComputeBatcherOptions batcher;
  batcher.payload_dtype = payload_dtype;
  batcher.keep_target_ids = o.keep_target_ids;
  batcher.max_batch_tokens = o.max_batch_tokens;
  batcher.nccl_device = o.nccl_device;
  batcher.corrupt_payload_for_testing = o.corrupt_payload_for_testing;
  core->queue_budget_ = std::make_unique<QueueBudget>(o.max_queued_request_bytes);
  core->batcher_ = std::make_unique<ComputeBatcher>(runtime, std::move(batcher));

  StreamSessionConfig& s = core->session_config_;
  s.payload_dtype = d.dtype();
  s.max_tokens = max_tokens;
  s.vocab_size = model.vocab_size;
  s.num_layers = model.num_layers;
  s.max_samples_per_stream = o.max_samples_per_stream;
  s.max_queued_requests = o.max_queued_requests;
  s.max_queued_request_bytes =
      std::min(o.max_queued_request_bytes_per_stream, o.max_queued_request_bytes);
  s.sender.chunk_bytes = o.chunk_bytes;
  s.sender.shm_space_timeout = o.shm_space_timeout;
  s.sender.nccl_device = o.nccl_device;
  s.sender.nccl_timeout = o.nccl_timeout;
  s.sender.nccl_join = NcclJoin(o);
  s.sender.built_with_nccl = SPECSTREAM_WITH_NCCL;
  s.batcher = core->batcher_.get();
  s.queue_budget = core->queue_budget_.get();
  TeacherCore* raw = core.get();
  s.on_sample_sent = [raw] {
    absl::MutexLock lock(&raw->stats_mu_);
    ++raw->stats_.samples_sent;
  };
  s.on_sample_error = [raw] {
    absl::MutexLock lock(&raw->stats_mu_);
    ++raw->stats_.sample_errors;
  };
  SS_LOG_INFO("teacher service: {} (hidden {}, vocab {}), payload {}, max_tokens {}",
              model.model_type, model.hidden_size, model.vocab_size,
              std::string(DTypeName(payload_dtype)), max_tokens);
  return core;
}

TeacherCore::TeacherCore(TeacherServiceOptions options) : options_(std::move(options)) {}

TeacherCore::~TeacherCore() { Stop(); }

bool TeacherCore::offers_nccl() const {
  return options_.nccl_device >= 0 || options_.nccl_channel_for_testing != nullptr;
}

uint64_t TeacherCore::max_request_bytes() const {
  // A token id is a varint of at most 10 bytes (negative ids), plus one mask
  // byte; 64 KiB covers the rest of a request.
  return std::max<uint64_t>(static_cast<uint64_t>(max_tokens_) * 11 + (64 << 10), 1 << 20);
}

std::shared_ptr<StreamSession> TeacherCore::NewSession(StreamCall* call, std::string peer) {
  auto session = std::make_shared<StreamSession>(session_config_, call, std::move(peer));
  {
    absl::MutexLock lock(&mu_);
    sessions_[session.get()] = session;
  }
  absl::MutexLock lock(&stats_mu_);
  ++stats_.streams;
  return session;
}

void TeacherCore::AdmitStream(StreamSession* session, const std::string& bearer_token,
                              std::function<void(absl::Status)> done) {
  Admit(bearer_token, session->peer(),
        [this, session, done = std::move(done)](absl::Status verdict) {
          if (verdict.ok()) verdict = CountStream(session);
          done(std::move(verdict));
        });
}

absl::Status TeacherCore::CountStream(StreamSession* session) {
  absl::Status over;
  {
    absl::MutexLock lock(&mu_);
    // A call over before its verdict came counts for nothing (Begin then
    // starts nothing either).
    if (!sessions_.contains(session)) return absl::OkStatus();
    const std::string host = PeerLimiter::PeerHost(session->peer());
    auto it = admitted_per_host_.find(host);
    const int from_host = it == admitted_per_host_.end() ? 0 : it->second;
    if (static_cast<int64_t>(admitted_.size()) >= options_.max_streams) {
      over = absl::ResourceExhaustedError(
          absl::StrFormat("the teacher has %d streams open, its limit (serve --max-streams); "
                          "retry later",
                          options_.max_streams));
    } else if (from_host >= options_.max_streams_per_peer) {
      over = absl::ResourceExhaustedError(
          absl::StrFormat("%s has %d streams open to this teacher, the limit per address (serve "
                          "--max-streams-per-peer); close one or retry later",
                          host, options_.max_streams_per_peer));
    } else {
      admitted_.insert(session);
      ++admitted_per_host_[host];
      return absl::OkStatus();
    }
  }
  absl::MutexLock lock(&stats_mu_);
  ++stats_.streams_refused_over_limit;
  return over;
}

void TeacherCore::Admit(const std::string& bearer_token, const std::string& peer,
                        std::function<void(absl::Status)> done) {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return done(absl::UnavailableError("the teacher is shutting down"));
  }
  if (!options_.authorize) return done(absl::OkStatus());
  std::string host = PeerLimiter::PeerHost(peer);
  // Only refusals are limited, never a right token: a NAT or a node shares
  // its address among clients, and one client's wrong tokens must not lock
  // the others out. A peer past its limit of refusals still gets a token
  // the teacher knows at once; anything else it presents is refused
  // RESOURCE_EXHAUSTED at once and never waits.
  absl::Status over_limit = peer_limiter_.Admit(host, clock().Now());
  // The verdict may come at once (a known token) or later (a token the
  // teacher has not heard of yet). Only a later one counts against the
  // peer's limit of pending calls; a peer over it is refused at once and
  // the late verdict is dropped. Whichever comes first decides.
  struct Decision {
    absl::Mutex mu;
    bool decided ABSL_GUARDED_BY(mu) = false;
    bool pending ABSL_GUARDED_BY(mu) = false;
  };
  auto decision = std::make_shared<Decision>();
  options_.authorize(bearer_token, [this, host, decision, done](absl::Status verdict) {
    bool pending = false;
    {
      absl::MutexLock lock(&decision->mu);
      if (decision->decided) return;
      decision->decided = true;
      pending = decision->pending;
    }
    if (pending) peer_limiter_.RemovePending(host);
    if (!verdict.ok()) {
      absl::Status limited = peer_limiter_.Refused(host, clock().Now());
      if (!limited.ok()) verdict = std::move(limited);
    }
    done(std::move(verdict));
  });
  {
    absl::MutexLock lock(&decision->mu);
    if (decision->decided) return;
    if (over_limit.ok()) over_limit = peer_limiter_.AddPending(host);
    if (over_limit.ok()) {
      decision->pending = true;
      return;
    }
    decision->decided = true;
  }
  done(std::move(over_limit));
}

void TeacherCore::SessionDone(StreamSession* session) {
  std::shared_ptr<StreamSession> last;  // released after the lock
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  last = std::move(it->second);
  sessions_.erase(it);
  if (admitted_.erase(session) == 0) return;
  auto host = admitted_per_host_.find(PeerLimiter::PeerHost(session->peer()));
  if (host != admitted_per_host_.end() && --host->second == 0) admitted_per_host_.erase(host);
}

void TeacherCore::StartDraining() {
  absl::MutexLock lock(&mu_);
  if (draining_) return;
  draining_ = true;
  SS_LOG_INFO("teacher service: draining {} stream(s)", sessions_.size());
  for (auto& [raw, session] : sessions_) session->Drain();
}

bool TeacherCore::WaitUntilIdle(absl::Duration timeout) {
  const absl::Time deadline = clock().Now() + timeout;
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sessions_.empty(); };
    if (!clock().AwaitWithDeadline(mu_, absl::Condition(&idle), deadline)) return false;
  }
  // Answers queued while draining end at once; one being decoded finishes.
  absl::MutexLock lock(&answers_mu_);
  auto answered = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(answers_mu_) { return answers_pending_ == 0; };
  return clock().AwaitWithDeadline(answers_mu_, absl::Condition(&answered), deadline);
}

// --- Answers ---------------------------------------------------------------------

absl::StatusOr<int64_t> TeacherCore::CheckAnswerRequest(const v1::AnswerRequest& request) const {
  const int64_t length = request.prompt_ids_size();
  if (length < 1 || length >= max_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_ids: ", length, " ids; a prompt has 1 to ", max_tokens_ - 1,
                     " (max_tokens ", max_tokens_, " leaves room for one answer token)"));
  }
  const int64_t vocab = description_.vocab_size();
  for (int64_t i = 0; i < length; ++i) {
    const int32_t id = request.prompt_ids(static_cast<int>(i));
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_ids[", i, "]: ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (request.max_new_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens: ", request.max_new_tokens(), " must be >= 1"));
  }
  if (!(request.temperature() >= 0) || !std::isfinite(request.temperature())) {
    return absl::InvalidArgumentError(absl::StrCat("temperature: ", request.temperature(),
                                                   " must be finite and >= 0 (0: greedy)"));
  }
  return std::min(request.max_new_tokens(), max_tokens_ - length);
}

void TeacherCore::Answer(const v1::AnswerRequest& request, AnswerDone done) {
  if (!description_.answers()) {
    return done(absl::UnimplementedError(
        "this teacher does not answer prompts: its runtime does not decode (answers need "
        "--runtime hf on one rank, no --tp)"));
  }
  absl::StatusOr<int64_t> max_new = CheckAnswerRequest(request);
  if (!max_new.ok()) return done(max_new.status());
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return done(absl::UnavailableError("the teacher is shutting down"));
  }
  std::string key = request.SerializeAsString();
  std::optional<std::vector<int32_t>> kept;  // handed to `done` without the lock
  bool start_stepping = false;
  {
    absl::MutexLock lock(&answers_mu_);
    auto [it, added] = answers_.try_emplace(key);
    if (!added) {
      absl::MutexLock stats_lock(&stats_mu_);
      ++stats_.answers_reused;
    }
    if (added || !it->second.decoded) {
      it->second.waiters.push_back(std::move(done));
    } else {
      kept = it->second.ids;
    }
    if (added) {  // a new answer: it waits for AdvanceAnswers
      ++answers_pending_;
      answers_waiting_.push_back(WaitingAnswer{std::move(key), request, *max_new});
      start_stepping = !stepping_;
      stepping_ = true;
    }
  }
  if (kept.has_value()) return done(*std::move(kept));
  if (start_stepping) {
    batcher_->EnqueueTask([this](TargetRuntime* runtime) { AdvanceAnswers(runtime); });
  }
}

void TeacherCore::AdvanceAnswers(TargetRuntime* runtime) {
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    draining = draining_;
  }
  std::vector<WaitingAnswer> starting;
  {
    absl::MutexLock lock(&answers_mu_);
    if (runtime == nullptr || draining) {
      // Stopping: every answer waiting or under way ends UNAVAILABLE.
      for (WaitingAnswer& waiting : answers_waiting_) starting.push_back(std::move(waiting));
      answers_waiting_.clear();
    } else {
      while (!answers_waiting_.empty() &&
             static_cast<int64_t>(decoding_.size() + starting.size()) < options_.answer_batch) {
        starting.push_back(std::move(answers_waiting_.front()));
        answers_waiting_.pop_front();
      }
    }
  }
  if (runtime == nullptr || draining) {
    const absl::Status stopping = absl::UnavailableError("the teacher is shutting down");
    for (WaitingAnswer& waiting : starting) FinishAnswer(waiting.key, stopping);
    for (DecodingAnswer& answer : decoding_) FinishAnswer(answer.waiting.key, stopping);
    decoding_.clear();
    absl::MutexLock lock(&answers_mu_);
    stepping_ = false;
    return;
  }
  // Answer() is set only for an hf runtime that decodes (Create).
  auto& hf = static_cast<HfRuntime&>(*runtime);
  for (WaitingAnswer& waiting : starting) {
    spec::DecodeOptions options;
    options.max_new_tokens = waiting.max_new;
    options.temperature = waiting.request.temperature();
    options.seed = waiting.request.seed() + static_cast<uint64_t>(waiting.request.sample_id());
    options.stop_ids = answer_stop_ids_;
    DecodingAnswer answer{std::move(waiting), std::make_unique<AnswerDecoder>(std::move(options))};
    const v1::AnswerRequest& request = answer.waiting.request;
    const absl::Status started = answer.decoder->Start(
        hf, std::vector<int32_t>(request.prompt_ids().begin(), request.prompt_ids().end()));
    if (!started.ok()) {
      FinishAnswer(answer.waiting.key, started);
    } else {
      decoding_.push_back(std::move(answer));
    }
  }
  // One token more for every answer under way, in one batched step.
  std::vector<AnswerDecoder*> decoders;
  int64_t rows = 0;
  for (DecodingAnswer& answer : decoding_) {
    decoders.push_back(answer.decoder.get());
    rows += answer.decoder->done() ? 0 : 1;
  }
  const absl::Status stepped = StepAnswers(hf, decoders);
  if (rows > 0) {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.answer_steps;
    stats_.answer_step_rows += rows;
  }
  for (auto it = decoding_.begin(); it != decoding_.end();) {
    if (!stepped.ok() || it->decoder->done()) {
      if (stepped.ok()) {
        SS_LOG_DEBUG("teacher service: answered sample {}: {} token(s) after {} prompt token(s)",
                     it->waiting.request.sample_id(), it->decoder->tokens().size(),
                     it->waiting.request.prompt_ids_size());
      }
      FinishAnswer(it->waiting.key,
                   stepped.ok() ? absl::StatusOr<std::vector<int32_t>>(it->decoder->tokens())
                                : absl::StatusOr<std::vector<int32_t>>(stepped));
      it = decoding_.erase(it);
    } else {
      ++it;
    }
  }
  bool more;
  {
    absl::MutexLock lock(&answers_mu_);
    more = !decoding_.empty() || !answers_waiting_.empty();
    stepping_ = more;
  }
  if (more) batcher_->EnqueueTask([this](TargetRuntime* next) { AdvanceAnswers(next); });
}

void TeacherCore::FinishAnswer(const std::string& key,
                               const absl::StatusOr<std::vector<int32_t>>& result) {
  if (result.ok()) {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.answers_decoded;
  }
  std::vector<AnswerDone> waiters;
  {
    absl::MutexLock lock(&answers_mu_);
    auto it = answers_.find(key);
    waiters.swap(it->second.waiters);
    if (result.ok() && options_.answer_cache_tokens > 0) {
      it->second.decoded = true;
      it->second.ids = *result;
      answers_kept_order_.push_back(key);
      answers_kept_tokens_ += static_cast<int64_t>(result->size());
      while (answers_kept_tokens_ > options_.answer_cache_tokens) {
        auto oldest = answers_.find(answers_kept_order_.front());
        answers_kept_tokens_ -= static_cast<int64_t>(oldest->second.ids.size());
        answers_.erase(oldest);
        answers_kept_order_.pop_front();
      }
    } else {
      answers_.erase(it);
    }
    --answers_pending_;
  }
  for (AnswerDone& done : waiters) done(result);
}

void TeacherCore::Stop() {
  if (batcher_ != nullptr) batcher_->Stop();
}

TeacherCore::Stats TeacherCore::stats() const {
  bool draining;
  int64_t open_streams;
  {
    absl::MutexLock lock(&mu_);
    draining = draining_;
    open_streams = static_cast<int64_t>(admitted_.size());
  }
  absl::MutexLock lock(&stats_mu_);
  Stats stats = stats_;
  stats.forward_calls = batcher_ != nullptr ? batcher_->forward_calls() : 0;
  stats.queued_jobs = batcher_ != nullptr ? batcher_->queued_jobs() : 0;
  stats.draining = draining;
  stats.open_streams = open_streams;
  stats.queued_request_bytes = queue_budget_ != nullptr ? queue_budget_->used() : 0;
  stats.queued_request_bytes_peak = queue_budget_ != nullptr ? queue_budget_->peak() : 0;
  return stats;
}

}  // namespace specstream::teacher
