// One memory budget, in bytes, for the SampleRequests that wait in a
// teacher (read from a stream, not yet submitted to the compute thread),
// shared by every stream of that teacher (P13 item 18). Each stream's own
// max_queued_requests still applies; this bounds their sum, so the number
// of streams no longer multiplies what the teacher holds.
//
// Thread-safety: every method may be called from any thread (one atomic).
// The owner (TeacherCore) outlives every session that charges it.
#ifndef SPECSTREAM_TEACHER_QUEUE_BUDGET_H_
#define SPECSTREAM_TEACHER_QUEUE_BUDGET_H_

#include <atomic>
#include <cstdint>

#include "specstream/v1/teacher.pb.h"

namespace specstream::teacher {

// What one waiting request is charged: 4 bytes per token id, one per loss
// mask byte, and kQueuedRequestOverheadBytes for the rest (the message
// object and its deque slot, the request id in the stream's set). An
// estimate of what the queued copy holds, not an allocator's measure.
inline constexpr int64_t kQueuedRequestOverheadBytes = 256;
int64_t QueuedRequestBytes(const v1::StreamRequest::SampleRequest& request);

class QueueBudget final {
 public:
  // `limit_bytes` > 0.
  explicit QueueBudget(int64_t limit_bytes) : limit_(limit_bytes) {}
  QueueBudget(const QueueBudget&) = delete;
  QueueBudget& operator=(const QueueBudget&) = delete;

  // Charges `bytes` (>= 0) when the total stays within the limit and returns
  // true; otherwise charges nothing and returns false.
  bool TryCharge(int64_t bytes);
  // Returns bytes charged before (every charge is released exactly once).
  void Release(int64_t bytes);

  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  // The most ever charged at once.
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace specstream::teacher

#endif  // SPECSTREAM_TEACHER_QUEUE_BUDGET_H_
