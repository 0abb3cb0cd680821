// bench_optimizer: every AdamW path and the CPU gradient accumulator as a fraction of a roofline
// measured in the same process.
//
//   gpu_link  (state in pinned host memory, grads and weights in HBM)
//             link bytes per parameter: 12 read (master, m, v) + 12 written = 24 (fp32 state;
//             16 with bf16 m/v, 12.06 with q8: GHT_OPT_STATE);
//             roofline = bidirectional pinned memcpy bandwidth (two streams) / those bytes
//   device    (all in HBM) bytes per parameter 28; roofline = HBM copy bandwidth / 28 B
//   cpu       host rows (bench_cpu.cpp) against host triad with the same pinned threads; the
//             AdamW-class cpu step with device grads and weights adds the staged copies
//   accumulate pipeline (bf16 grads from HBM, D2H through pinned staging, added on the host):
//             host bytes per parameter 12 (DMA writes staging 2, add reads it 2, dst 4 + 4),
//             link bytes 2 D2H; roofline = min(triad / 12 B, D2H memcpy / 2 B)
//   split     (--split-params N: GHT_OPTIMIZER=split over N parameters in --split-regions equal
//             regions, fp32 gradients and bf16 weights in HBM as the trainer has them) the step at
//             several CPU shares: 0 (all over the link), 1 (all on the host cores), the cost
//             model's best share and around it, each against tier::evaluate_update_split with this
//             run's link and triad and the CPU rate measured at share 1, so the best measured share
//             can be compared with the predicted one
// Each measurement: one warm-up, then --runs timed runs; median and spread (max-min)/median.
// Also prints the plan's predicted optimizer link seconds next to the measured ones.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <atomic>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "kernels/cuda/gemm.hpp"
#include "optimizer/accumulate.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/cpu_threads.hpp"
#include "tier/cost_model.hpp"
#include "tier/cuda_check.hpp"
#include "tier/link.hpp"

namespace ght::bench {
namespace {

using optimizer::GradType;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { GHT_CUDA_TRY(cudaMalloc(&p_, bytes)); }
  ~DeviceBuffer() { (void)cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  [[nodiscard]] void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    GHT_CUDA_TRY(cudaHostAlloc(&p_, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    GHT_CUDA_TRY(cudaHostGetDevicePointer(&d_, p_, 0));
  }
  ~PinnedBuffer() { (void)cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  [[nodiscard]] void* host() const { return p_; }
  [[nodiscard]] void* dev() const { return d_; }

 private:
  void* p_ = nullptr;
  void* d_ = nullptr;
};

class Stream {
 public:
  Stream() { GHT_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }  // NOLINT: a handle

 private:
  cudaStream_t s_ = nullptr;
};

__global__ void read_kernel(const float4* __restrict__ src, std::size_t n4, float* sink) {
  float acc = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride) {
    const float4 x = __ldcs(src + i);
    acc += x.x + x.y + x.z + x.w;
  }
  if (acc == -1.2345f) *sink = acc;  // never true for our data; keeps the loads alive
}

__global__ void write_kernel(float4* __restrict__ dst, std::size_t n4, float val) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride) {
    __stcs(dst + i, make_float4(val, val, val, val));
  }
}

__global__ void fill_grad_f32_kernel(float* g, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    g[i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;
  }
}

__global__ void fill_grad_kernel(std::uint16_t* g, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    g[i] = optimizer::float_to_bf16_bits(1e-3f * static_cast<float>(i % 97) - 0.05f);
  }
}

unsigned full_grid() {
  int dev = 0, sms = 0;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  GHT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return static_cast<unsigned>(sms * 8);
}

