// Building blocks shared by the ring attentions (context_parallel.cc,
// block_attention.cc): one non-blocking hop of a tensor around a CP group's
// ring, and carrying the group inside an autograd context.
//
// Thread-safety: a RingHop belongs to the thread that started it; distinct
// groups may be used from distinct threads.
#ifndef SPECSTREAM_STUDENT_RING_HOP_H_
#define SPECSTREAM_STUDENT_RING_HOP_H_

#include <vector>

#include <torch/torch.h>

#include "common/torch/compat.h"

namespace specstream::student {

// The group travels in the autograd context as a capsule so that the graph
// keeps it alive until backward. c10d groups are always intrusive_ptr-owned,
// so reclaiming a counted reference from the raw object is safe.
inline c10::IValue GroupCapsule(CommGroup& group) {
  return c10::IValue::make_capsule(c10::intrusive_ptr<CommGroup>::reclaim_copy(&group));
}

inline CommGroup& GroupFromCapsule(const c10::IValue& capsule) {
  return *static_cast<CommGroup*>(capsule.toCapsule().get());
}

// One ring hop: send `out` to the next rank, receive `in` from the previous
// one (non-blocking both ways; Wait() before reusing either buffer). The
// send and the receive go out as one batch where the backend needs it
// (NCCL: one group call, as batch_isend_irecv does; separate point-to-point
// calls there would each wait for their peer, and with cp > 2 the ring would
// deadlock). Gloo's send and recv are asynchronous already.
class RingHop final {
 public:
  RingHop(CommGroup& group, const torch::Tensor& out, torch::Tensor& in, int tag) {
    const int rank = group.getRank(), cp = group.getSize();
    send_buffers_ = {out};
    recv_buffers_ = {in};
    const bool batch = CoalescesPointToPoint(group);
    if (batch) StartCoalescing(group);
    send_ = group.send(send_buffers_, (rank + 1) % cp, tag);
    recv_ = group.recv(recv_buffers_, (rank + cp - 1) % cp, tag);
    if (batch) batch_ = EndCoalescing(group);
  }
  void Wait() {
    if (batch_) {
      batch_->wait();
      return;
    }
    recv_->wait();
    send_->wait();
  }

 private:
  std::vector<torch::Tensor> send_buffers_, recv_buffers_;
  c10::intrusive_ptr<c10d::Work> send_, recv_, batch_;
};

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_RING_HOP_H_
