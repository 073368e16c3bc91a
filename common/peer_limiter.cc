#include "common/peer_limiter.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specstream {

std::string PeerLimiter::PeerHost(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  const size_t bracket = peer.rfind(']');
  // "ipv4:host:port" and "ipv6:[addr]:port" end in ":port"; "ipv4:host" and
  // "unix:/path" have no port to drop.
  if (colon == absl::string_view::npos || colon == peer.find(':')) return std::string(peer);
  if (bracket != absl::string_view::npos && colon < bracket) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

void PeerLimiter::ExpireLocked(Peer& peer, absl::Time now) const {
  while (!peer.failures.empty() && now - peer.failures.front() >= options_.window) {
    peer.failures.pop_front();
  }
}

absl::Status PeerLimiter::Admit(const std::string& host, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(host);
  if (it == peers_.end()) return absl::OkStatus();
  Peer& peer = it->second;
  ExpireLocked(peer, now);
  if (static_cast<int>(peer.failures.size()) >= options_.max_failures) {
    return absl::ResourceExhaustedError(
        absl::StrCat(host, ": ", peer.failures.size(), " refused attempts in the last ",
                     absl::FormatDuration(options_.window), "; retry in ",
                     absl::FormatDuration(peer.failures.front() + options_.window - now)));
  }
  ForgetIdleLocked(it, now);
  return absl::OkStatus();
}

absl::Status PeerLimiter::AddPending(const std::string& host) {
  absl::MutexLock lock(&mu_);
  Peer& peer = peers_[host];
  if (peer.pending >= options_.max_pending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        host, ": ", peer.pending, " attempts are still being authenticated (the limit)"));
  }
  ++peer.pending;
  return absl::OkStatus();
}

void PeerLimiter::RemovePending(const std::string& host) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(host);
  if (it != peers_.end() && it->second.pending > 0) --it->second.pending;
}

absl::Status PeerLimiter::Refused(const std::string& host, absl::Time now) {
  RETURN_IF_ERROR(Admit(host, now));
  absl::MutexLock lock(&mu_);
  auto it = peers_.try_emplace(host).first;
  it->second.failures.push_back(now);
  ExpireLocked(it->second, now);
  ForgetIdleLocked(it, now);
  return absl::OkStatus();
}

void PeerLimiter::ForgetIdleLocked(absl::flat_hash_map<std::string, Peer>::iterator it,
                                   absl::Time now) {
  ExpireLocked(it->second, now);
  if (it->second.pending == 0 && it->second.failures.empty()) peers_.erase(it);
  if (peers_.size() <= 1024) return;
  for (auto p = peers_.begin(); p != peers_.end();) {
    ExpireLocked(p->second, now);
    if (p->second.pending == 0 && p->second.failures.empty()) {
      peers_.erase(p++);
    } else {
      ++p;
    }
  }
}

size_t PeerLimiter::peers() const {
  absl::MutexLock lock(&mu_);
  return peers_.size();
}

}  // namespace specstream