/// Link and HBM ceilings, measured here so they share the run's conditions.
tier::LinkNumbers measure_link(const Args& args, Report& report) {
  constexpr std::size_t kBytes = 1ull << 30;
  PinnedBuffer ha(kBytes), hb(kBytes);
  DeviceBuffer da(kBytes), db(kBytes), sink(64);
  std::memset(ha.host(), 0, kBytes);
  std::memset(hb.host(), 0, kBytes);
  GHT_CUDA_TRY(cudaMemset(da.get(), 0, kBytes));
  Stream s1, s2;
  auto sync = [&] {
    GHT_CUDA_TRY(cudaStreamSynchronize(s1));
    GHT_CUDA_TRY(cudaStreamSynchronize(s2));
  };
  const double b = static_cast<double>(kBytes);
  const Stats h2d = time_runs(args.runs, [&] {
    GHT_CUDA_TRY(cudaMemcpyAsync(da.get(), ha.host(), kBytes, cudaMemcpyHostToDevice, s1));
    sync();
  });
  const Stats d2h = time_runs(args.runs, [&] {
    GHT_CUDA_TRY(cudaMemcpyAsync(hb.host(), db.get(), kBytes, cudaMemcpyDeviceToHost, s2));
    sync();
  });
  const Stats bidir = time_runs(args.runs, [&] {
    GHT_CUDA_TRY(cudaMemcpyAsync(da.get(), ha.host(), kBytes, cudaMemcpyHostToDevice, s1));
    GHT_CUDA_TRY(cudaMemcpyAsync(hb.host(), db.get(), kBytes, cudaMemcpyDeviceToHost, s2));
    sync();
  });
  const std::size_t n4 = kBytes / sizeof(float4);
  const unsigned grid = full_grid();
  const Stats kread = time_runs(args.runs, [&] {
    read_kernel<<<grid, 256, 0, s1>>>(static_cast<const float4*>(ha.dev()), n4,
                                      static_cast<float*>(sink.get()));
    GHT_CUDA_CHECK_LAUNCH();
    sync();
  });
  const Stats kwrite = time_runs(args.runs, [&] {
    write_kernel<<<grid, 256, 0, s1>>>(static_cast<float4*>(hb.dev()), n4, 1.0f);
    GHT_CUDA_CHECK_LAUNCH();
    sync();
  });
  const Stats hbm = time_runs(args.runs, [&] {
    GHT_CUDA_TRY(cudaMemcpyAsync(db.get(), da.get(), kBytes, cudaMemcpyDeviceToDevice, s1));
    sync();
  });
  tier::LinkNumbers L;
  L.name = "bench_optimizer";
  L.source = "measured in this run";
  L.kind = LinkKind::pcie;  // informational only here
  L.h2d_bps = b / h2d.median;
  L.d2h_bps = b / d2h.median;
  L.bidir_bps = 2 * b / bidir.median;
  L.kernel_read_bps = b / kread.median;
  L.kernel_write_bps = b / kwrite.median;
  L.hbm_bps = 2 * b / hbm.median;  // read + write
  auto j = [](double bps, const Stats& s) {
    return nlohmann::json{{"bytes_per_s", bps}, {"spread", s.spread}};
  };
  report.extra["link"] = {{"h2d", j(L.h2d_bps, h2d)},
                          {"d2h", j(L.d2h_bps, d2h)},
                          {"bidir", j(L.bidir_bps, bidir)},
                          {"kernel_read_mapped", j(L.kernel_read_bps, kread)},
                          {"kernel_write_mapped", j(L.kernel_write_bps, kwrite)},
                          {"hbm_copy", j(L.hbm_bps, hbm)}};
  std::cout << "link: H2D " << fmt(L.h2d_bps / 1e9, 1) << " GB/s, D2H " << fmt(L.d2h_bps / 1e9, 1)
            << ", both ways " << fmt(L.bidir_bps / 1e9, 1) << " (spread "
            << fmt(100 * bidir.spread, 1) << "%), kernel read/write of mapped memory "
            << fmt(L.kernel_read_bps / 1e9, 1) << "/" << fmt(L.kernel_write_bps / 1e9, 1)
            << ", HBM copy " << fmt(L.hbm_bps / 1e9, 0) << " GB/s\n";
  return L;
}

