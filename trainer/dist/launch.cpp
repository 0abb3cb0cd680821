#include "trainer/dist/launch.hpp"

#include <unistd.h>  // environ

#include <charconv>

#include "tier/error.hpp"

namespace ght::dist {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw ght::config_error("launch environment: " + msg); }

const std::string* find(const Env& env, std::string_view k) {
  const auto it = env.find(k);
  return it == env.end() ? nullptr : &it->second;
}

// A decimal integer in [lo, hi], nothing else (no sign, no spaces, no suffix).
int parse(std::string_view name, const std::string& text, long lo, long hi) {
  long v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  const auto [p, ec] = std::from_chars(b, e, v);
  if (text.empty() || text[0] == '+' || text[0] == '-' || ec != std::errc() || p != e) {
    if (!text.empty() && text[0] == '-' && ec == std::errc() && p == e) {
      fail(std::string(name) + "=" + text + " is negative; it must be in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
    }
    fail(std::string(name) + "=\"" + text + "\" is not a decimal integer");
  }
  if (v < lo || v > hi) {
    fail(std::string(name) + "=" + text + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(v);
}

constexpr long kMaxWorld = 1L << 20;

// One launcher's (rank, size, local rank) variables; nullopt when none of them is set.
std::optional<Launch> read_source(const Env& env, Launcher who, const char* rank_var, const char* size_var,
                                  const char* local_var) {
  const std::string* r = find(env, rank_var);
  const std::string* n = find(env, size_var);
  const std::string* lr = find(env, local_var);
  if (r == nullptr && n == nullptr && lr == nullptr) return std::nullopt;
  const std::string what = std::string(" (") + std::string(to_string(who)) + " launch)";
  if (n == nullptr) fail(std::string(r != nullptr ? rank_var : local_var) + " is set but " + size_var + " is not" + what);
  if (r == nullptr) fail(std::string(size_var) + " is set but " + rank_var + " is not" + what);
  Launch l;
  l.launcher = who;
  l.world_size = parse(size_var, *n, 1, kMaxWorld);
  l.rank = parse(rank_var, *r, 0, kMaxWorld);
  if (l.rank >= l.world_size) {
    fail(std::string(rank_var) + "=" + *r + " is not below " + size_var + "=" + *n + ": ranks are 0.." +
         std::to_string(l.world_size - 1) + what);
  }
  l.local_rank = lr != nullptr ? parse(local_var, *lr, 0, kMaxWorld) : l.rank;
  if (l.local_rank >= l.world_size) {
    fail(std::string(local_var) + "=" + *lr + " is not below " + size_var + "=" + *n + what);
  }
  return l;
}

}  // namespace

Env process_env() {
  Env env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

std::string_view to_string(Launcher l) noexcept {
  switch (l) {
    case Launcher::open_mpi: return "open-mpi";
    case Launcher::torchrun: return "torchrun";
    case Launcher::slurm: return "slurm";
    case Launcher::none: break;
  }
  return "none";
}

std::string Launch::describe() const {
  if (launcher == Launcher::none) return "a single process (no launcher variables set)";
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local rank " +
         std::to_string(local_rank) + "), launched by " + std::string(to_string(launcher));
}

Launch detect_launch(const Env& env) {
  const auto ompi = read_source(env, Launcher::open_mpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                "OMPI_COMM_WORLD_LOCAL_RANK");
  const auto torch = read_source(env, Launcher::torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK");
  if (ompi && torch) {
    if (ompi->world_size != torch->world_size) {
      fail("WORLD_SIZE=" + std::to_string(torch->world_size) + " disagrees with OMPI_COMM_WORLD_SIZE=" +
           std::to_string(ompi->world_size) + " (unset one, or make them agree)");
    }
    if (ompi->rank != torch->rank) {
      fail("RANK=" + std::to_string(torch->rank) + " disagrees with OMPI_COMM_WORLD_RANK=" +
           std::to_string(ompi->rank) + " (unset one, or make them agree)");
    }
  }
  if (ompi) return *ompi;
  if (torch) {
    Launch l = *torch;
    const std::string* addr = find(env, "MASTER_ADDR");
    const std::string* port = find(env, "MASTER_PORT");
    if (addr != nullptr) l.master_addr = *addr;
    if (port != nullptr) l.master_port = parse("MASTER_PORT", *port, 1, 65535);
    l.store_port = l.master_port;
    const std::string* agent = find(env, "TORCHELASTIC_USE_AGENT_STORE");
    if (agent != nullptr && *agent == "True" && l.master_port > 0) {
      if (l.master_port == 65535) {
        fail("MASTER_PORT=65535 under torchrun (TORCHELASTIC_USE_AGENT_STORE=True): torchrun's agent serves its "
             "store on MASTER_PORT and ght's bootstrap store takes MASTER_PORT+1; pick a lower --master-port");
      }
      l.store_port = l.master_port + 1;
    }
    if (l.world_size > 1) {
      if (l.master_addr.empty()) {
        fail("MASTER_ADDR is " + std::string(addr ? "empty" : "not set") + " but WORLD_SIZE=" +
             std::to_string(l.world_size) + ": a torchrun-style launch of several processes needs MASTER_ADDR and "
             "MASTER_PORT (the rendezvous address)");
      }
      if (port == nullptr) fail("MASTER_PORT is not set but WORLD_SIZE=" + std::to_string(l.world_size) + " (torchrun-style launch)");
    }
    return l;
  }
  if (auto slurm = read_source(env, Launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")) return *slurm;
  return {};
}

int default_device(const Launch& l, std::optional<int> explicit_device) noexcept {
  return explicit_device ? *explicit_device : l.local_rank;
}

}  // namespace ght::dist
