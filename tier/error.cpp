#include "tier/error.hpp"

#include <cstring>

#include "tier/config.hpp"

namespace ght::detail {

[[noreturn]] void throw_logic_error(const char* file, int line, const std::string& msg) {
  // Most of these messages are for users (a bad key, a bad file); the source location only helps
  // whoever debugs ghtier, so it is added at GHT_LOG_LEVEL=debug.
  if (!config::debug_log_level()) throw ght::logic_error(msg);
  // Keep only the path below the project root so messages stay short and stable.
  const char* base = std::strstr(file, "/tier/");
  for (const char* dir : {"/alloc/", "/optimizer/", "/kernels/", "/trainer/"}) {
    if (base == nullptr) base = std::strstr(file, dir);
  }
  throw ght::logic_error(msg + " (" + (base != nullptr ? base + 1 : file) + ":" +
                         std::to_string(line) + ")");
}

}  // namespace ght::detail
