// ght: the ghtier command-line tool. Subcommands register themselves (see command.hpp).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/cli/command.hpp"

namespace ght::cli {

namespace {
std::map<std::string, SetupFn>& registry() {
  static std::map<std::string, SetupFn> r;
  return r;
}
}  // namespace

int register_command(const char* name, SetupFn setup) {
  registry()[name] = setup;
  return 0;
}

void setup_all(CLI::App& app) {
  for (auto& [name, fn] : registry()) fn(app);
}

void set_config_flag(const std::string& name, const std::string& value) {
  config::cfg().set_flag(name, value);
}


std::string set_syntax_message(std::string_view got) {
  return "--set expects NAME=VALUE, e.g. --set GHT_SPILL=off; got '" + std::string(got) + "'";
}

// `--set NAME` without "=VALUE", before or after the subcommand: checked before CLI11 parses, which
// would take NAME for the subcommand ("unknown command") or for an extra argument ("arguments were
// not expected").
std::optional<std::string> set_syntax_error(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return std::nullopt;
    if (arg.starts_with("--set=")) {
      if (arg.find('=', 6) == std::string_view::npos) return set_syntax_message(arg.substr(6));
      continue;
    }
    if (arg != "--set") continue;
    if (i + 1 >= argc || argv[i + 1][0] == '-') return set_syntax_message("");
    if (std::string_view(argv[i + 1]).find('=') == std::string_view::npos) return set_syntax_message(argv[i + 1]);
  }
  return std::nullopt;
}

// The first positional argument names the subcommand; anything before it is a global option.
// Checked before CLI11 parses, so `ght trian --help` is an error rather than the top-level help.
std::optional<std::string> unknown_command_error(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return std::nullopt;
    if (arg == "--set") {
      // Its NAME=VALUE items: --set takes several, and a subcommand name ends the list.
      while (i + 1 < argc && std::string_view(argv[i + 1]).find('=') != std::string_view::npos &&
             argv[i + 1][0] != '-') {
        ++i;
      }
      continue;
    }
    if (!arg.empty() && arg.front() == '-') continue;
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->check_name(std::string(arg))) return std::nullopt;
      names.push_back(sub->get_name());
    }
    std::string best;
    std::size_t best_d = std::string::npos;
    for (const auto& n : names) {
      const std::size_t d = config::edit_distance(arg, n);
      if (d < best_d) {
        best_d = d;
        best = n;
      }
    }
    std::string msg = "unknown command '" + std::string(arg) + "'";
    if (!best.empty() && best_d <= std::max<std::size_t>(2, arg.size() / 3)) {
      msg += "; did you mean " + best + "?";
    } else {
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
      msg += "; commands: " + all;
    }
    return msg + " (ght --help lists them)";
  }
  return std::nullopt;
}

}  // namespace ght::cli

int main(int argc, char** argv) {
  CLI::App app{"ght: memory-tiering runtime and MoE trainer for Grace Hopper and x86 + Hopper"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ghtier 0.1.0");
  std::vector<std::string> sets;
  app.add_option("--set", sets, "Set a GHT_* option from the command line: --set GHT_NAME=VALUE")
      ->type_name("NAME=VALUE");
  try {
    // Load the environment and GHT_CONFIG first, so a bad GHT_* value fails every command.
    ght::config::cfg();
    ght::cli::setup_all(app);
    if (const auto err = ght::cli::set_syntax_error(argc, argv)) {
      std::fprintf(stderr, "ght: configuration error: %s\n", err->c_str());
      return 2;
    }
    if (const auto err = ght::cli::unknown_command_error(app, argc, argv)) {
      std::fprintf(stderr, "ght: error: %s\n", err->c_str());
      return 2;
    }
    app.parse_complete_callback([&] {
      for (const auto& s : sets) {
        const auto eq = s.find('=');
        if (eq == std::string::npos) {
          throw ght::config_error(ght::cli::set_syntax_message(s));
        }
        ght::cli::set_config_flag(s.substr(0, eq), s.substr(eq + 1));
      }
    });
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ght::cli::Exit& e) {
    return e.code;
  } catch (const ght::config_error& e) {
    std::fprintf(stderr, "ght: configuration error: %s\n", e.what());
    return 2;
  } catch (const ght::out_of_memory& e) {
    std::fprintf(stderr, "ght: out of memory: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ght: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
