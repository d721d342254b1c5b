// The logger's line formatting and output; a mutex keeps lines from different threads whole.
#include "tools/shoald/log.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>

namespace shoal::tools::shoald {

namespace {

std::mutex write_mutex;

// UTC wall time with milliseconds, ISO 8601.
std::string timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, ms);
}

}  // namespace

logger::~logger() {
  if (file_) std::fclose(file_);
}

std::string logger::open(runtime::log_level level, const std::string& file) {
  level_ = level;
  if (file.empty()) return {};
  file_ = std::fopen(file.c_str(), "a");
  if (!file_) return fmt::format("cannot open log file {}: {}", file, std::strerror(errno));
  return {};
}

void logger::write(runtime::log_level l, std::string_view message) {
  std::string line = fmt::format("{} {:<5} {}\n", timestamp(), runtime::to_string(l), message);
  std::lock_guard lock(write_mutex);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  if (file_) {
    std::fputs(line.c_str(), file_);
    std::fflush(file_);
  }
}

}  // namespace shoal::tools::shoald
