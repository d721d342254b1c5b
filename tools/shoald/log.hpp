// shoald's leveled logger: one line per record ("2026-01-01T12:00:00.123Z info  message") to
// stderr and, when the node config names one, appended to a log file. Thread-safe (CAF threads
// and the main thread log); records below the configured level are dropped before formatting.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/core.h>

#include "runtime/config/node_config.hpp"

namespace shoal::tools::shoald {

class logger {
 public:
  logger() = default;
  ~logger();
  logger(const logger&) = delete;
  logger& operator=(const logger&) = delete;

  // Sets the lowest level written and opens `file` for appending (empty = stderr only).
  // Returns an error message when the file cannot be opened.
  std::string open(runtime::log_level level, const std::string& file);

  bool enabled(runtime::log_level l) const { return l >= level_; }

  template <class... Args>
  void log(runtime::log_level l, fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(l)) write(l, fmt::format(f, std::forward<Args>(args)...));
  }
  template <class... Args>
  void info(fmt::format_string<Args...> f, Args&&... args) {
    log(runtime::log_level::info, f, std::forward<Args>(args)...);
  }
  template <class... Args>
  void warn(fmt::format_string<Args...> f, Args&&... args) {
    log(runtime::log_level::warn, f, std::forward<Args>(args)...);
  }
  template <class... Args>
  void error(fmt::format_string<Args...> f, Args&&... args) {
    log(runtime::log_level::error, f, std::forward<Args>(args)...);
  }
  template <class... Args>
  void debug(fmt::format_string<Args...> f, Args&&... args) {
    log(runtime::log_level::debug, f, std::forward<Args>(args)...);
  }

 private:
  void write(runtime::log_level l, std::string_view message);

  runtime::log_level level_ = runtime::log_level::info;
  std::FILE* file_ = nullptr;
};

}  // namespace shoal::tools::shoald