/// One AdamW over `n` parameters, in one region or in regions of `per_region` (the last one
/// shorter; an MoE layer's experts are regions of a few million); grads (bf16) and weights in
/// HBM. batch_spans: AdamWOptions::batch_spans (0: GHT_OPT_BATCH).
struct Setup {
  DeviceBuffer grad, weight;
  std::unique_ptr<optimizer::AdamW> opt;
  Setup(std::uint64_t n, optimizer::PathChoice path, int threads,
        optimizer::LinkMode mode = optimizer::LinkMode::zero_copy, std::uint64_t per_region = 0,
        int batch_spans = 0)
      : grad(n * 2), weight(n * 2) {
    fill_grad_kernel<<<full_grid(), 256>>>(static_cast<std::uint16_t*>(grad.get()), n);
    GHT_CUDA_CHECK_LAUNCH();
    GHT_CUDA_TRY(cudaDeviceSynchronize());
    optimizer::AdamWOptions o;
    o.path = path;
    o.link_mode = mode;
    o.cpu_threads = threads;
    o.batch_spans = batch_spans;
    std::vector<optimizer::Region> rs;
    const std::uint64_t per = per_region > 0 ? per_region : n;
    for (std::uint64_t at = 0; at < n; at += per) {
      const std::uint64_t len = std::min(per, n - at);
      std::string name = "r";
      name += std::to_string(rs.size());
      rs.push_back({std::move(name), len, true, static_cast<std::uint16_t*>(weight.get()) + at,
                    static_cast<const std::uint16_t*>(grad.get()) + at, GradType::bf16});
    }
    opt = std::make_unique<optimizer::AdamW>(std::move(rs), o);
  }
};

/// The update phase alone (norm and decision outside the timed region): a warm-up, `runs` timed.
Stats time_update(int runs, optimizer::AdamW& opt) {
  std::vector<double> samples;
  for (int i = -1; i < runs; ++i) {
    (void)opt.begin_step(1e-4);
    const auto t0 = std::chrono::steady_clock::now();
    opt.update_all();
    opt.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 0) samples.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return summarize(samples);
}

/// The update phase alone, then the whole step.
void time_update_and_step(const Args& args, optimizer::AdamW& opt, Stats& update, Stats& step) {
  update = time_update(args.runs, opt);
  step = time_runs(args.runs, [&] {
    (void)opt.step(1e-4);
    opt.synchronize();
  });
}

/// One GHT_OPTIMIZER=split optimizer at a CPU share over `regions` equal regions: state on the
/// host, fp32 gradients and bf16 weights in HBM.
struct SplitSetup {
  DeviceBuffer grad, weight;
  std::unique_ptr<optimizer::AdamW> opt;
  std::uint64_t cpu_params = 0;
  SplitSetup(std::uint64_t n, int regions, double share, int threads) : grad(n * 4), weight(n * 2) {
    fill_grad_f32_kernel<<<full_grid(), 256>>>(static_cast<float*>(grad.get()), n);
    GHT_CUDA_CHECK_LAUNCH();
    GHT_CUDA_TRY(cudaDeviceSynchronize());
    optimizer::AdamWOptions o;
    o.path = optimizer::PathChoice::split;
    o.cpu_share = share;
    o.cpu_threads = threads;
    o.speculate_bytes = 0;
    o.speculate_host_bytes = 0;
    std::vector<optimizer::Region> rs;
    const std::uint64_t per = (n / static_cast<std::uint64_t>(regions) + 63) / 64 * 64;
    for (std::uint64_t off = 0, i = 0; off < n; off += per, ++i) {
      const std::uint64_t len = std::min(per, n - off);
      char name[32];
      std::snprintf(name, sizeof name, "r%llu", static_cast<unsigned long long>(i));
      rs.push_back({name, len, true, static_cast<std::uint16_t*>(weight.get()) + off,
                    static_cast<float*>(grad.get()) + off, GradType::fp32});
    }
    auto a = alloc::make_default_tiered_allocator();
    a->set_placement([](std::string_view, TensorClass cls) -> std::optional<TierKind> {
      if (cls == TensorClass::master || cls == TensorClass::adam_m || cls == TensorClass::adam_v) return TierKind::host;
      return std::nullopt;
    });
    opt = std::make_unique<optimizer::AdamW>(std::move(rs), o, std::move(a));
    for (std::size_t r = 0; r < opt->num_regions(); ++r) {
      if (opt->path(r) == optimizer::Path::cpu) cpu_params += opt->region(r).n;
    }
  }
};

