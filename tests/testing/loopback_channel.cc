#include "tests/testing/loopback_channel.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace specstream::testing {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(5);

// What the two ranks of one id share.
struct Link {
  absl::Mutex mu;
  bool joined[2] ABSL_GUARDED_BY(mu) = {false, false};
  bool closed[2] ABSL_GUARDED_BY(mu) = {false, false};
  std::deque<std::string> pieces ABSL_GUARDED_BY(mu);
  absl::Status broken ABSL_GUARDED_BY(mu);
};

absl::Mutex registry_mu(absl::kConstInit);
absl::flat_hash_map<std::string, std::shared_ptr<Link>>& Registry() {
  static auto* links = new absl::flat_hash_map<std::string, std::shared_ptr<Link>>();
  return *links;
}

class LoopbackChannel final : public PayloadChannel {
 public:
  LoopbackChannel(std::string id, std::shared_ptr<Link> link, PayloadChannelOptions options,
                  std::shared_ptr<LoopbackFaults> faults)
      : id_(std::move(id)),
        link_(std::move(link)),
        options_(std::move(options)),
        faults_(std::move(faults)) {}

  ~LoopbackChannel() override {
    bool both_closed = false;
    {
      absl::MutexLock lock(&link_->mu);
      link_->closed[options_.rank] = true;
      both_closed = link_->closed[0] && link_->closed[1];
    }
    if (both_closed) {
      absl::MutexLock lock(&registry_mu);
      Registry().erase(id_);
    }
  }

  // Waits until `ready` holds (under link->mu); fails on a broken link, a
  // closed peer, the deadline or `stopped`.
  absl::Status WaitUntil(const std::function<bool()>& ready, absl::Time deadline,
                         const char* what) {
    const int peer = 1 - options_.rank;
    while (true) {
      {
        absl::MutexLock lock(&link_->mu);
        auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu) {
          return ready() || !link_->broken.ok() || link_->closed[peer];
        };
        link_->mu.AwaitWithTimeout(absl::Condition(&wake), kPollInterval);
        if (ready()) return absl::OkStatus();
        if (!link_->broken.ok()) return link_->broken;
        if (link_->closed[peer]) {
          return absl::UnavailableError(
              absl::StrCat("loopback channel: the peer left while ", what));
        }
      }
      if (options_.stopped && options_.stopped()) {
        return absl::CancelledError(absl::StrCat("the stream ended while ", what));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("loopback channel: ", what, " timed out"));
      }
    }
  }

  absl::Status Join() {
    {
      absl::MutexLock lock(&link_->mu);
      link_->joined[options_.rank] = true;
    }
    const int peer = 1 - options_.rank;
    return WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return link_->joined[peer]; },
                     absl::Now() + options_.timeout, "joining");
  }

  absl::Status Send(
      uint64_t size,
      const std::function<void(uint64_t offset, uint64_t n, char* dest)>& fill) override {
    const absl::Time deadline = absl::Now() + options_.timeout;
    for (uint64_t offset = 0; offset < size; offset += kLoopbackPieceBytes) {
      std::string piece(std::min(kLoopbackPieceBytes, size - offset), '\0');
      fill(offset, piece.size(), piece.data());
      absl::MutexLock lock(&link_->mu);
      if (!link_->broken.ok()) return link_->broken;
      if (faults_ != nullptr && faults_->break_after_pieces >= 0 &&
          faults_->pieces_sent.fetch_add(1) >= faults_->break_after_pieces) {
        link_->broken = absl::UnavailableError("loopback channel broken by the test");
        return link_->broken;
      }
      link_->pieces.push_back(std::move(piece));
    }
    // Like ncclSend: done once the receiver has every piece.
    return WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return link_->pieces.empty(); },
                     deadline, "sending a payload");
  }

  absl::Status Recv(char* dest, uint64_t size) override {
    const absl::Time deadline = absl::Now() + options_.timeout;
    for (uint64_t received = 0; received < size;) {
      RETURN_IF_ERROR(
          WaitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !link_->pieces.empty(); },
                    deadline, "receiving a payload"));
      absl::MutexLock lock(&link_->mu);
      std::string piece = std::move(link_->pieces.front());
      link_->pieces.pop_front();
      if (piece.size() > size - received) {
        link_->broken = absl::DataLossError("loopback channel: a piece past the payload's end");
        return link_->broken;
      }
      std::memcpy(dest + received, piece.data(), piece.size());
      received += piece.size();
    }
    return absl::OkStatus();
  }

  void set_timeout(absl::Duration timeout) override {
    if (timeout > absl::ZeroDuration()) options_.timeout = timeout;
  }

 private:
  const std::string id_;
  std::shared_ptr<Link> link_;
  PayloadChannelOptions options_;
  std::shared_ptr<LoopbackFaults> faults_;
};

}  // namespace

PayloadChannelFactory LoopbackChannelFactory(std::shared_ptr<LoopbackFaults> faults) {
  PayloadChannelFactory factory;
  factory.new_id = []() -> absl::StatusOr<std::string> {
    static std::atomic<uint64_t> next{1};
    std::string id(kPayloadChannelIdBytes, '\0');
    const std::string tag =
        absl::StrCat("loopback-", next.fetch_add(1), "-", absl::ToUnixNanos(absl::Now()));
    std::memcpy(id.data(), tag.data(), std::min(tag.size(), id.size()));
    return id;
  };
  factory.join =
      [faults](absl::string_view id,
               PayloadChannelOptions options) -> absl::StatusOr<std::unique_ptr<PayloadChannel>> {
    if (id.size() != kPayloadChannelIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat("loopback channel id: ", id.size(), " bytes"));
    }
    std::shared_ptr<Link> link;
    {
      absl::MutexLock lock(&registry_mu);
      std::shared_ptr<Link>& slot = Registry()[std::string(id)];
      if (slot == nullptr) slot = std::make_shared<Link>();
      link = slot;
    }
    std::shared_ptr<LoopbackFaults> sender_faults = options.rank == 0 ? faults : nullptr;
    auto channel = std::make_unique<LoopbackChannel>(std::string(id), std::move(link),
                                                     std::move(options), std::move(sender_faults));
    absl::Status joined = channel->Join();
    if (!joined.ok()) return joined;
    return std::unique_ptr<PayloadChannel>(std::move(channel));
  };
  return factory;
}

}  // namespace specstream::testing
