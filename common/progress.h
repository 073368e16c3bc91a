// Progress for long work: a one-line bar redrawn in place on a terminal
// (items, rate, ETA), or a log line every `log_every` seconds otherwise.
//
//   ProgressOptions options;
//   options.total = n;
//   options.unit = "samples";
//   ProgressReporter progress(options);
//   progress.Update(done, tokens_done);   // cheap: redraws at most 10×/s
//   progress.Finish();
//
// Not thread-safe: one owner updates it.
#ifndef SPECSTREAM_COMMON_PROGRESS_H_
#define SPECSTREAM_COMMON_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace specstream {

struct ProgressOptions {
  std::string label = "progress";
  int64_t total = 0;  // 0: unknown (no bar, no ETA)
  std::string unit = "items";
  std::string rate_unit = "tok";  // what the secondary counter counts
  double log_every_seconds = 10.0;
  // -1: detect (a bar when stderr is a terminal); 0: log lines; 1: bar.
  int terminal = -1;
  std::FILE* stream = stderr;
};

class ProgressReporter final {
 public:
  explicit ProgressReporter(ProgressOptions options);

  // `done` items out of total; `secondary` is e.g. tokens, shown as a rate.
  void Update(int64_t done, int64_t secondary);
  // Final line (always printed).
  void Finish();

  // "12/100 samples [=====>    ] 1.2k tok/s ETA 0:03:10" — exposed for tests.
  std::string Line(double elapsed_seconds) const;

 private:
  ProgressOptions options_;
  bool bar_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int64_t done_ = 0;
  int64_t secondary_ = 0;
};

// "0:03:10", "1d 2:00:00".
std::string FormatDuration(double seconds);
// 1234 -> "1.2k", 5e6 -> "5.0M".
std::string FormatCount(double value);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_PROGRESS_H_