/// The split sweep (see the file comment): a row per share, the predictions next to them.
void run_split(const Args& args, Report& report, const tier::LinkNumbers& link_measured, double triad) {
  const std::uint64_t n = args.split_params;
  tier::UpdateSplitInput in;
  in.params_grad_hbm = n;
  in.host_bps = triad;
  tier::LinkNumbers L = link_measured;
  L.host_triad_bps = triad;
  struct Point {
    double share = 0, achieved = 0;
    Stats update, step;
  };
  std::vector<Point> points;
  auto measure = [&](double share) {
    for (const Point& p : points) {
      if (p.share == share) return;
    }
    SplitSetup s(n, args.split_regions, share, args.threads);
    Point p;
    p.share = share;
    p.achieved = static_cast<double>(s.cpu_params) / static_cast<double>(n);
    time_update_and_step(args, *s.opt, p.update, p.step);
    std::cout << "split " << human_params(n) << " at CPU share " << fmt(share, 3) << " (reached "
              << fmt(p.achieved, 3) << "): update " << fmt(1e3 * p.update.median, 1) << " ms, "
              << fmt(static_cast<double>(n) / p.update.median / 1e9) << " Gparam/s\n";
    points.push_back(p);
  };
  measure(0.0);
  measure(1.0);
  // The CPU rate the model gets: what share 1 measured (the staged cpu path alone).
  in.cpu_params_per_s = static_cast<double>(n) / points[1].update.median;
  const tier::UpdateSplit best = tier::predict_update_split(in, L);
  tier::UpdateSplitInput in_default = in;
  in_default.cpu_params_per_s = 0;  // what GHT_OPT_CPU_SHARE=-1 uses: CPU AdamW at triad / 30 B
  const tier::UpdateSplit best_default = tier::predict_update_split(in_default, L);
  std::vector<double> shares = args.split_shares;
  if (shares.empty()) {
    for (double d : {0.0, -0.1, -0.05, 0.05, 0.1, 0.2}) shares.push_back(std::clamp(best.cpu_fraction + d, 0.0, 1.0));
    shares.push_back(best_default.cpu_fraction);
  }
  for (double f : shares) measure(f);
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.share < b.share; });
  const Point* fastest = &points.front();
  nlohmann::json rows = nlohmann::json::array();
  std::string table =
      "| CPU share asked | reached | update ms | step ms | Gparam/s | predicted ms | measured / predicted | limit |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const Point& p : points) {
    if (p.update.median < fastest->update.median) fastest = &p;
    const tier::UpdateSplit at = tier::evaluate_update_split(in, L, p.achieved);
    table += "| " + fmt(p.share, 3) + " | " + fmt(p.achieved, 3) + " | " + fmt(1e3 * p.update.median, 1) + " | " +
             fmt(1e3 * p.step.median, 1) + " | " + fmt(static_cast<double>(n) / p.update.median / 1e9) + " | " +
             fmt(1e3 * at.seconds, 1) + " | " + fmt(p.update.median / at.seconds, 2) + " | " + at.limit + " |\n";
    rows.push_back({{"share", p.share},
                    {"reached", p.achieved},
                    {"update_s", p.update.median},
                    {"update_spread", p.update.spread},
                    {"step_s", p.step.median},
                    {"predicted_s", at.seconds},
                    {"predicted_limit", at.limit}});
  }
  std::cout << "\nupdate split, " << human_params(n) << " parameters in " << args.split_regions
            << " regions (fp32 gradients in HBM), link " << fmt(L.bidir_bps / 1e9, 1) << " GB/s both ways, triad "
            << fmt(triad / 1e9, 1) << " GB/s, CPU path alone " << fmt(in.cpu_params_per_s / 1e9) << " Gparam/s:\n"
            << table << "predicted best share " << fmt(best.cpu_fraction, 3) << " (" << fmt(1e3 * best.seconds, 1)
            << " ms, limit " << best.limit << "; with the default CPU rate, triad / 30 B: "
            << fmt(best_default.cpu_fraction, 3) << "); fastest measured share " << fmt(fastest->share, 3)
            << " (reached " << fmt(fastest->achieved, 3) << ", " << fmt(1e3 * fastest->update.median, 1) << " ms, "
            << fmt(points.front().update.median / fastest->update.median, 3) << "x the all-link update)\n";
  report.extra["split"] = {{"params", n},
                           {"regions", args.split_regions},
                           {"cpu_params_per_s_measured", in.cpu_params_per_s},
                           {"predicted_best_share", best.cpu_fraction},
                           {"predicted_best_s", best.seconds},
                           {"predicted_best_share_default_cpu_rate", best_default.cpu_fraction},
                           {"fastest_share", fastest->share},
                           {"fastest_reached", fastest->achieved},
                           {"fastest_update_s", fastest->update.median},
                           {"points", rows}};
}

