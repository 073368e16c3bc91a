#include "teacher/queue_budget.h"

namespace specstream::teacher {

int64_t QueuedRequestBytes(const v1::StreamRequest::SampleRequest& request) {
  return static_cast<int64_t>(request.token_ids_size()) * static_cast<int64_t>(sizeof(int32_t)) +
         static_cast<int64_t>(request.loss_mask().size()) + kQueuedRequestOverheadBytes;
}

bool QueueBudget::TryCharge(int64_t bytes) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ - used) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (used + bytes > peak &&
         !peak_.compare_exchange_weak(peak, used + bytes, std::memory_order_relaxed)) {
  }
  return true;
}

void QueueBudget::Release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

}  // namespace specstream::teacher
