#include "student/online_source.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/backoff.h"
#include "common/capture_layers.h"
#include "common/chat_template.h"
#include "common/jsonl.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"
#include "common/transport/contract.h"
#include "student/ledger.h"

namespace specstream::student {
namespace {

bool SameRows(const RowRange& a, const RowRange& b) {
  return a.begin == b.begin && a.end == b.end && a.halo_end == b.halo_end;
}

ModelContract ContractOf(const v1::DescribeResponse& response) {
  ModelContract model;
  model.model_type = response.model_type();
  model.hidden_size = response.hidden_size();
  model.vocab_size = response.vocab_size();
  model.num_layers = response.num_layers();
  model.capture_layer_ids.assign(response.capture_layer_ids().begin(),
                                 response.capture_layer_ids().end());
  return model;
}

// Seconds for logs and messages ("60", "0.5").
std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d)); }

}  // namespace

class OnlineSource::Impl final : public TeacherStreamEvents {
 public:
  using Stream = TeacherStream;

  // One sample's progress, keyed by dataset index.
  struct Slot {
    RowRange rows;
    uint64_t request_id = 0;   // outstanding request, 0 when none
    Stream* stream = nullptr;  // the stream serving (or that delivered) it
    absl::StatusOr<TrainingSample> sample = absl::UnavailableError("pending");
    bool ready = false;
    bool delivered = false;  // handed to the trainer; awaiting Commit
    bool parked = false;     // waiting in parked_ for a teacher to come back
  };

  // A teacher a stream was opened to, and its reconnection state.
  struct Teacher {
    // Being reconnected to (its stream was lost, its grace lasts).
    bool reconnecting = false;
    // When it was lost; kept across reconnections until a payload arrives
    // from it again (so a teacher whose new streams keep dying is still
    // given up when its grace ends). InfiniteFuture while healthy.
    absl::Time lost_since = absl::InfiniteFuture();
    absl::Time next_try;
    Backoff backoff{absl::ZeroDuration(), absl::ZeroDuration()};  // set when it is lost
    int attempts = 0;                                             // since lost_since
    absl::Status last_error;  // the last attempt's, named when it is given up
  };

  explicit Impl(OnlineSourceOptions options) : options_(std::move(options)) {}

