// `ght alloc-replay FILE`: replay an allocation log (GHT_ALLOC_LOG, or a logging_adaptor's CSV)
// and report peak usage and fragmentation per tier.
#include <cstdio>
#include <memory>
#include <string>

#include "alloc/replay.hpp"
#include "trainer/cli/command.hpp"

namespace {

struct ReplayArgs {
  std::string file;
  bool json = false;
};

void setup(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  auto* c = app.add_subcommand(
      "alloc-replay",
      "Replay an allocation log (CSV from GHT_ALLOC_LOG): peak usage and fragmentation per tier");
  c->add_option("FILE", args->file, "The CSV log: thread,time_ns,action,pointer,size,tier,class,stream")
      ->required();
  c->add_flag("--json", args->json, "Print the report as JSON");
  c->callback([args] {
    // Malformed lines throw ght::io_error "FILE:LINE: ..."; main() prints it and exits 1.
    const ght::alloc::ReplayReport r = ght::alloc::replay_log(args->file);
    const std::string out = args->json ? r.to_json() + "\n" : r.to_text();
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

}  // namespace

GHT_REGISTER_COMMAND(alloc_replay, setup);
