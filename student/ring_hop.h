// Building blocks shared by the ring attentions (context_parallel.cc,
// block_attention.cc): one non-blocking hop of a tensor around a CP group's
// ring, the forward and backward rings over key/value shards, and carrying
// the group inside an autograd context.
//
// Thread-safety: a RingHop belongs to the thread that started it; distinct
// groups may be used from distinct threads.
#ifndef SPECSTREAM_STUDENT_RING_HOP_H_
#define SPECSTREAM_STUDENT_RING_HOP_H_

#include <functional>
#include <memory>
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

// The forward ring over key/value shards (kv: [2, ...], this rank's keys
// and values): visit(kv, src) runs once for each rank's shard, this rank's
// own first (at hop s the shard of rank src = rank - s is at hand) while
// the next one is on its way. Tags [tag_base, tag_base + cp). A null group:
// one visit of the local shard (src 0).
inline void RingForward(CommGroup* group, torch::Tensor kv, int64_t tag_base,
                        const std::function<void(const torch::Tensor& kv, int src)>& visit) {
  const int rank = group != nullptr ? group->getRank() : 0;
  const int cp = group != nullptr ? group->getSize() : 1;
  for (int s = 0; s < cp; ++s) {
    torch::Tensor next;
    std::unique_ptr<RingHop> hop;
    if (s + 1 < cp) {
      next = torch::empty_like(kv);
      hop = std::make_unique<RingHop>(*group, kv, next, static_cast<int>(tag_base + s));
    }
    visit(kv, (rank - s + cp) % cp);
    if (hop) {
      hop->Wait();
      kv = next;
    }
  }
}

// The backward ring: visit(kv, src, dkv) adds this rank's contributions to
// the gradient of shard src into dkv, the accumulator that travels with the
// shard (after hop s it holds ranks src..src+s's contributions; the last
// hop hands it to its owner). Returns the gradient of this rank's shard in
// `accumulate`. Tags: keys and values [tag_base + cp, tag_base + 2cp),
// accumulators [tag_base + 2cp, tag_base + 3cp).
inline torch::Tensor RingBackward(
    CommGroup* group, torch::Tensor kv, torch::ScalarType accumulate, int64_t tag_base,
    const std::function<void(const torch::Tensor& kv, int src, torch::Tensor& dkv)>& visit) {
  const int rank = group != nullptr ? group->getRank() : 0;
  const int cp = group != nullptr ? group->getSize() : 1;
  torch::Tensor dkv = torch::zeros(kv.sizes(), kv.options().dtype(accumulate));
  for (int s = 0; s < cp; ++s) {
    torch::Tensor next;
    std::unique_ptr<RingHop> kv_hop;
    if (s + 1 < cp) {
      next = torch::empty_like(kv);
      kv_hop = std::make_unique<RingHop>(*group, kv, next, static_cast<int>(tag_base + cp + s));
    }
    visit(kv, (rank - s + cp) % cp, dkv);
    if (cp > 1) {
      torch::Tensor dkv_next = torch::empty_like(dkv);
      RingHop dkv_hop(*group, dkv, dkv_next, static_cast<int>(tag_base + 2 * cp + s));
      dkv_hop.Wait();
      dkv = dkv_next;
    }
    if (kv_hop) {
      kv_hop->Wait();
      kv = next;
    }
  }
  return dkv;
}

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_RING_HOP_H_