  ~Impl() override {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      // The reconnector adds no stream once closing_ is set.
      reconnect_cv_.SignalAll();
    }
    if (reconnector_.joinable()) reconnector_.join();
    std::vector<Stream*> streams;
    {
      absl::MutexLock lock(&mu_);
      for (auto& stream : streams_) {
        if (stream->alive()) stream->Cancel();
        streams.push_back(stream.get());
      }
    }
    for (Stream* stream : streams) stream->WaitDone();
  }

  absl::Status Init() {
    RecordOptions record_options;
    std::vector<PromptRecord> prompts;  // data.regenerate
    RETURN_IF_ERROR(
        ForEachJsonLine(options_.data, [&](int64_t, const nlohmann::json& record) -> absl::Status {
          if (options_.regenerate.on) {
            ASSIGN_OR_RETURN(PromptRecord prompt, PromptFromRecord(record, record_options));
            RETURN_IF_ERROR(CheckRoomForAnswer(static_cast<int64_t>(prompt.ids.size()),
                                               options_.max_length, "data.max_length"));
            // The sample's id seeds its answer: the record's "id", else its
            // index among the records (as `dump --regenerate` seeds it).
            if (!prompt.id.has_value()) prompt.id = static_cast<int64_t>(samples_.size());
            prompts.push_back(std::move(prompt));
            samples_.emplace_back();  // the prompt and its answer, once answered
            return absl::OkStatus();
          }
          ASSIGN_OR_RETURN(TokenizedSample sample, SampleFromRecord(record, record_options));
          samples_.push_back(std::move(sample));
          return absl::OkStatus();
        }));
    if (options_.regenerate.on) RETURN_IF_ERROR(CheckRegenerateOptions());
    if (samples_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.tokenized ", options_.data, " holds no samples"));
    }
    if (options_.teachers.empty()) {
      return absl::InvalidArgumentError(
          "data.teachers: at least one teacher address is required (a coordinator fills them in "
          "for jobs submitted to it)");
    }
    if (options_.connector == nullptr) {
      return absl::FailedPreconditionError(
          "data.teachers: this trainer has no teacher connection (OnlineSourceOptions.connector; "
          "specstream-student sets the gRPC one)");
    }
    if (options_.in_flight < 1) {
      return absl::InvalidArgumentError("data.in_flight must be >= 1");
    }
    if (options_.teacher_grace < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("data.teacher_grace_s must be >= 0");
    }
    // Describe every teacher; they must serve the same model. The streams
    // join streams_ (and start) once every teacher has answered.
    std::vector<std::string> errors;
    std::vector<std::unique_ptr<Stream>> opened;
    std::set<std::string> answerers;  // teachers whose Describe says `answers`
    for (size_t i = 0; i < options_.teachers.size(); ++i) {
      // Ranks start on different teachers.
      const std::string& address =
          options_.teachers[(i + options_.rank) % options_.teachers.size()];
      absl::StatusOr<v1::DescribeResponse> described =
          options_.connector->Describe(address, options_.stream.connect_timeout);
      if (!described.ok()) {
        errors.push_back(std::string(described.status().message()));
        SS_LOG_WARN("online: teacher {} did not answer Describe: {}", address,
                    described.status().ToString());
        continue;
      }
      const v1::DescribeResponse& response = *described;
      ASSIGN_OR_RETURN(const ModelContract model, Served(address, response));
      if (response.answers()) answerers.insert(address);
      if (opened.empty()) {
        model_ = model;
        max_tokens_ = response.max_tokens();
      } else if (const std::string field = model_.FirstDifference(model); !field.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("teacher ", address, " serves ", model.ToJson().dump(),
                         " but another serves ", model_.ToJson().dump(), " (", field, ")"));
      }
      TeacherStreamOptions stream_options = options_.stream;
      stream_options.rank = options_.rank;
      stream_options.stream_index = static_cast<int>(opened.size());
      stream_options.capture_layer_ids = options_.capture_layer_ids;
      ASSIGN_OR_RETURN(
          std::unique_ptr<Stream> stream,
          options_.connector->NewStream(address, response, stream_options, mu_, *this));
      SS_LOG_INFO("online: teacher {} on host {}: payloads {} (data.transport {})", address,
                  response.hostname(), v1::Transport_Name(stream->transport()),
                  options_.stream.transport);
      opened.push_back(std::move(stream));
    }
    if (opened.empty()) {
      return absl::UnavailableError(
          absl::StrCat("no teacher answered: ", absl::StrJoin(errors, "; ")));
    }
    if (options_.regenerate.on) RETURN_IF_ERROR(AnswerPrompts(prompts, answerers));
    for (int64_t i = 0; i < static_cast<int64_t>(samples_.size()); ++i) {
      const int64_t len = static_cast<int64_t>(samples_[i].input_ids.size());
      if (max_tokens_ > 0 && len > max_tokens_) {
        return absl::InvalidArgumentError(absl::StrCat(options_.data, ": sample ", i, " has ", len,
                                                       " tokens but the teachers accept at most ",
                                                       max_tokens_, " (data.max_length?)"));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      next_stream_index_ = static_cast<int>(opened.size());
      for (auto& stream : opened) {
        teachers_[stream->address()] = Teacher();
        stream->Start(options_.in_flight);
        streams_.push_back(std::move(stream));
      }
    }
    if (options_.teacher_grace > absl::ZeroDuration()) {
      reconnector_ = std::thread([this] { ReconnectLoop(); });
    }
    if (!options_.ledger.empty()) {
      ASSIGN_OR_RETURN(ledger_, Ledger::Open(options_.ledger, options_.rank));
    }
    // Whether payloads carry target_ids: learnt from the first sample.
    ASSIGN_OR_RETURN(TrainingSample first, Fetch(0, Whole(0)));
    has_target_ids_ = first.target_ids.defined();
    hidden_dtype_ = first.aux_hidden.scalar_type();
    Release(0);
    return absl::OkStatus();
  }

  absl::Status CheckRegenerateOptions() const {
    const RegenerateOptions& r = options_.regenerate;
    if (r.max_new_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.regenerate.max_new_tokens: ", r.max_new_tokens, " must be >= 1"));
    }
    if (!(r.temperature >= 0) || !std::isfinite(r.temperature)) {
      return absl::InvalidArgumentError(absl::StrCat("data.regenerate.temperature: ", r.temperature,
                                                     " must be finite and >= 0 (0: greedy)"));
    }
    return absl::OkStatus();
  }

  // data.regenerate: every prompt's answer from the teachers that give them
  // (OnlineSourceOptions' comment says how), one worker per teacher; then
  // samples_ holds each prompt and its answer.
  absl::Status AnswerPrompts(const std::vector<PromptRecord>& prompts,
                             const std::set<std::string>& answerers) {
    std::vector<std::string> teachers;  // in the job's order, the same on every rank
    for (const std::string& address : options_.teachers) {
      if (answerers.count(address) > 0 &&
          std::find(teachers.begin(), teachers.end(), address) == teachers.end()) {
        teachers.push_back(address);
      }
    }
    if (teachers.empty()) {
      return absl::FailedPreconditionError(
          "data.regenerate: no teacher answers prompts (answers need a teacher serving with "
          "--runtime hf on one rank, no --tp)");
    }
    const int64_t n = static_cast<int64_t>(prompts.size());
    const RegenerateOptions& r = options_.regenerate;
    SS_LOG_INFO(
        "online: regenerating {} answer(s) (at most {} tokens, temperature {}, seed {}) "
        "on {} teacher(s)",
        n, r.max_new_tokens, r.temperature, r.seed, teachers.size());
    struct Work {
      absl::Mutex mu;
      std::vector<std::deque<int64_t>> own ABSL_GUARDED_BY(mu);  // per teacher
      std::vector<bool> given_up ABSL_GUARDED_BY(mu);            // per teacher
      std::deque<int64_t> orphans ABSL_GUARDED_BY(mu);           // those of teachers given up
      int64_t asking ABSL_GUARDED_BY(mu) = 0;                    // requests in flight
      int64_t answered ABSL_GUARDED_BY(mu) = 0;
      int64_t answer_tokens ABSL_GUARDED_BY(mu) = 0;
      absl::Status failed ABSL_GUARDED_BY(mu);
      std::vector<std::string> lost ABSL_GUARDED_BY(mu);  // why each given-up teacher was
    } work;
    {
      absl::MutexLock lock(&work.mu);
      work.own.resize(teachers.size());
      work.given_up.assign(teachers.size(), false);
      for (int64_t i = 0; i < n; ++i) work.own[i % teachers.size()].push_back(i);
    }
    std::vector<std::vector<int32_t>> answers(n);
    const absl::Time start = clock().Now();
    absl::Time next_report = start + absl::Seconds(10);
    auto worker = [&](size_t t) {
      while (true) {
        int64_t i;
        {
          // A worker whose own prompts are done waits while others still
          // decode: a teacher that fails then leaves it its prompts.
          absl::MutexLock lock(&work.mu);
          auto ready = [&work, t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(work.mu) {
            return !work.failed.ok() || !work.own[t].empty() || !work.orphans.empty() ||
                   work.asking == 0;
          };
          work.mu.Await(absl::Condition(&ready));
          std::deque<int64_t>& queue = !work.own[t].empty() ? work.own[t] : work.orphans;
          if (!work.failed.ok() || work.given_up[t] || queue.empty()) return;
          i = queue.front();
          queue.pop_front();
          ++work.asking;
        }
        v1::AnswerRequest request;
        request.set_sample_id(*prompts[i].id);
        request.mutable_prompt_ids()->Add(prompts[i].ids.begin(), prompts[i].ids.end());
        request.set_max_new_tokens(r.max_new_tokens);
        request.set_temperature(r.temperature);
        request.set_seed(r.seed);
        absl::StatusOr<std::vector<int32_t>> answer =
            options_.connector->Answer(teachers[t], request, options_.stream.sample_timeout);
        absl::MutexLock lock(&work.mu);
        --work.asking;
        if (answer.ok()) {
          work.answer_tokens += static_cast<int64_t>(answer->size());
          answers[i] = *std::move(answer);
          ++work.answered;
          if (const absl::Time now = clock().Now(); now >= next_report || work.answered == n) {
            next_report = now + absl::Seconds(10);
            SS_LOG_INFO("online: {}/{} answers ({:.1f} tokens each), {:.0f} s", work.answered, n,
                        static_cast<double>(work.answer_tokens) / work.answered,
                        absl::ToDoubleSeconds(now - start));
          }
          continue;
        }
        const absl::StatusCode code = answer.status().code();
        if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded &&
            code != absl::StatusCode::kCancelled && code != absl::StatusCode::kResourceExhausted) {
          if (work.failed.ok()) {
            work.failed =
                absl::Status(code, absl::StrCat("data.regenerate: teacher ", teachers[t],
                                                " refused the prompt of sample ", *prompts[i].id,
                                                " (record ", i, "): ", answer.status().message()));
          }
          return;
        }
        // The teacher is given up for answers; what it still had goes to
        // the others (the same answers: they are deterministic).
        work.orphans.push_back(i);
        ++answers_retried_;
        if (!work.given_up[t]) {
          work.given_up[t] = true;
          SS_LOG_WARN("online: teacher {} failed an answer ({}); its prompts go to the others",
                      teachers[t], answer.status().ToString());
          work.lost.push_back(std::string(answer.status().message()));
          for (int64_t rest : work.own[t]) work.orphans.push_back(rest);
          answers_retried_ += static_cast<int64_t>(work.own[t].size());
          work.own[t].clear();
        }
        return;
      }
    };
    // in_flight requests per teacher, as its credits: a teacher decodes the
    // answers it is asked at once together (serve --answer-batch).
    std::vector<std::thread> workers;
    for (size_t t = 0; t < teachers.size(); ++t) {
      for (int64_t k = 0; k < options_.in_flight; ++k) workers.emplace_back(worker, t);
    }
    for (std::thread& thread : workers) thread.join();
    absl::MutexLock lock(&work.mu);
    RETURN_IF_ERROR(work.failed);
    if (work.answered < n) {
      return absl::UnavailableError(
          absl::StrCat("data.regenerate: ", n - work.answered,
                       " prompt(s) unanswered: every teacher that answers failed (",
                       absl::StrJoin(work.lost, "; "), ")"));
    }
    for (int64_t i = 0; i < n; ++i) {
      samples_[i] = AnsweredSample(prompts[i].ids, answers[i], options_.max_length);
    }
    return absl::OkStatus();
  }

  // Acknowledges delivered samples to their teachers (their credits return)
  // and forgets them.
  void Release(const std::vector<int64_t>& indices) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::map<Stream*, v1::StreamRequest> acks;
    for (int64_t index : indices) {
      auto it = slots_.find(index);
      if (it == slots_.end() || !it->second.delivered) continue;
      if (it->second.stream != nullptr && it->second.stream->alive()) {
        acks[it->second.stream].mutable_ack()->add_sample_ids(index);
      }
      slots_.erase(it);
    }
    for (auto& [stream, ack] : acks) stream->Send(ack);
  }
  void Release(int64_t index) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Release(std::vector<int64_t>{index});
  }

  RowRange Whole(int64_t index) const {
    const int64_t len = static_cast<int64_t>(samples_[index].input_ids.size());
    return RowRange{0, len, len};
  }

  // Rows clipped to the sample (so every way of asking for the same rows
  // compares equal).
  RowRange Clip(int64_t index, const RowRange& rows) const {
    const int64_t len = static_cast<int64_t>(samples_[index].input_ids.size());
    return RowRange{rows.begin, std::min(rows.end, len), std::min(rows.halo_end, len)};
  }

  // True when the rows hold nothing of the sample (an empty CP shard).
  bool Empty(int64_t index, const RowRange& rows) const {
    return rows.begin >= static_cast<int64_t>(samples_[index].input_ids.size());
  }

  // Requests `index` (those rows) unless it is already requested or ready
  // with the same rows.
  void Want(int64_t index, const RowRange& wanted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (Empty(index, wanted)) return;
    const RowRange rows = Clip(index, wanted);
    Slot& slot = slots_[index];
    if ((slot.request_id != 0 || slot.ready || slot.parked) && SameRows(slot.rows, rows)) return;
    if (slot.request_id != 0) requests_.erase(slot.request_id);
    slot = Slot();
    slot.rows = rows;
    Send(index, slot);
  }

  // Sends the request for a slot to the next live stream (round robin).
  void Send(int64_t index, Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Stream* stream = nullptr;
    for (size_t i = 0; i < streams_.size() && stream == nullptr; ++i) {
      Stream* candidate = streams_[(next_stream_ + i) % streams_.size()].get();
      if (candidate->alive()) stream = candidate;
    }
    ++next_stream_;
    if (stream == nullptr) {
      if (!closing_ && gone_.ok() && options_.teacher_grace > absl::ZeroDuration()) {
        // A lost teacher may come back within its grace: the sample waits
        // for it (Unpark), or fails with the rest when none will
        // (FailParkedIfEveryTeacherIsGone, after every loss and give-up).
        slot.parked = true;
        parked_.push_back(index);
        return;
      }
      slot.sample = gone_.ok() ? GoneError() : gone_;
      slot.ready = true;
      cv_.SignalAll();
      return;
    }
    const TokenizedSample& s = samples_[index];
    const int64_t len = static_cast<int64_t>(s.input_ids.size());
    v1::StreamRequest request;
    auto* sample = request.mutable_sample();
    slot.request_id = ++last_request_id_;
    slot.stream = stream;
    sample->set_request_id(slot.request_id);
    sample->set_sample_id(index);
    sample->mutable_token_ids()->Add(s.input_ids.begin(), s.input_ids.end());
    sample->set_loss_mask(std::string(s.loss_mask.begin(), s.loss_mask.end()));
    const int64_t end = std::min(slot.rows.end, len);
    if (!(slot.rows.begin == 0 && end == len && slot.rows.halo_end >= len)) {
      sample->set_slice_begin(slot.rows.begin);
      sample->set_slice_end(end);
      sample->set_halo_after(std::max<int64_t>(0, std::min(slot.rows.halo_end, len) - end));
    }
    requests_[slot.request_id] = index;
    stream->Send(request);
  }

  // --- TeacherStreamEvents (a stream calls them with mu_ held) ---
  // A payload arrived whole and intact.
  void Arrived(uint64_t request_id, const v1::TensorContract& contract, int64_t row_begin,
               const torch::Tensor& payload) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;  // superseded
    // The index is read before the erase: `it` is dangling after it.
    const int64_t index = it->second;
    requests_.erase(it);
    Slot& slot = slots_[index];
    slot.request_id = 0;
    if (slot.stream != nullptr) {
      // Its teacher serves again: a later loss starts a new grace.
      Teacher& teacher = teachers_[slot.stream->address()];
      teacher.lost_since = absl::InfiniteFuture();
      teacher.attempts = 0;
    }
    slot.sample = Decode(index, slot.rows, contract, row_begin, payload);
    slot.ready = true;
    cv_.SignalAll();
  }

  // A request failed. DATA_LOSS and transient codes are retried elsewhere;
  // anything else (a bad request) is final.
  void Failed(uint64_t request_id, const absl::Status& why) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return;
    const int64_t index = it->second;
    requests_.erase(it);
    Slot& slot = slots_[index];
    slot.request_id = 0;
    const bool retry = why.code() == absl::StatusCode::kDataLoss ||
                       why.code() == absl::StatusCode::kUnavailable ||
                       why.code() == absl::StatusCode::kDeadlineExceeded ||
                       why.code() == absl::StatusCode::kResourceExhausted;
    if (slot.stream != nullptr && slot.stream->alive()) {
      // The failed sample's credit returns (an id the teacher never counted
      // is ignored).
      v1::StreamRequest ack;
      ack.mutable_ack()->add_sample_ids(index);
      slot.stream->Send(ack);
    }
    if (retry && !closing_) {
      SS_LOG_WARN("online: sample {} re-requested: {}", index, why.ToString());
      ++refetches_;
      Send(index, slot);
      return;
    }
    slot.sample = why;
    slot.ready = true;
    cv_.SignalAll();
  }

  // Every outstanding request of a lost stream goes to another teacher (or,
  // with none live, waits for one to come back). The teacher is reconnected
  // to while its grace lasts.
  void StreamLost(Stream* stream) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StartReconnecting(stream->address());
    std::vector<uint64_t> lost;
    for (const auto& [request_id, index] : requests_) {
      // A payload the stream's NCCL receiver still takes is not lost.
      if (slots_[index].stream == stream && !stream->Owes(request_id)) {
        lost.push_back(request_id);
      }
    }
    for (uint64_t request_id : lost) {
      Failed(request_id,
             absl::UnavailableError(absl::StrCat("teacher ", stream->address(), " is gone")));
    }
    FailParkedIfEveryTeacherIsGone(GoneError());
    cv_.SignalAll();
  }

  // --- Reconnection ---
  bool AnyLive() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& stream : streams_) {
      if (stream->alive()) return true;
    }
    return false;
  }
  bool LiveTo(const std::string& address) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& stream : streams_) {
      if (stream->alive() && stream->address() == address) return true;
    }
    return false;
  }
  bool Reconnecting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [address, teacher] : teachers_) {
      if (teacher.reconnecting) return true;
    }
    return false;
  }

  absl::Status GoneError() const {
    return absl::UnavailableError(
        absl::StrCat("every teacher is gone for more than data.teacher_grace_s = ",
                     Seconds(options_.teacher_grace), " s"));
  }

  // `d` jittered by +-20% (so that ranks do not retry in lockstep).
  absl::Duration Jittered(absl::Duration d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::uniform_real_distribution<double> factor(0.8, 1.2);
    return d * factor(random_);
  }

  // Schedules a lost teacher's reconnection, unless it has no grace left.
  void StartReconnecting(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closing_ || !gone_.ok() || options_.teacher_grace <= absl::ZeroDuration()) return;
    Teacher& teacher = teachers_[address];
    if (teacher.reconnecting || LiveTo(address)) return;
    const absl::Time now = clock().Now();
    if (teacher.lost_since == absl::InfiniteFuture()) {
      teacher.lost_since = now;
      teacher.backoff = Backoff(options_.reconnect_backoff, options_.reconnect_max_backoff);
      teacher.attempts = 0;
      teacher.last_error = absl::OkStatus();
    }
    const absl::Duration left = teacher.lost_since + options_.teacher_grace - now;
    if (left <= absl::ZeroDuration()) {
      SS_LOG_WARN("online: teacher {} lost again, past data.teacher_grace_s = {} s; given up",
                  address, Seconds(options_.teacher_grace));
      return;
    }
    teacher.reconnecting = true;
    teacher.next_try = now + Jittered(teacher.backoff.delay());
    SS_LOG_WARN("online: teacher {} lost; reconnecting (grace {} s left)", address,
                absl::StrFormat("%.1f", absl::ToDoubleSeconds(left)));
    reconnect_cv_.SignalAll();
  }

  // Stops reconnecting to a teacher (`why`, logged); with no teacher live
  // or coming back, the waiting samples fail with `job_error`.
  void GiveUp(const std::string& address, const absl::Status& why, const absl::Status& job_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    teachers_[address].reconnecting = false;
    SS_LOG_WARN("online: teacher {} given up: {}", address, why.ToString());
    FailParkedIfEveryTeacherIsGone(job_error);
  }

  // With no teacher live or coming back, every waiting sample fails with
  // `why`, and so does every later one (gone_).
  void FailParkedIfEveryTeacherIsGone(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (AnyLive() || Reconnecting() || closing_) return;
    if (gone_.ok()) gone_ = why;
    for (int64_t index : std::exchange(parked_, {})) {
      auto it = slots_.find(index);
      if (it == slots_.end() || !it->second.parked) continue;
      it->second.parked = false;
      it->second.sample = gone_;
      it->second.ready = true;
    }
    cv_.SignalAll();
  }

  // Requests the samples that waited for a teacher, in the order they were
  // parked (each once: a slot re-requested meanwhile is no longer parked).
  void Unpark() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int64_t index : std::exchange(parked_, {})) {
      auto it = slots_.find(index);
      if (it == slots_.end() || !it->second.parked) continue;
      it->second.parked = false;
      Send(index, it->second);
    }
  }

  // What the teacher that answered `response` serves this source: its model,
  // with the capture layers asked for (options_.capture_layer_ids) when
  // there are any. InvalidArgument for ids the model does not have;
  // FailedPrecondition for a teacher that serves only its own set, and
  // another one; both name capture_layer_ids.
  absl::StatusOr<ModelContract> Served(const std::string& address,
                                       const v1::DescribeResponse& response) const {
    ModelContract model = ContractOf(response);
    const CaptureLayerIds& wanted = options_.capture_layer_ids;
    if (wanted.empty()) return model;
    RETURN_IF_ERROR(Annotate(
        ValidateCaptureLayerIds(wanted, model.num_layers, "capture_layer_ids"),
        absl::StrCat("teacher ", address, " serves a ", model.num_layers, "-layer target")));
    if (!response.per_stream_capture_layers() && model.capture_layer_ids != wanted) {
      return absl::FailedPreconditionError(absl::StrCat(
          "capture_layer_ids: ", CaptureLayerIdsString(wanted), " asked for, but teacher ", address,
          " serves only its own capture layers [", absl::StrJoin(model.capture_layer_ids, ", "),
          "] (it predates per-stream capture layers): upgrade the teacher, or restart it with "
          "--capture-layers ",
          absl::StrJoin(wanted, ","), " --capture-for any"));
    }
    model.capture_layer_ids = wanted;
    return model;
  }

  // Describe (the same model as the others), then a new stream.
  absl::StatusOr<std::unique_ptr<Stream>> Connect(const std::string& address,
                                                  absl::Duration timeout, int stream_index)
      ABSL_LOCKS_EXCLUDED(mu_) {
    ASSIGN_OR_RETURN(v1::DescribeResponse response, options_.connector->Describe(address, timeout));
    ASSIGN_OR_RETURN(const ModelContract model, Served(address, response));
    if (const std::string field = model_.FirstDifference(model); !field.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("teacher ", address, " came back serving ", model.ToJson().dump(),
                       " but the job trains on ", model_.ToJson().dump(), " (", field, ")"));
    }
    TeacherStreamOptions stream_options = options_.stream;
    stream_options.rank = options_.rank;
    stream_options.stream_index = stream_index;
    stream_options.capture_layer_ids = options_.capture_layer_ids;
    return options_.connector->NewStream(address, response, stream_options, mu_, *this);
  }

  // The reconnector thread: retries lost teachers when due, gives up on
  // those past their grace. Holds mu_ except while connecting.
  void ReconnectLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    mu_.Lock();
    while (!closing_) {
      const absl::Time now = clock().Now();
      std::string due;
      absl::Time wake = absl::InfiniteFuture();
      for (auto& [address, teacher] : teachers_) {
        if (!teacher.reconnecting) continue;
        const absl::Time expiry = teacher.lost_since + options_.teacher_grace;
        if (now >= expiry) {
          GiveUp(address,
                 absl::UnavailableError(absl::StrCat(
                     "not back within data.teacher_grace_s = ", Seconds(options_.teacher_grace),
                     " s (", teacher.attempts, " attempts",
                     teacher.last_error.ok() ? "" : "; the last: ",
                     teacher.last_error.ok() ? "" : teacher.last_error.ToString(), ")")),
                 GoneError());
          continue;
        }
        if (due.empty() && teacher.next_try <= now) due = address;
        wake = std::min({wake, teacher.next_try, expiry});
      }
      if (due.empty()) {
        clock().WaitWithDeadline(reconnect_cv_, mu_, wake);
        continue;
      }
      Teacher& teacher = teachers_[due];
      ++teacher.attempts;
      const absl::Duration left = teacher.lost_since + options_.teacher_grace - now;
      const absl::Duration timeout =
          std::min({options_.stream.connect_timeout,
                    std::max(absl::Seconds(1), teacher.backoff.delay()), left});
      const int stream_index = next_stream_index_++;
      mu_.Unlock();
      absl::StatusOr<std::unique_ptr<Stream>> stream = Connect(due, timeout, stream_index);
      mu_.Lock();
      Teacher& again = teachers_[due];  // (teachers_ only grows here and in Init)
      if (closing_) {
        mu_.Unlock();
        stream = absl::CancelledError("closing");  // destroyed without mu_
        return;
      }
      if (!stream.ok()) {
        const absl::StatusCode code = stream.status().code();
        // UNAUTHENTICATED too is waited out: this teacher took the job's
        // token before, so it restarted, and a teacher under a coordinator
        // learns a running job's token only from the heartbeat after it
        // registers again. A token it never takes again ends with the grace.
        if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded &&
            code != absl::StatusCode::kResourceExhausted && code != absl::StatusCode::kAborted &&
            code != absl::StatusCode::kUnknown && code != absl::StatusCode::kUnauthenticated) {
          // Another model or a transport the pair cannot use
          // (FAILED_PRECONDITION): no retry changes that.
          GiveUp(due, stream.status(), stream.status());
          continue;
        }
        again.last_error = stream.status();
        const absl::Time failed = clock().Now();
        again.backoff.Grow();
        again.next_try = failed + Jittered(again.backoff.delay());
        const absl::Duration grace_left = again.lost_since + options_.teacher_grace - failed;
        SS_LOG_INFO("online: teacher {} not back (attempt {}): {}; grace {} s left", due,
                    again.attempts, stream.status().ToString(),
                    absl::StrFormat("%.1f", absl::ToDoubleSeconds(grace_left)));
        continue;
      }
      again.reconnecting = false;
      ++reconnects_;
      (*stream)->Start(std::max(options_.in_flight, reserved_));
      SS_LOG_INFO(
          "online: teacher {} is back (attempt {}, payloads {}); {} waiting samples "
          "re-requested",
          due, again.attempts, v1::Transport_Name((*stream)->transport()), parked_.size());
      streams_.push_back(*std::move(stream));
      Unpark();
      cv_.SignalAll();
    }
    mu_.Unlock();
  }

  // The payload's tensors as a TrainingSample, converted exactly as
  // StoreSource does (so online and offline training agree bit for bit).
  absl::StatusOr<TrainingSample> Decode(int64_t index, const RowRange& rows,
                                        const v1::TensorContract& contract, int64_t row_begin,
                                        const torch::Tensor& payload) {
    TrainingSample sample;
    sample.id = index;
    sample.length = static_cast<int64_t>(samples_[index].input_ids.size());
    sample.offset = rows.begin;
    if (row_begin != std::min(rows.begin, sample.length)) {
      return absl::DataLossError(absl::StrCat("sample ", index, ": teacher sent rows from ",
                                              row_begin, ", asked from ", rows.begin));
    }
    const int64_t own = std::max<int64_t>(0, std::min(rows.end, sample.length) - row_begin);
    absl::Status status = CatchTorch(absl::StrCat("sample ", index), [&] {
      for (const v1::TensorSpec& spec : contract.tensors()) {
        auto dtype = FromProtoDType(spec.dtype());
        if (!dtype.ok()) {
          // Keeps the code (CatchTorch passes a StatusError's through).
          ThrowIfError(Annotate(dtype.status(), absl::StrCat("tensor ", spec.name())));
        }
        TensorView view;
        view.name = spec.name();
        view.dtype = *dtype;
        view.shape.assign(spec.shape().begin(), spec.shape().end());
        view.nbytes = spec.nbytes();
        torch::Tensor t;
        if (payload.is_cpu()) {
          view.data = payload.data_ptr<uint8_t>() + spec.offset();
          t = BorrowView(view);
        } else {
          // A device payload stays on its device: each tensor's bytes are
          // copied out (aligned for its dtype) and viewed as it.
          t = payload.narrow(0, static_cast<int64_t>(spec.offset()), view.nbytes)
                  .clone()
                  .view(ToTorchDtype(*dtype))
                  .view(view.shape);
        }
        if (spec.name() == "input_ids") sample.input_ids = t.to(torch::kInt64);
        if (spec.name() == "loss_mask") sample.loss_mask = t.to(torch::kUInt8, false, true);
        if (spec.name() == "aux_hidden")
          sample.aux_hidden = t.narrow(0, 0, std::min(own, t.size(0))).clone();
        if (spec.name() == "last_hidden") sample.last_hidden = t.clone();
        if (spec.name() == "target_ids") sample.target_ids = t.to(torch::kInt64);
      }
    });
    if (!status.ok()) return status;
    if (!sample.input_ids.defined() || !sample.loss_mask.defined() ||
        !sample.aux_hidden.defined() || !sample.last_hidden.defined()) {
      return absl::DataLossError(absl::StrCat(
          "sample ", index, ": payload lacks input_ids/loss_mask/aux_hidden/last_hidden"));
    }
    // The contract must carry the layers asked for: n of them, H wide each.
    const int64_t width =
        static_cast<int64_t>(model_.capture_layer_ids.size()) * model_.hidden_size;
    if (sample.aux_hidden.dim() != 2 || sample.aux_hidden.size(1) != width) {
      return absl::FailedPreconditionError(
          absl::StrCat("sample ", index, ": the teacher sent aux_hidden [",
                       absl::StrJoin(ShapeOf(sample.aux_hidden), ", "),
                       "], but capture_layer_ids [", absl::StrJoin(model_.capture_layer_ids, ", "),
                       "] of hidden size ", model_.hidden_size, " need ", width, " columns"));
    }
    return sample;
  }

  // Waits for the sample (requesting it when needed) and hands it over.
  absl::StatusOr<TrainingSample> Fetch(int64_t index, const RowRange& rows)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (index < 0 || index >= static_cast<int64_t>(samples_.size())) {
      return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", samples_.size()));
    }
    if (Empty(index, rows)) return EmptyRows(index, rows);
    absl::MutexLock lock(&mu_);
    Want(index, rows);
    // A sample may also wait out a teacher's grace.
    const absl::Time deadline =
        clock().Now() + options_.stream.sample_timeout + options_.teacher_grace;
    Slot* slot = &slots_[index];
    while (!slot->ready) {
      // WaitWithDeadline is true when the deadline passed.
      if (clock().WaitWithDeadline(cv_, mu_, deadline) && !slots_[index].ready) {
        return absl::DeadlineExceededError(absl::StrCat(
            "sample ", index, " did not arrive within ",
            absl::FormatDuration(options_.stream.sample_timeout + options_.teacher_grace)));
      }
      slot = &slots_[index];
    }
    absl::StatusOr<TrainingSample> sample = std::move(slot->sample);
    slot->ready = false;
    slot->delivered = sample.ok();
    slot->sample = absl::UnavailableError("taken");
    return sample;
  }

  // A CP shard past the sample's end: zero rows, shaped like a payload's.
  absl::StatusOr<TrainingSample> EmptyRows(int64_t index, const RowRange& rows) {
    TrainingSample sample;
    sample.id = index;
    sample.length = static_cast<int64_t>(samples_[index].input_ids.size());
    sample.offset = rows.begin;
    const int64_t hidden = model_.hidden_size;
    const int64_t captures = static_cast<int64_t>(model_.capture_layer_ids.size());
    sample.input_ids = torch::zeros({0}, torch::kInt64);
    sample.loss_mask = torch::zeros({0}, torch::kUInt8);
    sample.aux_hidden = torch::zeros({0, captures * hidden}, hidden_dtype_);
    sample.last_hidden = torch::zeros({0, hidden}, hidden_dtype_);
    if (has_target_ids_) sample.target_ids = torch::zeros({0}, torch::kInt64);
    return sample;
  }

  absl::Status Commit(int64_t step, const std::vector<int64_t>& indices) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Release(indices);
    return ledger_ ? ledger_->Record(step, indices) : absl::OkStatus();
  }

  Env& clock() const { return Env::Or(options_.clock); }

  OnlineSourceOptions options_;
  std::vector<TokenizedSample> samples_;
  ModelContract model_;  // what the first teacher to answer serves (every one must)
  int64_t max_tokens_ = 0;
  bool has_target_ids_ = false;
  torch::ScalarType hidden_dtype_ = torch::kFloat32;
  std::unique_ptr<Ledger> ledger_;

  // Handed to every stream, which makes its events with it held
  // (student/teacher_connection.h).
  absl::Mutex mu_;
  absl::CondVar cv_;  // a slot became ready, or a teacher came back
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  size_t next_stream_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);         // by dataset index
  std::map<uint64_t, int64_t> requests_ ABSL_GUARDED_BY(mu_);  // outstanding request id -> index
  int64_t refetches_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;

  // Reconnection.
  // By address: those a stream was opened to.
  std::map<std::string, Teacher> teachers_ ABSL_GUARDED_BY(mu_);
  // Samples waiting for a teacher to come back, in order.
  std::deque<int64_t> parked_ ABSL_GUARDED_BY(mu_);
  // Set once every teacher is gone for good: what every later sample fails with.
  absl::Status gone_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // the most credits ReserveOutstanding asked for
  int next_stream_index_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> answers_retried_{0};  // AnswerPrompts
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
  absl::CondVar reconnect_cv_;  // a teacher was lost, or the source is closing
  std::thread reconnector_;     // ReconnectLoop, while teacher_grace > 0
};