// One HBM pass per block (64 KiB read, 64 KiB written), so its blocks retire in microseconds and
// other kernels' blocks can take SMs between them: HBM traffic without holding the SMs.
__global__ void hbm_stream_kernel(float4* __restrict__ dst, const float4* __restrict__ src) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * 4096 + threadIdx.x;
#pragma unroll
  for (int j = 0; j < 16; ++j) dst[i + j * 256] = src[i + j * 256];
}

/// A load on a stream of its own, kept queued by a host thread until stop(): `batch` calls of
/// `enqueue`, a synchronisation, again. `done` counts the calls that finished.
class BackgroundLoad {
 public:
  BackgroundLoad(std::function<void(cudaStream_t)> enqueue, int batch)
      : thread_([this, f = std::move(enqueue), batch] {
          try {
            GHT_CUDA_TRY(cudaSetDevice(device_));
            while (!stop_.load()) {
              for (int i = 0; i < batch; ++i) f(stream_);
              GHT_CUDA_TRY(cudaStreamSynchronize(stream_));
              done_ += batch;
            }
          } catch (...) {
            error_ = std::current_exception();  // rethrown by stop(), on the caller's thread
          }
        }) {}
  ~BackgroundLoad() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  BackgroundLoad(const BackgroundLoad&) = delete;
  BackgroundLoad& operator=(const BackgroundLoad&) = delete;
  /// Calls finished per second since `since`.
  void mark() {
    since_ = std::chrono::steady_clock::now();
    done_at_mark_ = done_.load();
  }
  double rate() const {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
    return static_cast<double>(done_.load() - done_at_mark_) / s;
  }
  /// Ends the load; rethrows what failed in it.
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  int device_ = [] {
    int d = 0;
    GHT_CUDA_TRY(cudaGetDevice(&d));
    return d;
  }();
  Stream stream_;
  std::atomic<bool> stop_{false};
  std::atomic<long> done_{0};
  std::exception_ptr error_;
  long done_at_mark_ = 0;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::thread thread_;
};

