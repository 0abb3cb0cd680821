#include "optimizer/cpu_threads.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "tier/config.hpp"
#include "tier/host_triad.hpp"
#include "tier/topology.hpp"

namespace ght::optimizer {

namespace {

int host_node() {
  try {
    return tier::topology().host_numa_node;
  } catch (const std::exception&) {
    return 0;  // team_cpus falls back to the process's CPUs without a usable topology
  }
}

}  // namespace

const std::vector<int>& pinned_cpu_list() {
  static const std::vector<int> cpus = tier::team_cpus(host_node());
  return cpus;
}

int resolve_cpu_threads(int requested) {
  if (requested > 0) return requested;
  const auto env = config::cfg().get_int(config::Key::GHT_CPU_THREADS);
  if (env > 0) return static_cast<int>(env);
  return std::max(1, static_cast<int>(pinned_cpu_list().size()));
}

namespace {
// Small buffers are not worth waking a team for.
int team_for_bytes(std::size_t bytes, int threads) { return bytes < (std::size_t{4} << 20) ? 1 : threads; }
}  // namespace

void zero_host(void* p, std::size_t bytes, int threads) {
  if (bytes == 0) return;
  auto* b = static_cast<unsigned char*>(p);
  parallel_pinned(team_for_bytes(bytes, threads), [&](int tid, int nt) {
    const Range r = thread_range(bytes, tid, nt, 64);
    if (r.end > r.begin) std::memset(b + r.begin, 0, r.end - r.begin);
  });
}

void copy_host(void* dst, const void* src, std::size_t bytes, int threads) {
  if (bytes == 0) return;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  parallel_pinned(team_for_bytes(bytes, threads), [&](int tid, int nt) {
    const Range r = thread_range(bytes, tid, nt, 64);
    if (r.end > r.begin) std::memcpy(d + r.begin, s + r.begin, r.end - r.begin);
  });
}

namespace detail {

static_assert(sizeof(cpu_set_t) % sizeof(unsigned long) == 0);

void pin_team_thread(int tid) {
  // Workers persist across parallel regions in libgomp, so a worker re-pins only when its slot
  // changed. Thread 0 is the caller, whose mask AffinityGuard restores, so it always re-pins.
  thread_local int pinned_to = -1;
  const std::vector<int>& cpus = pinned_cpu_list();
  const int cpu = cpus[static_cast<std::size_t>(tid) % cpus.size()];
  if (tid != 0 && pinned_to == cpu) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) == 0) pinned_to = tid == 0 ? -1 : cpu;
}

AffinityGuard::AffinityGuard() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    mask_.resize(sizeof set / sizeof(unsigned long));
    std::memcpy(mask_.data(), &set, sizeof set);
    saved_ = true;
  }
}

AffinityGuard::~AffinityGuard() {
  if (!saved_) return;
  cpu_set_t set;
  std::memcpy(&set, mask_.data(), sizeof set);
  (void)sched_setaffinity(0, sizeof set, &set);
}

}  // namespace detail
}  // namespace ght::optimizer
