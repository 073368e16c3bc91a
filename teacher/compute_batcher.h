// The teacher's compute thread: it owns the target runtime
// (TargetRuntime::Forward is single-threaded), batches the sample requests of
// every stream into Forward calls of at most max_batch_tokens padded tokens,
// turns each capture into its payload (teacher/sample_tensors.h: the same
// tensors, names and dtypes as `dump` stores, with their contract) and hands
// it back to the stream that asked.
//
// Capture layers per stream: each job names the layers its aux_hidden holds
// (empty: the runtime's described set). A batch whose jobs all want the
// same set captures exactly it; a mixed batch captures the ascending union
// of its jobs' layers once, and each sample gets its own layers' columns,
// in its order (copies of the same rows: bitwise what a forward capturing
// only those layers returns).
//
// Thread-safety: Enqueue and Stop may be called from any thread; sinks are
// called on the compute thread, never under the batcher's lock.
#ifndef SPECSTREAM_TEACHER_COMPUTE_BATCHER_H_
#define SPECSTREAM_TEACHER_COMPUTE_BATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/capture_layers.h"
#include "common/dtype.h"
#include "common/transport/payload_sender.h"
#include "specstream/v1/teacher.pb.h"
#include "specstream/v1/tensor.pb.h"

namespace specstream::teacher {

class TargetRuntime;
struct SequenceCapture;

// A computed sample, immutable once built; shared by the stream that sends
// it and by whatever still references its bytes (gRPC's zero-copy slices).
struct ReadySample {
  uint64_t request_id = 0;
  int64_t sample_id = 0;
  int64_t row_begin = 0;  // rows [row_begin, row_end) of the whole sample
  int64_t row_end = 0;
  v1::TensorContract contract;
  // Host segments with a CRC32C in the contract, or (packed_on_device jobs)
  // one packed buffer with a device checksum: on the NCCL device when the
  // target computes on a GPU, else on the host.
  PayloadBytes bytes;
};

// Whoever waits for samples (a stream session).
class SampleSink {
 public:
  virtual ~SampleSink() = default;
  // Lock-free: true once the sink takes nothing more (its jobs are skipped).
  virtual bool ended() const = 0;
  // The sample for `request_id`, or why it could not be computed.
  virtual void Deliver(uint64_t request_id,
                       absl::StatusOr<std::shared_ptr<const ReadySample>> sample) = 0;
};

struct ComputeJob {
  std::shared_ptr<SampleSink> sink;
  v1::StreamRequest::SampleRequest request;
  // The payload is one packed buffer with a device checksum (NCCL streams).
  bool packed_on_device = false;
  // The layers of this sample's aux_hidden, in order (each in [0, L), as
  // the stream's Open was checked); empty: the runtime's described set.
  CaptureLayerIds capture_layer_ids;
};

struct ComputeBatcherOptions {
  DType payload_dtype = DType::kBF16;  // aux_hidden / last_hidden in payloads
  bool keep_target_ids = false;        // send target_ids in every payload
  int64_t max_batch_tokens = 8192;     // padded tokens per Forward call (>= 1)
  int nccl_device = -1;                // where packed device payloads go
  // TeacherServiceOptions::corrupt_payload_for_testing (tests only).
  std::function<void(int64_t sample_id, std::string& payload)> corrupt_payload_for_testing;
};

class ComputeBatcher final {
 public:
  // Starts the compute thread; `runtime` is used only from it from now on
  // and must outlive the batcher.
  ComputeBatcher(TargetRuntime& runtime, ComputeBatcherOptions options);
  // Stop().
  ~ComputeBatcher();
  ComputeBatcher(const ComputeBatcher&) = delete;
  ComputeBatcher& operator=(const ComputeBatcher&) = delete;

  // Queues a job. Sinks take turns: a batch takes one job from each sink
  // with jobs waiting, in the order they first had one, before a second
  // from any (and each sink's own jobs in the order queued). A request
  // therefore waits behind at most one job of every other stream, however
  // many those have queued (P24: 200 streams that never read cannot push an
  // admitted job's sample back by their whole backlog).
  void Enqueue(ComputeJob job);
  // Queues work of another kind on the compute thread (a prompt's answer:
  // TeacherCore::Answer). Tasks and batches take turns: one task, then one
  // batch, while both wait. The task is called with the runtime on the
  // compute thread, or with nullptr (outside any lock, on the thread that
  // called Stop) when Stop drops it, so that whoever waits hears.
  using Task = std::function<void(TargetRuntime* runtime)>;
  void EnqueueTask(Task task);
  // Stops the compute thread after its current batch; jobs still queued are
  // dropped. Idempotent.
  void Stop();
  // Runtime Forward calls so far.
  int64_t forward_calls() const;
  // Jobs waiting for the compute thread (not the batch it is running).
  int64_t queued_jobs() const;

 private:
  void Loop();
  // Runs `batch` through the runtime and hands each result to its sink; a
  // failed batch of several is retried one sample at a time, so one bad
  // sample fails alone.
  void RunBatch(std::deque<ComputeJob>& batch);
  // The job's capture of `want` layers from a forward that captured
  // `captured` (which holds every one of them): the capture itself when
  // they are the same, else a copy of its layers' columns. Internal when
  // aux_hidden is not [T, captured.size() * H].
  absl::StatusOr<SequenceCapture> SelectLayers(const SequenceCapture& capture,
                                               const CaptureLayerIds& captured,
                                               const std::vector<int>& want) const;
  absl::StatusOr<std::shared_ptr<const ReadySample>> BuildSample(
      const v1::StreamRequest::SampleRequest& request, const SequenceCapture& capture,
      bool packed_on_device);

  TargetRuntime& runtime_;
  const ComputeBatcherOptions options_;
  // The jobs that one sink has waiting.
  struct SinkJobs {
    SampleSink* sink = nullptr;
    std::deque<ComputeJob> jobs;
  };
  // Takes the next job in turn order into `batch` unless it would exceed
  // max_batch_tokens (padded); jobs of ended sinks go to `dropped`.
  // Returns false when no job was taken.
  bool TakeNextLocked(std::deque<ComputeJob>& batch, int64_t& longest,
                      std::vector<ComputeJob>& dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases every waiting job (Stop).
  std::vector<ComputeJob> TakeAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  // Sinks with jobs waiting, in turn order (the next batch starts at the
  // front; a sink that gave a job goes to the back), and where each is.
  std::list<SinkJobs> turns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SampleSink*, std::list<SinkJobs>::iterator> by_sink_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // jobs in turns_
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool task_turn_ ABSL_GUARDED_BY(mu_) = true;  // a task goes next when both wait
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t forward_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_COMPUTE_BATCHER_H_
