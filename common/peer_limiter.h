// Per-peer limits on work that has not been authenticated yet, so that one
// client cannot turn refusals into a denial of service: after
// `max_failures` refusals within `window` the peer is past its limit
// (Admit) until the oldest of those refusals leaves the window; and at most
// `max_pending` attempts per peer may wait for a verdict that is not
// immediate. Only refusals are limited: a peer past its limit has its
// refused attempts answered RESOURCE_EXHAUSTED (Refused) while its
// authenticated ones are still served, since a shared address (a NAT, a
// node) holds good clients too. The limiter's own refusals are not
// counted as failures. Peers are keyed by host (the port of a gRPC peer
// string dropped), so reconnecting does not reset a peer's count.
//
// Thread-safe. Memory is bounded by the peers seen within one window.
#ifndef SPECSTREAM_COMMON_PEER_LIMITER_H_
#define SPECSTREAM_COMMON_PEER_LIMITER_H_

#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace specstream {

struct PeerLimiterOptions {
  int max_pending = 16;
  int max_failures = 32;
  absl::Duration window = absl::Seconds(10);
};

class PeerLimiter final {
 public:
  explicit PeerLimiter(PeerLimiterOptions options = {}) : options_(options) {}

  // The host of a gRPC peer string: "ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1",
  // "ipv6:[::1]:5000" -> "ipv6:[::1]"; a string without a port is kept.
  static std::string PeerHost(absl::string_view peer);

  // Whether `host` may attempt at all: RESOURCE_EXHAUSTED naming the peer
  // and when to retry once it has `max_failures` refusals in the window.
  absl::Status Admit(const std::string& host, absl::Time now);
  // An attempt of `host` waits for its verdict: OK (it counts until
  // RemovePending), or RESOURCE_EXHAUSTED when `max_pending` already wait.
  absl::Status AddPending(const std::string& host);
  void RemovePending(const std::string& host);
  // An attempt of `host` was refused. OK: the refusal counts, answer it;
  // or, when the peer is already past its limit, the RESOURCE_EXHAUSTED
  // to answer instead (Admit's, not counted).
  absl::Status Refused(const std::string& host, absl::Time now);

  // Peers tracked now (tests).
  size_t peers() const;

 private:
  struct Peer {
    int pending = 0;
    std::deque<absl::Time> failures;  // oldest first, all within the window
  };
  void ExpireLocked(Peer& peer, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `it` when it holds nothing, and (past 1024 peers) every peer that
  // holds nothing any more, so the map stays bounded.
  void ForgetIdleLocked(absl::flat_hash_map<std::string, Peer>::iterator it, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PeerLimiterOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_PEER_LIMITER_H_
