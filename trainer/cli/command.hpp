#pragma once
/**
 * @file command.hpp
 * @brief Subcommand registration for the `ght` CLI.
 *
 * Each subcommand lives in trainer/cli/cmd_<name>.cpp and registers a setup function that adds
 * its CLI11 subcommand, options and callback:
 *
 *   static void setup(CLI::App& app) { auto* c = app.add_subcommand("info", "..."); ... }
 *   GHT_REGISTER_COMMAND(info, setup);
 *
 * Callbacks throw ght errors; main() catches them, prints "ght: error: ..." and exits non-zero.
 * Callbacks that need to exit with a specific code throw ght::cli::Exit.
 */
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace ght::cli {

using SetupFn = void (*)(CLI::App&);

/// Exit the program with `code` after the callback returns (thrown by callbacks).
struct Exit {
  int code = 0;
};

int register_command(const char* name, SetupFn setup);
void setup_all(CLI::App& app);

/// Apply `--set NAME=VALUE` style overrides and common flags as CLI-flag-sourced config.
void set_config_flag(const std::string& name, const std::string& value);

}  // namespace ght::cli

#define GHT_REGISTER_COMMAND(name, fn) \
  static const int ght_cli_registered_##name = ::ght::cli::register_command(#name, fn)