/// Why does the dma update run up to 2x slower under a training step's compute (bench/NOTES.md,
/// "The update's slowdown beside compute")? Its AdamW kernels need SMs between the copies, and the trainer's GEMMs are
/// persistent kernels that hold every SM for their whole run (milliseconds), which no stream
/// priority can preempt. The update is timed alone and beside loads that separate the causes:
/// a persistent LM-head-sized GEMM on every SM and on fewer (cuBLASLt's SM count target), short
/// GEMMs, and an HBM stream whose blocks retire at once.
void run_beside(const Args& args, Report& report) {
  namespace kc = ght::kernels::cuda;
  const std::uint64_t n = args.beside_params;
  int dev = 0, sms = 0;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  GHT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  Setup s(n, optimizer::PathChoice::gpu_link, args.threads, optimizer::LinkMode::dma);
  // Operands of the largest GEMM (4096 x 151,936 x 4096: bench-h200's LM-head logits chunk).
  const std::int64_t M = 4096, N = 151936, K = 4096;
  DeviceBuffer a(M * K * 2), b(N * K * 2), c(M * N * 2);
  GHT_CUDA_TRY(cudaMemset(a.get(), 0, M * K * 2));
  GHT_CUDA_TRY(cudaMemset(b.get(), 0, N * K * 2));
  constexpr std::size_t kStreamBytes = std::size_t{1} << 30;
  DeviceBuffer hs(kStreamBytes), hd(kStreamBytes);
  GHT_CUDA_TRY(cudaMemset(hs.get(), 0, kStreamBytes));
  auto gemm = [&](std::int64_t m, std::int64_t nn, std::int64_t k, int target) {
    return [&, m, nn, k, target](cudaStream_t st) {
      kc::GemmArgs g;
      g.m = m;
      g.n = nn;
      g.k = k;
      g.a = static_cast<const __nv_bfloat16*>(a.get());
      g.b = static_cast<const __nv_bfloat16*>(b.get());
      g.trans_b = true;
      g.c = c.get();
      g.sm_count_target = target;
      kc::gemm(g, st);
    };
  };
  struct Load {
    std::string name;
    std::function<void(cudaStream_t)> f;
    int batch;
    double flops, bytes;  // per call
  };
  const double big = 2.0 * M * N * K, small = 2.0 * 4096.0 * 4096 * 4096;
  const std::vector<Load> loads = {
      {"none", nullptr, 0, 0, 0},
      {"GEMM 4096x151936x4096 (7 ms), every SM", gemm(M, N, K, 0), 2, big, 0},
      {"GEMM 4096x151936x4096, SM target " + std::to_string(sms - 8), gemm(M, N, K, sms - 8), 2, big, 0},
      {"GEMM 4096x151936x4096, SM target " + std::to_string(sms - 16), gemm(M, N, K, sms - 16), 2, big, 0},
      {"GEMM 4096^3 (0.2 ms), every SM", gemm(4096, 4096, 4096, 0), 32, small, 0},
      {"HBM stream (short blocks), 1 GiB copy", [&](cudaStream_t st) {
         hbm_stream_kernel<<<static_cast<unsigned>(kStreamBytes / (4096 * 16)), 256, 0, st>>>(
             static_cast<float4*>(hd.get()), static_cast<const float4*>(hs.get()));
         GHT_CUDA_CHECK_LAUNCH();
       }, 8, 0, 2.0 * kStreamBytes},
  };
  nlohmann::json rows = nlohmann::json::array();
  std::ostringstream table;
  table << "\n| load beside the gpu_link dma update of " << human_params(n)
        << " parameters | update s (median) | spread | x alone | load alone | load beside the update |\n"
        << "| --- | ---: | ---: | ---: | ---: | ---: |\n";
  double alone = 0;
  for (const auto& ld : loads) {
    double load_alone = 0, load_beside = 0;
    Stats up;
    if (!ld.f) {
      up = time_update(args.runs, *s.opt);
      alone = up.median;
    } else {
      BackgroundLoad bg(ld.f, ld.batch);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // warm: plans built, clocks up
      bg.mark();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      load_alone = bg.rate();
      bg.mark();
      up = time_update(args.runs, *s.opt);
      load_beside = bg.rate();
      bg.stop();
    }
    auto per_s = [&](double calls) {
      if (ld.flops > 0) return fmt(calls * ld.flops / 1e12, 0) + " TFLOP/s";
      if (ld.bytes > 0) return fmt(calls * ld.bytes / 1e9, 0) + " GB/s";
      return std::string("-");
    };
    table << "| " << ld.name << " | " << fmt(up.median, 4) << " | " << fmt(100 * up.spread, 1) << "% | "
          << fmt(up.median / alone, 2) << " | " << per_s(load_alone) << " | " << per_s(load_beside) << " |\n";
    rows.push_back({{"load", ld.name}, {"update_s", up.median}, {"spread", up.spread},
                    {"over_alone", up.median / alone}, {"load_alone_calls_per_s", load_alone},
                    {"load_beside_calls_per_s", load_beside}});
  }
  report.extra["update_beside_compute"] = {{"params", n}, {"rows", rows}};
  std::cout << table.str();
}

/// The roofline of a pair of rows: the bytes it charges per parameter, its Gparam/s and what it
/// rests on, and the torch baseline to compare with.
struct Roof {
  double bytes_per_param;
  double gparams;
  std::string basis;
  const char* torch_key;
};

/// An update row and a step row (norm + update) of `n` parameters, timed on `opt` and added to
/// the report; returns both, update first.
std::pair<Row, Row> timed_rows(const Args& args, optimizer::AdamW& opt, std::uint64_t n, const std::string& up_path,
                               const std::string& st_path, const Roof& roof, Report& report) {
  Row up, st;
  up.path = up_path;
  st.path = st_path;
  for (Row* r : {&up, &st}) {
    r->params = n;
    r->bytes_per_param = roof.bytes_per_param;
    r->roof_gparams = roof.gparams;
    r->roof_basis = roof.basis;
    r->torch_key = roof.torch_key;
  }
  time_update_and_step(args, opt, up.seconds, st.seconds);
  report.rows.push_back(up);
  report.rows.push_back(st);
  return {up, st};
}

/// The link numbers the planner would use (bidir_bps 0 when there are none) and what they are.
struct PlanLink {
  tier::LinkNumbers numbers;
  std::string name;
};

PlanLink plan_link_numbers() {
  PlanLink p;
  try {
    p.numbers = tier::resolve_link_numbers();
    p.name = p.numbers.name + " (" + p.numbers.source + ")";
  } catch (const std::exception& e) {
    p.name = std::string("unavailable: ") + e.what();
  }
  return p;
}

