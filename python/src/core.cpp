// ghtier._core: the allocator's C ABI (alloc/include/ght/ght.h), the host AdamW and, in a CUDA
// build, the GPU AdamW kernel (optimizer/adamw_kernels.hpp) for the Python package. Kept small: ghtier/torch.py does the
// PyTorch side (dtype, device and shape checks) and passes raw host addresses here.
#include <dlfcn.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "ght/ght.h"
#include "tier/topology.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/cpu_threads.hpp"

namespace nb = nanobind;
namespace opt = ght::optimizer;

namespace {

[[noreturn]] void raise_last_error(const char* what) {
  throw std::runtime_error(std::string(what) + ": " + ght_last_error());
}

opt::StateType parse_state(const std::string& s) {
  if (s == "fp32") return opt::StateType::fp32;
  if (s == "bf16") return opt::StateType::bf16;
  if (s == "q8") return opt::StateType::q8;
  throw std::invalid_argument("state '" + s + "' is not one of fp32, bf16, q8");
}

opt::GradType parse_grad(const std::string& s) {
  if (s == "fp32") return opt::GradType::fp32;
  if (s == "bf16") return opt::GradType::bf16;
  throw std::invalid_argument("gradient dtype '" + s + "' is not fp32 or bf16 (convert it first)");
}

template <typename T>
T* ptr(std::uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

/// The file this library was loaded from (libghtier_alloc.so.N beside _core in a wheel).
std::string alloc_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ght_init), &info) == 0 || info.dli_fname == nullptr) {
    throw std::runtime_error("cannot locate the allocator library (dladdr of ght_init failed)");
  }
  return info.dli_fname;
}

/// An uninitialised host block of ghtier's host tier as a 1-D uint8 torch tensor; the tensor's last
/// reference frees the block (ght_free).
nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>> host_tensor(std::size_t nbytes, int tensor_class) {
  if (nbytes == 0) throw std::invalid_argument("host_tensor: nbytes must be > 0");
  void* p = ght_malloc(nbytes, tensor_class, GHT_TIER_HOST);
  if (p == nullptr) raise_last_error("ghtier could not allocate host memory");
  nb::capsule owner(p, [](void* q) noexcept { (void)ght_free(q); });
  return nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>>(p, {nbytes}, owner);
}

nb::object where(std::uintptr_t address) {
  ght_placement pl{};
  if (ght_where(ptr<const void>(address), &pl) != 0) return nb::none();
  nb::dict d;
  d["tier"] = pl.tier == GHT_TIER_HBM ? "hbm" : "host";
  d["tensor_class"] = pl.tensor_class;
  d["bytes"] = pl.bytes;
  d["region"] = pl.region;
  d["spilled"] = pl.spilled != 0;
  return d;
}

/// The span and step constants of one parameter's update, from the binding's flat arguments.
struct UpdateArgs {
  opt::AdamWSpan span;
  opt::StepScalars k;
};

UpdateArgs update_args(std::uintptr_t master, std::uintptr_t m, std::uintptr_t v, std::uintptr_t grad,
                       const std::string& grad_dtype, std::uintptr_t weight, std::size_t n,
                       const std::string& state, double lr, double beta1, double beta2, double eps,
                       double weight_decay, std::int64_t step, double grad_scale, std::uint64_t key) {
  opt::AdamWHyper h;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.max_grad_norm = 0;  // the caller passes the clip coefficient as grad_scale
  UpdateArgs a{{}, opt::make_step_scalars(h, lr, step, weight_decay != 0, grad_scale)};
  opt::AdamWSpan& s = a.span;
  s.master = ptr<float>(master);
  s.m = ptr<void>(m);
  s.v = ptr<void>(v);
  s.grad = ptr<const void>(grad);
  s.grad_type = parse_grad(grad_dtype);
  s.weight = ptr<ght::optimizer::bf16>(weight);
  s.n = n;
  s.state = parse_state(state);
  s.key = key;
  return a;
}

