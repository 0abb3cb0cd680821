#pragma once
/**
 * @file signals.hpp
 * @brief Graceful stop on SIGTERM / SIGINT: the handler only sets a flag; the training loop
 * polls stop_requested() between steps, writes a checkpoint and exits 0. A second signal while a
 * stop is pending restores the default action and re-raises it, so a stuck run can still be
 * killed with a second Ctrl-C.
 */

namespace ght::trainer {

/// Install the SIGTERM and SIGINT handlers (idempotent).
void install_stop_handlers();
/// True once SIGTERM or SIGINT arrived after install_stop_handlers().
[[nodiscard]] bool stop_requested() noexcept;
/// The signal that requested the stop, 0 if none.
[[nodiscard]] int stop_signal() noexcept;
/// Clear the flag (tests, or a loop that handled the stop and continues).
void reset_stop_request() noexcept;
/// Restore the default actions for SIGTERM and SIGINT.
void uninstall_stop_handlers();

}  // namespace ght::trainer