/// gpu_link: state in pinned host memory, both link modes; each measured update against the
/// plan's prediction.
void run_gpu_link(const Args& args, Report& report, std::uint64_t n, const tier::LinkNumbers& L,
                  const PlanLink& plan, nlohmann::json& predictions) {
  // Master, m and v of the state type set (GHT_OPT_STATE), each way.
  const double state = optimizer::state_bytes_per_param(optimizer::state_type_from_config());
  const std::string link_basis = "bidir memcpy " + fmt(L.bidir_bps / 1e9, 1) + " GB/s / " + fmt(2 * state, 2) + " B";
  for (const optimizer::LinkMode mode : {optimizer::LinkMode::zero_copy, optimizer::LinkMode::dma}) {
    const std::string m(optimizer::to_string(mode));
    Setup s(n, optimizer::PathChoice::gpu_link, args.threads, mode);
    const Row up = timed_rows(args, *s.opt, n, "gpu_link " + m + " update", "gpu_link " + m + " step (norm + update)",
                              {2 * state, L.bidir_bps / (2 * state) / 1e9, link_basis, "torch_fused_cuda"}, report).first;
    std::cout << "gpu_link " << m << " " << human_params(n) << ": " << fmt(up.gparams())
              << " Gparam/s (" << fmt(100 * up.fraction(), 1) << "% of the link roofline), "
              << s.opt->num_chunks(0) << " chunks\n";
    const double pred_run = tier::predict_optimizer_link(n, 0.0, L, state).seconds;
    nlohmann::json p{{"params", n},
                     {"link_mode", m},
                     {"measured_update_s", up.seconds.median},
                     {"predicted_s_with_this_runs_link_numbers", pred_run},
                     {"measured_over_predicted_this_run", up.seconds.median / pred_run}};
    std::string line = "plan prediction, gpu_link " + m + " " + human_params(n) + ": measured " +
                       fmt(up.seconds.median, 4) + " s; predicted " + fmt(pred_run, 4) +
                       " s with this run's link numbers (x" +
                       fmt(up.seconds.median / pred_run, 2) + ")";
    if (plan.numbers.bidir_bps > 0 || plan.numbers.kernel_read_bps > 0) {
      const double pred_plan = tier::predict_optimizer_link(n, 0.0, plan.numbers, state).seconds;
      p["predicted_s_with_plan_link_numbers"] = pred_plan;
      p["plan_link_numbers"] = plan.name;
      p["measured_over_predicted_plan"] = up.seconds.median / pred_plan;
      line += ", " + fmt(pred_plan, 4) + " s with the plan's numbers " + plan.name + " (x" +
              fmt(up.seconds.median / pred_plan, 2) + ")";
    } else {
      line += "; plan link numbers " + plan.name;
    }
    predictions.push_back(p);
    report.notes.push_back(line);
  }
}

/// device: all state in HBM; one region, then expert-sized regions at one launch per region
/// against AdamWBatch's.
void run_device(const Args& args, Report& report, std::uint64_t n, const tier::LinkNumbers& L) {
  const double adamw_bytes = tier::adamw_bytes_per_param(2);  // bf16 gradient: 28 B
  const Roof roof{adamw_bytes, L.hbm_bps / adamw_bytes / 1e9,
                  "HBM copy " + fmt(L.hbm_bps / 1e9, 0) + " GB/s / " + fmt(adamw_bytes, 0) + " B", "torch_fused_cuda"};
  auto device_rows = [&](optimizer::AdamW& opt, const std::string& what) {
    const auto [up, st] =
        timed_rows(args, opt, n, "device update" + what, "device step (norm + update)" + what, roof, report);
    std::cout << up.path << " " << human_params(n) << ": " << fmt(up.gparams()) << " Gparam/s ("
              << fmt(100 * up.fraction(), 1) << "% of " << up.roof_basis << "); step " << fmt(st.gparams())
              << " Gparam/s\n";
  };
  {
    Setup s(n, optimizer::PathChoice::device, args.threads);
    device_rows(*s.opt, "");
  }
  if (args.region_params > 0 && args.region_params < n) {
    for (const int batch : {1, optimizer::kAdamWBatchSpans}) {
      Setup s(n, optimizer::PathChoice::device, args.threads, optimizer::LinkMode::zero_copy, args.region_params,
              batch);
      device_rows(*s.opt, ", " + std::to_string(s.opt->num_regions()) + " regions of " +
                              human_params(args.region_params) + ", GHT_OPT_BATCH=" + std::to_string(batch));
    }
  }
}

