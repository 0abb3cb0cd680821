#include "tier/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::log {

namespace {

constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};
std::mutex g_write;

void write(std::FILE* f, std::string_view prefix, std::string_view msg) {
  std::string line;
  line.reserve(prefix.size() + msg.size() + 1);
  line.append(prefix).append(msg).push_back('\n');
  const std::lock_guard<std::mutex> lock(g_write);
  std::fwrite(line.data(), 1, line.size(), f);
  std::fflush(f);
}

}  // namespace

Level parse_level(std::string_view text) {
  const std::string v = config::parse_enum("GHT_LOG_LEVEL", text, "error|warn|info|debug");
  if (v == "error") return Level::error;
  if (v == "warn") return Level::warn;
  if (v == "debug") return Level::debug;
  return Level::info;
}

Level level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l == kUnset) {
    // The registry validated the value when it loaded; a failed load is reported by whoever
    // reads the configuration next, so messages fall back to the default meanwhile.
    Level parsed = Level::info;
    try {
      parsed = parse_level(config::cfg().get_string(config::Key::GHT_LOG_LEVEL));
    } catch (const std::exception&) {
    }
    int expected = kUnset;
    g_level.compare_exchange_strong(expected, static_cast<int>(parsed));
    l = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<Level>(l);
}

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }

bool enabled(Level l) { return static_cast<int>(l) <= static_cast<int>(level()); }

void error(std::string_view msg) {
  if (enabled(Level::error)) write(stderr, "ght: error: ", msg);
}
void warn(std::string_view msg) {
  if (enabled(Level::warn)) write(stderr, "ght: warning: ", msg);
}
void info(std::string_view msg) {
  if (enabled(Level::info)) write(stdout, "", msg);
}
void debug(std::string_view msg) {
  if (enabled(Level::debug)) write(stderr, "ght: debug: ", msg);
}

}  // namespace ght::log
