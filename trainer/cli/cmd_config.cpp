// `ght config`: print the effective GHT_* configuration and where each value came from.
#include <cstdio>
#include <memory>
#include <string>

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/cli/command.hpp"

namespace {

struct ConfigArgs {
  bool json = false;
  bool markdown = false;
};

void setup(CLI::App& app) {
  auto args = std::make_shared<ConfigArgs>();
  auto* c = app.add_subcommand(
      "config", "Print every GHT_* option: value, source (default/file/env/flag), default, doc");
  auto* json = c->add_flag("--json", args->json,
                           "Print a JSON array of {name,type,value,source,default,choices,doc,short}");
  c->add_flag("--markdown", args->markdown,
              "Print the options reference (docs/options.md): short docs in a table, then whole docs")
      ->excludes(json);
  c->callback([args] {
    auto& reg = ght::config::cfg();
    const std::string out = args->json       ? reg.format_json()
                            : args->markdown ? reg.format_markdown()
                                             : reg.format_table();
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

}  // namespace

GHT_REGISTER_COMMAND(config, setup);