void adamw(std::uintptr_t master, std::uintptr_t m, std::uintptr_t v, std::uintptr_t grad,
           const std::string& grad_dtype, std::uintptr_t weight, std::size_t n, const std::string& state,
           double lr, double beta1, double beta2, double eps, double weight_decay, std::int64_t step,
           double grad_scale, std::uint64_t key, int threads) {
  const UpdateArgs a = update_args(master, m, v, grad, grad_dtype, weight, n, state, lr, beta1, beta2, eps,
                                   weight_decay, step, grad_scale, key);
  nb::gil_scoped_release unlocked;
  opt::adamw_cpu(a.span, a.k, threads);
}

#ifdef GHT_HAVE_CUDA
/// The update on the GPU (ghtier's adamw_gpu kernel), queued on `stream` (a cudaStream_t as an
/// integer: torch.cuda.current_stream().cuda_stream). master, m and v may be HBM or host memory the
/// GPU can reach (pinned and mapped); grad and weight are the parameter's, in HBM.
void adamw_gpu(std::uintptr_t master, std::uintptr_t m, std::uintptr_t v, std::uintptr_t grad,
               const std::string& grad_dtype, std::uintptr_t weight, std::size_t n, const std::string& state,
               double lr, double beta1, double beta2, double eps, double weight_decay, std::int64_t step,
               double grad_scale, std::uint64_t key, std::uintptr_t stream, std::uint64_t first) {
  UpdateArgs a = update_args(master, m, v, grad, grad_dtype, weight, n, state, lr, beta1, beta2, eps,
                             weight_decay, step, grad_scale, key);
  a.span.first = first;  // a chunk of the parameter: bf16 state's rounding bits follow the element index
  opt::adamw_gpu(a.span, a.k, reinterpret_cast<cudaStream_t>(stream));
}

/// Whether a GPU kernel can dereference this address: device memory, or host memory that CUDA
/// pinned and mapped (not plain pageable memory, which faults on PCIe machines).
bool gpu_reachable(std::uintptr_t address) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr<const void>(address)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type != cudaMemoryTypeUnregistered && a.devicePointer != nullptr;
}
#endif

}  // namespace

