#pragma once
/**
 * @file log.hpp
 * @brief The library's messages, filtered by GHT_LOG_LEVEL (error | warn | info | debug).
 *
 *   ght::log::info("resumed from ...");     // stdout, as the line itself
 *   ght::log::warn("skipping checkpoint");   // stderr, "ght: warning: ..."
 *
 * info is what a run tells its user (the trainer's progress notes), so it goes to stdout with
 * the step lines; warn, error and debug go to stderr with a "ght: <level>: " prefix. The level is
 * read from the configuration registry (config::cfg()) on first use; an invalid GHT_LOG_LEVEL is
 * reported there, not here. Each message is written with one call under a mutex, so lines from
 * several threads never interleave.
 */
#include <string_view>

namespace ght::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

/// The effective level: set_level()'s, else GHT_LOG_LEVEL's (read once), else info.
[[nodiscard]] Level level();
/// Override the level for this process (tests; a CLI's -v / -q).
void set_level(Level l);
/// Parse "error" | "warn" | "info" | "debug" (case-insensitive). @throws ght::config_error
[[nodiscard]] Level parse_level(std::string_view text);
/// True when messages of level l are printed.
[[nodiscard]] bool enabled(Level l);

void error(std::string_view msg);
void warn(std::string_view msg);
void info(std::string_view msg);
void debug(std::string_view msg);

}  // namespace ght::log
