// An in-process PayloadChannel (common/transport/payload_channel.h) for tests: the
// teacher and the student of a TRANSPORT_NCCL stream, both in the test
// process, exchange payloads through a shared queue of pieces instead of
// NCCL, so the stream protocol (join before Opened, headers on the stream,
// payloads out of band, failover when the channel breaks) runs on machines
// without a GPU. It keeps the contract: Join waits for both ranks (with the
// timeout and `stopped`), Send returns once the receiver has taken every
// piece, a closed or broken peer fails the other side with Unavailable.
#ifndef SPECSTREAM_TESTS_TESTING_LOOPBACK_CHANNEL_H_
#define SPECSTREAM_TESTS_TESTING_LOOPBACK_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "common/transport/payload_channel.h"

namespace specstream::testing {

// Fault injection shared by the channels one factory joins.
struct LoopbackFaults {
  // Sends of this many pieces (counted over all channels the factory's
  // rank-0 side joined) succeed; the next breaks its channel (Unavailable on
  // both sides). -1: never.
  std::atomic<int64_t> break_after_pieces{-1};
  std::atomic<int64_t> pieces_sent{0};
};

// Bytes per piece (small, so that test payloads span several).
inline constexpr uint64_t kLoopbackPieceBytes = 4096;

// Channels that meet by id in a process-wide registry. new_id makes fresh
// 128-byte ids.
PayloadChannelFactory LoopbackChannelFactory(std::shared_ptr<LoopbackFaults> faults = nullptr);

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_LOOPBACK_CHANNEL_H_