NB_MODULE(_core, mod) {
  mod.doc() = "ghtier's allocator C ABI and host AdamW (used by ghtier.torch)";
  mod.attr("__version__") = GHT_VERSION;
#ifdef GHT_HAVE_CUDA
  mod.attr("has_cuda") = true;
#else
  mod.attr("has_cuda") = false;
#endif
  mod.attr("TIER_AUTO") = static_cast<int>(GHT_TIER_AUTO);
  mod.attr("TIER_HBM") = static_cast<int>(GHT_TIER_HBM);
  mod.attr("TIER_HOST") = static_cast<int>(GHT_TIER_HOST);
  mod.attr("CLASS_MASTER") = static_cast<int>(GHT_CLASS_MASTER);
  mod.attr("CLASS_ADAM_M") = static_cast<int>(GHT_CLASS_ADAM_M);
  mod.attr("CLASS_ADAM_V") = static_cast<int>(GHT_CLASS_ADAM_V);
  mod.attr("CLASS_GRAD") = static_cast<int>(GHT_CLASS_GRAD);
  mod.attr("CLASS_WEIGHT") = static_cast<int>(GHT_CLASS_WEIGHT);

  mod.def("alloc_library_path", &alloc_library_path,
          "Path of the loaded libghtier_alloc.so (what PyTorch's pluggable allocator must load).");
  mod.def("init", [] {
    if (ght_init() != 0) raise_last_error("ghtier's allocator failed to start (check the GHT_* environment)");
  }, "Build the allocator from the GHT_* environment (idempotent).");
  mod.def("stats_json", [] {
    const char* s = ght_stats_json();
    if (s == nullptr) raise_last_error("ght_stats_json failed");
    return std::string(s);
  }, "The allocator's statistics and budgets as JSON.");
  mod.def("set_thread_tier", [](int tier) {
    int previous = GHT_TIER_AUTO;
    if (ght_torch_set_thread_tier(tier, &previous) != 0) throw std::invalid_argument(ght_last_error());
    return previous;
  }, nb::arg("tier"), "Tier of the calling thread's PyTorch allocations; returns the previous one.");
  mod.def("thread_tier", &ght_torch_thread_tier, "The calling thread's tier (TIER_AUTO: GHT_TORCH_TIER).");
  mod.def("host_tensor", &host_tensor, nb::arg("nbytes"), nb::arg("tensor_class"),
          "Uninitialised host-tier memory of ghtier (pinned where CUDA exists) as a uint8 torch tensor.");
  mod.def("where", &where, nb::arg("address"), "Where a ghtier block lives (None if not ghtier's).");

  mod.def("adamw", &adamw, nb::arg("master"), nb::arg("m"), nb::arg("v"), nb::arg("grad"),
          nb::arg("grad_dtype"), nb::arg("weight"), nb::arg("n"), nb::arg("state"), nb::arg("lr"),
          nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"),
          nb::arg("step"), nb::arg("grad_scale"), nb::arg("key"), nb::arg("threads"),
          "ghtier's host AdamW (adamw_cpu) on host addresses; weight (bf16) may be 0.");
#ifdef GHT_HAVE_CUDA
  mod.def("adamw_gpu", &adamw_gpu, nb::arg("master"), nb::arg("m"), nb::arg("v"), nb::arg("grad"),
          nb::arg("grad_dtype"), nb::arg("weight"), nb::arg("n"), nb::arg("state"), nb::arg("lr"),
          nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"),
          nb::arg("step"), nb::arg("grad_scale"), nb::arg("key"), nb::arg("stream"), nb::arg("first") = 0,
          "ghtier's GPU AdamW (adamw_gpu), queued on a CUDA stream; master/m/v in HBM or mapped host memory.");
  mod.def("gpu_reachable", &gpu_reachable, nb::arg("address"),
          "Whether a GPU kernel can read this address (device memory, or pinned mapped host memory).");
#endif
  mod.def("link_kind", [] { return std::string(ght::to_string(ght::tier::topology().link)); },
          "How this machine's GPU reaches host memory: c2c, pcie or none (tier/topology.hpp).");
  mod.def("grad_sumsq", [](std::uintptr_t grad, const std::string& dtype, std::size_t n, int threads) {
    const opt::GradType t = parse_grad(dtype);
    nb::gil_scoped_release unlocked;
    return opt::grad_sumsq_cpu(ptr<const void>(grad), t, n, threads);
  }, nb::arg("grad"), nb::arg("dtype"), nb::arg("n"), nb::arg("threads") = 0,
     "Sum of squares (double, reproducible for any thread count) of n host gradients.");
  mod.def("q8_quantize", [](std::uintptr_t x, std::size_t n, std::uintptr_t records, bool is_v) {
    opt::q8_quantize(ptr<const float>(x), n, ptr<std::uint8_t>(records), is_v);
  }, nb::arg("x"), nb::arg("n"), nb::arg("records"), nb::arg("is_v"));
  mod.def("q8_dequantize", [](std::uintptr_t records, std::size_t n, std::uintptr_t x, bool is_v) {
    opt::q8_dequantize(ptr<const std::uint8_t>(records), n, ptr<float>(x), is_v);
  }, nb::arg("records"), nb::arg("n"), nb::arg("x"), nb::arg("is_v"));
  mod.def("state_bytes", [](const std::string& state, std::size_t n) {
    return opt::state_bytes(parse_state(state), n);
  }, nb::arg("state"), nb::arg("n"), "Bytes of n elements of m (or v) of this state type.");
  mod.def("round_key", [](const std::string& name) { return opt::round_key(name); }, nb::arg("name"));
  mod.def("cpu_threads", [](int requested) { return opt::resolve_cpu_threads(requested); },
          nb::arg("requested") = 0, "Threads the host AdamW uses (GHT_CPU_THREADS, else the host node's cores).");
}
