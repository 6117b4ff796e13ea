#include "core/log.h"

#include <atomic>

namespace tetra {
namespace {
// The one process-wide setting: how chatty stderr is.
std::atomic<LogLevel> g_level{LogLevel::Info};
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

void log_line(LogLevel level, const std::string& message) {
  static const char* kTags[] = {"debug", "info", "warn", "error", ""};
  std::fprintf(stderr, "[tetra %s] %s\n", kTags[int(level)], message.c_str());
}

}  // namespace tetra
