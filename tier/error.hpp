#pragma once
/**
 * @file error.hpp
 * @brief Typed errors and the two checking macros used across ghtier.
 *
 * The library throws; tools and `main` catch at the top and exit with a clear message.
 *   GHT_EXPECTS(cond, msg)   throws ght::logic_error when cond is false (with file:line at
 *                            GHT_LOG_LEVEL=debug; user-facing messages carry none otherwise)
 *   GHT_FAIL(msg)            throws ght::logic_error unconditionally
 *   GHT_CUDA_TRY(call)       (tier/cuda_check.hpp) throws ght::cuda_error, clearing the sticky error
 */
#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

namespace ght {

/// A broken precondition or invalid user input (bad config value, malformed file).
struct logic_error : std::logic_error {
  using std::logic_error::logic_error;
};

/// Invalid configuration: an unknown GHT_* key, a malformed or out-of-range value.
struct config_error : logic_error {
  using logic_error::logic_error;
};

/// A file that cannot be opened, read, written or fails validation. The message names the file.
struct io_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A CUDA runtime or library call failed.
struct cuda_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// No tier could satisfy an allocation. `what()` carries per-tier statistics and a hint.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string msg) : msg_(std::move(msg)) {}
  [[nodiscard]] const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

namespace detail {
[[noreturn]] void throw_logic_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace ght

#define GHT_STRINGIFY_DETAIL(x) #x
#define GHT_STRINGIFY(x) GHT_STRINGIFY_DETAIL(x)

#define GHT_EXPECTS(cond, msg)                                   \
  do {                                                           \
    if (!(cond)) [[unlikely]] {                                  \
      ::ght::detail::throw_logic_error(__FILE__, __LINE__, msg); \
    }                                                            \
  } while (0)

#define GHT_FAIL(msg) ::ght::detail::throw_logic_error(__FILE__, __LINE__, msg)
