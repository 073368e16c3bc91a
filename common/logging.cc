#include "common/logging.h"

#include <mutex>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace specstream {
namespace {

struct LoggerState {
  std::mutex mu;
  LoggingOptions options;
  std::shared_ptr<spdlog::logger> logger;
};

LoggerState& State() {
  static LoggerState* state = new LoggerState();  // Never destroyed.
  return *state;
}

std::string Pattern(const LoggingOptions& options) {
  std::string stamp = options.role;
  if (options.rank >= 0) stamp += ":" + std::to_string(options.rank);
  return "[%Y-%m-%d %H:%M:%S.%e] [" + stamp + "] [%l] %v";
}

void Install(LoggerState& state) {
  // Not registered in spdlog's global registry: re-initialising replaces the
  // logger without name clashes.
  spdlog::sink_ptr sink;
  if (state.options.to_stderr) {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  } else {
    sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>();
  }
  auto logger = std::make_shared<spdlog::logger>("specstream", sink);
  logger->set_pattern(Pattern(state.options));
  logger->set_level(spdlog::level::from_str(state.options.level));
  state.logger = logger;
}

}  // namespace

bool InitLogging(const LoggingOptions& options) {
  LoggerState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.options = options;
  bool known =
      spdlog::level::from_str(options.level) != spdlog::level::off || options.level == "off";
  if (!known) state.options.level = "info";
  Install(state);
  return known;
}

void SetLogRank(int rank) {
  LoggerState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.options.rank = rank;
  if (state.logger) {
    state.logger->set_pattern(Pattern(state.options));
  } else {
    Install(state);
  }
}

std::shared_ptr<spdlog::logger> Logger() {
  LoggerState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  if (!state.logger) Install(state);
  return state.logger;
}

}  // namespace specstream
