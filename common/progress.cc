#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace specstream {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  int64_t days = s / 86400;
  s %= 86400;
  std::string hms = absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return days > 0 ? absl::StrFormat("%dd %s", days, hms) : hms;
}

std::string FormatCount(double value) {
  if (value >= 1e9) return absl::StrFormat("%.1fG", value / 1e9);
  if (value >= 1e6) return absl::StrFormat("%.1fM", value / 1e6);
  if (value >= 1e3) return absl::StrFormat("%.1fk", value / 1e3);
  return absl::StrFormat("%.0f", value);
}

ProgressReporter::ProgressReporter(ProgressOptions options)
    : options_(std::move(options)),
      bar_(options_.terminal == 1 ||
           (options_.terminal == -1 && isatty(fileno(options_.stream)) != 0)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::string ProgressReporter::Line(double elapsed) const {
  std::string line = absl::StrFormat("%s: %d", options_.label, done_);
  if (options_.total > 0) line += absl::StrFormat("/%d", options_.total);
  line += " " + options_.unit;
  if (options_.total > 0 && bar_) {
    constexpr int kWidth = 24;
    int filled = static_cast<int>(kWidth * std::min<double>(1.0, double(done_) / options_.total));
    line += " [" + std::string(filled, '=') + (filled < kWidth ? ">" : "") +
            std::string(std::max(0, kWidth - filled - 1), ' ') + "]";
  }
  if (elapsed > 0) {
    line += absl::StrFormat(" %s %s/s", FormatCount(secondary_ / elapsed), options_.rate_unit);
  }
  if (options_.total > 0 && done_ > 0 && done_ < options_.total) {
    line += " ETA " + FormatDuration(elapsed / done_ * (options_.total - done_));
  }
  line += " elapsed " + FormatDuration(elapsed);
  return line;
}

void ProgressReporter::Update(int64_t done, int64_t secondary) {
  done_ = done;
  secondary_ = secondary;
  auto now = std::chrono::steady_clock::now();
  double since_draw = std::chrono::duration<double>(now - last_draw_).count();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  if (bar_) {
    if (since_draw < 0.1) return;
    std::fprintf(options_.stream, "\r%s\033[K", Line(elapsed).c_str());
    std::fflush(options_.stream);
  } else {
    if (since_draw < options_.log_every_seconds) return;
    SS_LOG_INFO("{}", Line(elapsed));
  }
  last_draw_ = now;
}

void ProgressReporter::Finish() {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (bar_) {
    std::fprintf(options_.stream, "\r%s\033[K\n", Line(elapsed).c_str());
    std::fflush(options_.stream);
  } else {
    SS_LOG_INFO("{} (done)", Line(elapsed));
  }
}

}  // namespace specstream
