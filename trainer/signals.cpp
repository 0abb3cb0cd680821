#include "trainer/signals.hpp"

#include <atomic>
#include <csignal>

namespace ght::trainer {

namespace {
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

void ght_stop_handler(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    // Second signal: fall back to the default action (terminate) right away.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

void set_handler(int sig, void (*fn)(int)) {
  struct sigaction sa {};
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // let blocking I/O in the loop continue; the flag is polled
  sigaction(sig, &sa, nullptr);
}
}  // namespace

void install_stop_handlers() {
  set_handler(SIGTERM, ght_stop_handler);
  set_handler(SIGINT, ght_stop_handler);
}

bool stop_requested() noexcept { return g_signal.load(std::memory_order_relaxed) != 0; }
int stop_signal() noexcept { return g_signal.load(std::memory_order_relaxed); }
void reset_stop_request() noexcept { g_signal.store(0, std::memory_order_relaxed); }

void uninstall_stop_handlers() {
  set_handler(SIGTERM, SIG_DFL);
  set_handler(SIGINT, SIG_DFL);
}

}  // namespace ght::trainer
