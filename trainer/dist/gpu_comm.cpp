// The GPU communicator's front (argument checks, sequence numbers) and the launch checks, which
// need neither CUDA nor NCCL. The NCCL communicator itself is trainer/dist/nccl/.
#include "trainer/dist/gpu_comm.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <map>
#include <utility>

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/dist/detail/comm_nccl.hpp"
#include "trainer/dist/detail/gpu_comm_nccl.hpp"

namespace ght::dist {

namespace {
const char* const kNoNccl =
    "this build has no NCCL (CMake did not find nccl.h and libnccl.so.2: scripts/install-deps.sh installs the "
    "nvidia-nccl-cu13 wheel into .pydeps/, or set GHT_NCCL_DIR)";
}  // namespace

std::string_view to_string(GpuType t) noexcept {
  switch (t) {
    case GpuType::f32: return "fp32";
    case GpuType::bf16: return "bf16";
    case GpuType::f64: return "fp64";
  }
  return "?";
}
std::string_view to_string(GpuReduce op) noexcept { return op == GpuReduce::sum ? "sum" : "avg"; }
std::size_t element_size(GpuType t) noexcept {
  switch (t) {
    case GpuType::f32: return 4;
    case GpuType::bf16: return 2;
    case GpuType::f64: return 8;
  }
  return 1;
}

GpuCommunicator::GpuCommunicator(int rank, int size, int device, std::chrono::duration<double> timeout)
    : rank_(rank), size_(size), device_(device), timeout_(timeout) {}

namespace {
std::string describe(std::string_view op, std::size_t n, GpuType t, std::optional<GpuReduce> red = std::nullopt) {
  std::string s(op);
  if (red) s += " (" + std::string(to_string(*red)) + ")";
  return s + " of " + std::to_string(n) + " " + std::string(to_string(t));
}
}  // namespace

void GpuCommunicator::allreduce(void* x, std::size_t n, GpuType t, GpuReduce op, cudaStream_t s) {
  ++calls_;
  if (n == 0) return;
  GHT_EXPECTS(x != nullptr, "GPU allreduce: null buffer");
  do_allreduce(x, n, t, op, s, describe("allreduce", n, t, op));
}

void GpuCommunicator::reduce_scatter(const void* in, void* out, std::size_t n, GpuType t, GpuReduce op,
                                     cudaStream_t s) {
  ++calls_;
  if (n == 0) return;
  GHT_EXPECTS(in != nullptr && out != nullptr, "GPU reduce_scatter: null buffer");
  do_reduce_scatter(in, out, n, t, op, s, describe("reduce_scatter", n, t, op) + " per rank");
}

void GpuCommunicator::all_gather(const void* in, void* out, std::size_t n, GpuType t, cudaStream_t s) {
  ++calls_;
  if (n == 0) return;
  GHT_EXPECTS(in != nullptr && out != nullptr, "GPU all_gather: null buffer");
  do_all_gather(in, out, n, t, s, describe("all_gather", n, t) + " per rank");
}

void GpuCommunicator::broadcast(void* x, std::size_t bytes, int root, cudaStream_t s) {
  ++calls_;
  GHT_EXPECTS(root >= 0 && root < size_, "GPU broadcast: root " + std::to_string(root) + " is not a rank of " +
                                             std::to_string(size_));
  if (bytes == 0) return;
  GHT_EXPECTS(x != nullptr, "GPU broadcast: null buffer");
  do_broadcast(x, bytes, root, s, "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root));
}

void GpuCommunicator::wait(cudaStream_t s) { do_wait(s); }

std::string GpuCommunicator::waited_for(int root) const {
  if (root >= 0 && root != rank_) return "waited for root rank " + std::to_string(root);
  if (size_ == 2) return "waited for rank " + std::to_string(1 - rank_);
  if (size_ == 1) return "waited for this rank's own GPU stream (world size 1)";
  return "waited for one or more of the other " + std::to_string(size_ - 1) + " ranks";
}

bool have_nccl() noexcept {
#ifdef GHT_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<GpuCommunicator> make_gpu_communicator(Communicator& cpu, const GpuChoice& choice,
                                                       std::chrono::duration<double> timeout) {
  if (timeout.count() <= 0) {
    // The one-process communicator has no deadline of its own.
    timeout = cpu.size() > 1 ? cpu.timeout()
                             : std::chrono::duration<double>(config::cfg().get_float(config::Key::GHT_DIST_TIMEOUT));
  }
#ifdef GHT_HAVE_NCCL
  // A torchrun-style launch's host communicator runs on NCCL already: its communicator serves.
  if (auto shared = detail::shared_gpu_communicator(cpu, choice)) return shared;
  return detail::make_nccl_communicator(cpu, choice, timeout);
#else
  (void)choice;
  throw ght::config_error("GPU collectives over " + std::to_string(cpu.size()) + " process(es): " + kNoNccl +
                          "; it needs CUDA as well");
#endif
}

std::unique_ptr<Communicator> make_cuda_host_communicator(const Launch& l, std::chrono::duration<double> timeout) {
  if (l.world_size == 1 || l.launcher != Launcher::torchrun) return make_communicator(l, timeout);
  if (timeout.count() <= 0) timeout = std::chrono::duration<double>(config::cfg().get_float(config::Key::GHT_DIST_TIMEOUT));
#ifdef GHT_HAVE_NCCL
  return detail::make_store_nccl_communicator(l, timeout);
#else
  throw ght::config_error("train.backend=cuda in a torchrun-style launch of " + std::to_string(l.world_size) +
                          " processes (" + l.describe() + "): " + kNoNccl);
#endif
}

std::optional<int> configured_device() {
  const config::Registry& reg = config::cfg();
  if (reg.source(config::Key::GHT_DEVICE) == config::Source::Default) return std::nullopt;
  return static_cast<int>(reg.get_int(config::Key::GHT_DEVICE));
}

// ---- launch checks -------------------------------------------------------------------------------

void check_gpu_launch(const Launch& l, bool nccl_built, bool mpi_built) {
  if (l.world_size <= 1) return;
  const std::string what = "train.backend=cuda in a launch of " + std::to_string(l.world_size) + " processes (" +
                           l.describe() + "): ";
  if (!nccl_built) {
    throw ght::config_error(what + kNoNccl + ", so the CUDA backend runs as one process; set train.backend=cpu for "
                                   "data parallel over MPI (launched by mpirun), or launch one process");
  }
  // torchrun-style: NCCL is set up through the TCP store at MASTER_ADDR:MASTER_PORT, no MPI needed.
  if (l.launcher == Launcher::torchrun) return;
  if (!mpi_built) {
    throw ght::config_error(what + "NCCL's set-up (its unique id, the GPU check) goes over MPI, and this build has no "
                                   "MPI (CMake did not find it; scripts/install-deps.sh installs Open MPI)");
  }
}

std::string_view local_rank_variable(Launcher l) noexcept {
  switch (l) {
    case Launcher::open_mpi: return "OMPI_COMM_WORLD_LOCAL_RANK";
    case Launcher::torchrun: return "LOCAL_RANK";
    case Launcher::slurm: return "SLURM_LOCALID";
    case Launcher::none: break;
  }
  return "the rank";
}

namespace {
std::string visible_text(const std::string& v, bool set) {
  return set ? "CUDA_VISIBLE_DEVICES=" + v : std::string("CUDA_VISIBLE_DEVICES unset");
}
}  // namespace

GpuChoice choose_gpu(const Launch& l, std::optional<int> explicit_device, int visible, const Env& env) {
  GpuChoice c;
  c.device = default_device(l, explicit_device);
  const auto it = env.find("CUDA_VISIBLE_DEVICES");
  const bool vis_set = it != env.end();
  if (vis_set) c.visible_devices = it->second;
  if (explicit_device) {
    c.chosen_by = "GHT_DEVICE=" + std::to_string(*explicit_device);
  } else if (l.launcher == Launcher::none) {
    c.chosen_by = "the default (GHT_DEVICE unset, one process)";
  } else {
    c.chosen_by = "local rank " + std::to_string(l.local_rank) + " (" + std::string(local_rank_variable(l.launcher)) +
                  "=" + std::to_string(l.local_rank) + ", GHT_DEVICE unset)";
  }
  const std::string vis = visible_text(c.visible_devices, vis_set);
  if (visible <= 0) {
    throw ght::config_error("train.backend=cuda: no CUDA device is visible to " + l.describe() + " (" + vis + ")");
  }
  if (c.device < visible) return c;
  const std::string have = "this node shows only " + std::to_string(visible) + " CUDA device(s) (" + vis +
                           "; ordinals 0.." + std::to_string(visible - 1) + ")";
  if (explicit_device) {
    throw ght::config_error("GHT_DEVICE=" + std::to_string(*explicit_device) + " (" + l.describe() + "), but " + have);
  }
  throw ght::config_error(
      c.chosen_by + " picks CUDA device " + std::to_string(c.device) + " of " + l.describe() + ", but " + have +
      ": the world size " + std::to_string(l.world_size) + " puts more processes on this node than it has GPUs; "
      "launch at most " + std::to_string(visible) + " per node, or give each rank its own GPU with "
      "CUDA_VISIBLE_DEVICES and set GHT_DEVICE=0");
}

// ---- identities ----------------------------------------------------------------------------------

namespace {
constexpr std::string_view kIdentityMagic = "ght-gpu-identity 1";
std::string field(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\0', ' ');
  if (s.size() > 150) s.resize(150);  // 7 fields fit one record
  return s;
}
int parse_int(std::string_view s, std::string_view what) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  GHT_EXPECTS(ec == std::errc() && p == s.data() + s.size(),
              "GPU identity record: " + std::string(what) + " \"" + std::string(s) + "\" is not an integer");
  return v;
}
}  // namespace

std::string serialize(const GpuIdentity& g) {
  std::string s(kIdentityMagic);
  for (const std::string& f : {std::to_string(g.rank), field(g.host), field(g.pci_bus_id), field(g.uuid),
                               std::to_string(g.choice.device), field(g.choice.chosen_by),
                               field(g.choice.visible_devices)}) {
    s += '\n';
    s += f;
  }
  GHT_EXPECTS(s.size() < kGpuIdentityBytes, "GPU identity record too long");
  return s;
}

GpuIdentity parse_gpu_identity(std::string_view record) {
  record = record.substr(0, std::min(record.find('\0'), record.size()));
  std::vector<std::string_view> f;
  for (std::size_t at = 0;;) {
    const std::size_t nl = record.find('\n', at);
    f.push_back(record.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at));
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  GHT_EXPECTS(f.size() == 8 && f[0] == kIdentityMagic,
              "GPU identity record: not one (" + std::to_string(f.size()) + " lines; a rank of another ght build?)");
  GpuIdentity g;
  g.rank = parse_int(f[1], "rank");
  g.host = f[2];
  g.pci_bus_id = f[3];
  g.uuid = f[4];
  g.choice.device = parse_int(f[5], "device");
  g.choice.chosen_by = f[6];
  g.choice.visible_devices = f[7];
  return g;
}

void check_distinct_gpus(const std::vector<GpuIdentity>& ranks) {
  // The UUID names one GPU everywhere; without it, a PCI bus id is unique within one host.
  std::map<std::string, const GpuIdentity*> seen;
  for (const GpuIdentity& g : ranks) {
    const std::string key = !g.uuid.empty() ? "uuid " + g.uuid : "host " + g.host + " bus " + g.pci_bus_id;
    const auto [it, fresh] = seen.emplace(key, &g);
    if (fresh) continue;
    const GpuIdentity& a = *it->second;
    auto how = [](const GpuIdentity& x) {
      return "rank " + std::to_string(x.rank) + " by " + x.choice.chosen_by + " (device ordinal " +
             std::to_string(x.choice.device) + ", " +
             (x.choice.visible_devices.empty() ? std::string("CUDA_VISIBLE_DEVICES unset or empty")
                                               : "CUDA_VISIBLE_DEVICES=" + x.choice.visible_devices) +
             ")";
    };
    throw ght::config_error("ranks " + std::to_string(a.rank) + " and " + std::to_string(g.rank) +
                            " both use the GPU at PCI " + g.pci_bus_id + (g.uuid.empty() ? "" : " (" + g.uuid + ")") +
                            " on host " + g.host + ": " + how(a) + ", " + how(g) +
                            ". Each rank needs its own GPU: unset GHT_DEVICE so that each uses its local rank "
                            "(LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID), or give each rank its own "
                            "CUDA_VISIBLE_DEVICES");
  }
}

std::vector<GpuIdentity> gather_gpu_identities(Communicator& cpu, const GpuIdentity& mine) {
  const std::string rec = serialize(mine);
  std::vector<GpuIdentity> all;
  all.reserve(static_cast<std::size_t>(cpu.size()));
  for (int r = 0; r < cpu.size(); ++r) {
    std::array<char, kGpuIdentityBytes> buf{};
    if (r == cpu.rank()) std::memcpy(buf.data(), rec.data(), rec.size());
    cpu.broadcast(buf.data(), buf.size(), r);
    all.push_back(parse_gpu_identity(std::string_view(buf.data(), buf.size())));
    GHT_EXPECTS(all.back().rank == r, "GPU identity of rank " + std::to_string(r) + " says rank " +
                                          std::to_string(all.back().rank));
  }
  return all;
}

}  // namespace ght::dist