/// cpu path of the AdamW class: grads down and weights up through staging.
void run_cpu_staged(const Args& args, Report& report, std::uint64_t n, double triad) {
  const double adamw_bytes = tier::adamw_bytes_per_param(2);
  Setup s(n, optimizer::PathChoice::cpu, args.threads);
  const Row up = timed_rows(args, *s.opt, n, "cpu update (staged grad D2H + weight H2D)", "cpu step (norm + staged update)",
                            {adamw_bytes, triad / adamw_bytes / 1e9,
                             "triad " + fmt(triad / 1e9, 1) + " GB/s / " + fmt(adamw_bytes, 0) + " B",
                             "torch_foreach_cpu"},
                            report).first;
  std::cout << "cpu (staged) " << human_params(n) << ": " << fmt(up.gparams())
            << " Gparam/s\n";
}

/// accumulator pipeline: device bf16 gradients into fp32 host accumulators.
void run_accumulate(const Args& args, Report& report, std::uint64_t n, const tier::LinkNumbers& L, double triad) {
  DeviceBuffer src(n * 2);
  fill_grad_kernel<<<full_grid(), 256>>>(static_cast<std::uint16_t*>(src.get()), n);
  GHT_CUDA_CHECK_LAUNCH();
  GHT_CUDA_TRY(cudaDeviceSynchronize());
  HostArray<float> dst(n);
  optimizer::zero_host(dst.data(), n * sizeof(float), args.threads);
  optimizer::GradStreamAccumulator::Options o;
  o.threads = args.threads;
  optimizer::GradStreamAccumulator acc(o);
  Row r;
  r.path = "accumulate pipeline (bf16 D2H + add)";
  r.params = n;
  r.bytes_per_param = 12;
  const double host_roof = triad / 12 / 1e9, link_roof = L.d2h_bps / 2 / 1e9;
  r.roof_gparams = std::min(host_roof, link_roof);
  r.roof_basis = host_roof <= link_roof ? "triad " + fmt(triad / 1e9, 1) + " GB/s / 12 B"
                                        : "D2H " + fmt(L.d2h_bps / 1e9, 1) + " GB/s / 2 B";
  r.seconds = time_runs(args.runs, [&] {
    acc.run(dst.data(), src.get(), GradType::bf16, n, optimizer::AccumulateMode::add);
  });
  report.rows.push_back(r);
  std::cout << r.path << " " << human_params(n) << ": " << fmt(r.gparams()) << " Gparam/s ("
            << fmt(100 * r.fraction(), 1) << "% of " << r.roof_basis << ")\n";
}

void run_gpu(const Args& args, Report& report) {
  int dev = 0;
  GHT_CUDA_TRY(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  GHT_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  report.extra["gpu"] = {{"name", prop.name}, {"sms", prop.multiProcessorCount}};
  const tier::LinkNumbers L = measure_link(args, report);
  const PlanLink plan = plan_link_numbers();
  const double triad = report.extra.contains("host_triad")
                           ? report.extra["host_triad"]["bytes_per_s"].get<double>()
                           : 0.0;
  nlohmann::json predictions = nlohmann::json::array();
  for (const std::uint64_t n : args.sizes) {
    run_gpu_link(args, report, n, L, plan, predictions);
    run_device(args, report, n, L);
    if (triad > 0) run_cpu_staged(args, report, n, triad);
    if (triad > 0) run_accumulate(args, report, n, L, triad);
  }
  report.extra["prediction"] = predictions;
  if (args.beside_params > 0) run_beside(args, report);
  if (args.split_params > 0) {
    if (triad > 0) {
      run_split(args, report, L, triad);
    } else {
      report.notes.push_back("the split sweep needs the host triad: run it without --skip-cpu");
    }
  }
}

}  // namespace
}  // namespace ght::bench

int main(int argc, char** argv) {
  using namespace ght::bench;
  return bench_main(argc, argv, "cuda", [](const Args& args, Report& report) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      (void)cudaGetLastError();
      report.notes.push_back("no CUDA device: gpu_link and device rows are not measured");
    } else if (!args.skip_gpu) {
      run_gpu(args, report);
    }
  });
}
