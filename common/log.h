// Logging on fmt: one line per event on stderr, "carpool <level> <message>".
// Thread-safe: each line is written with a single fwrite. Level from $CARPOOL_LOG (debug|info|
// warn|error, default info).
#ifndef CARPOOL_COMMON_LOG_H_
#define CARPOOL_COMMON_LOG_H_

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace carpool::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

inline Level ThresholdFromEnv() {
  const char* env = std::getenv("CARPOOL_LOG");
  if (env == nullptr) return Level::kInfo;
  std::string_view v(env);
  if (v == "debug") return Level::kDebug;
  if (v == "warn") return Level::kWarn;
  if (v == "error") return Level::kError;
  return Level::kInfo;
}

inline Level Threshold() {
  static const Level level = ThresholdFromEnv();
  return level;
}

inline void Write(Level level, std::string_view text) {
  if (level < Threshold()) return;
  static constexpr std::string_view kNames[] = {"debug", "info", "warn", "error"};
  std::string line = fmt::format("carpool {}: {}\n", kNames[static_cast<int>(level)], text);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

template <typename... Args>
void Debug(fmt::format_string<Args...> f, Args&&... args) {
  if (Level::kDebug >= Threshold()) Write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Info(fmt::format_string<Args...> f, Args&&... args) {
  if (Level::kInfo >= Threshold()) Write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Warn(fmt::format_string<Args...> f, Args&&... args) {
  Write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Error(fmt::format_string<Args...> f, Args&&... args) {
  Write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace carpool::log

#endif  // CARPOOL_COMMON_LOG_H_