OnlineSource::OnlineSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OnlineSource::~OnlineSource() = default;

absl::StatusOr<std::unique_ptr<OnlineSource>> OnlineSource::Open(
    const OnlineSourceOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<OnlineSource>(new OnlineSource(std::move(impl)));
}

int64_t OnlineSource::size() const { return static_cast<int64_t>(impl_->samples_.size()); }

absl::StatusOr<TrainingSample> OnlineSource::Get(int64_t index) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  return impl_->Fetch(index, impl_->Whole(index));
}

absl::StatusOr<TrainingSample> OnlineSource::GetRows(int64_t index, const RowRange& rows) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  return impl_->Fetch(index, rows);
}

const ModelContract& OnlineSource::model() const { return impl_->model_; }

int64_t OnlineSource::Length(int64_t index) const {
  return static_cast<int64_t>(impl_->samples_[index].input_ids.size());
}

bool OnlineSource::has_target_ids() const { return impl_->has_target_ids_; }

absl::Status OnlineSource::TokenIds(int64_t index, std::vector<int32_t>* ids,
                                    std::vector<uint8_t>* mask) {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " of ", size()));
  }
  *ids = impl_->samples_[index].input_ids;
  *mask = impl_->samples_[index].loss_mask;
  return absl::OkStatus();
}

void OnlineSource::ReserveOutstanding(int64_t samples) {
  absl::MutexLock lock(&impl_->mu_);
  impl_->reserved_ = std::max(impl_->reserved_, samples);  // for streams opened later
  for (auto& stream : impl_->streams_) {
    if (stream->alive()) stream->GrantUpTo(samples);
  }
}

void OnlineSource::Prefetch(const std::vector<int64_t>& indices, const RowRange& rows) {
  absl::MutexLock lock(&impl_->mu_);
  for (int64_t index : indices) {
    if (index >= 0 && index < size()) impl_->Want(index, rows);
  }
}

absl::Status OnlineSource::Commit(int64_t step, const std::vector<int64_t>& indices) {
  return impl_->Commit(step, indices);
}

int64_t OnlineSource::refetches() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->refetches_;
}

int64_t OnlineSource::answers_retried() const { return impl_->answers_retried_; }

int64_t OnlineSource::reconnects() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->reconnects_;
}

}  // namespace specstream::student
