// ght: the ghtier command-line tool. Subcommands register themselves (see command.hpp).
#include <cstdio>
#include <exception>
#include <map>
#include <new>

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
    app.parse_complete_callback([&] {
      for (const auto& s : sets) {
        const auto eq = s.find('=');
        if (eq == std::string::npos) {
          throw ght::config_error("--set expects NAME=VALUE, got '" + s + "'");
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
