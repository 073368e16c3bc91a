// A capped exponential backoff, the one schedule every retry loop uses: the
// delay before the next try starts at `first`, doubles after each failure up
// to `max`, and starts over after a success. Callers add their own jitter
// where many peers retry at once (the online source).
//
// Thread-compatible: one loop owns one Backoff.
#ifndef SPECSTREAM_COMMON_BACKOFF_H_
#define SPECSTREAM_COMMON_BACKOFF_H_

#include <algorithm>

#include "absl/time/time.h"

namespace specstream {

class Backoff {
 public:
  constexpr Backoff(absl::Duration first, absl::Duration max)
      : first_(first), max_(max), delay_(first) {}

  // The wait before the next try.
  absl::Duration delay() const { return delay_; }
  absl::Duration first() const { return first_; }
  absl::Duration max() const { return max_; }
  // A try failed: the next wait doubles, up to max.
  void Grow() { delay_ = std::min(delay_ * 2, max_); }
  // A try succeeded: the next failure waits `first` again.
  void Reset() { delay_ = first_; }

 private:
  absl::Duration first_;
  absl::Duration max_;
  absl::Duration delay_;
};

// The control plane's schedule: a daemon registering with the coordinator,
// the CLI waiting out a coordinator restart. 0.2 s doubling to 5 s: a
// restart is seen within seconds, and a coordinator that is down is asked
// about once per heartbeat interval.
inline Backoff ControlPlaneBackoff() { return Backoff(absl::Milliseconds(200), absl::Seconds(5)); }

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_BACKOFF_H_
