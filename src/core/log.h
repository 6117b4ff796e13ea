// Logging to stderr. Levels are chosen once at startup by the CLI; no other global state.
#pragma once

#include <cstdio>
#include <string>

#include "core/error.h"

namespace tetra {

enum class LogLevel { Debug, Info, Warn, Error, Off };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(const Args&... args) { if (log_level() <= LogLevel::Info) log_line(LogLevel::Info, str_cat(args...)); }
template <typename... Args>
void log_warn(const Args&... args) { if (log_level() <= LogLevel::Warn) log_line(LogLevel::Warn, str_cat(args...)); }
template <typename... Args>
void log_debug(const Args&... args) { if (log_level() <= LogLevel::Debug) log_line(LogLevel::Debug, str_cat(args...)); }

}  // namespace tetra
