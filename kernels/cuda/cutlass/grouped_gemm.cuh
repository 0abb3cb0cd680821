#pragma once
/**
 * @file grouped_gemm.cuh
 * @brief The CUTLASS sm90 pointer-array grouped GEMM behind GroupedGemmImpl::cutlass, as one
 * template; each instantiation lives in its own translation unit (grouped_*.cu here), compiled
 * for sm_90a only (wgmma and TMA), because CUTLASS templates compile slowly.
 *
 * Problem sizes stay on the device. One tiny kernel (prepare_groups) turns the (E+1) expert
 * offsets into CUTLASS's per-group arrays (problem shape, A/B/C/D pointers, strides) in a stream
 * scratch buffer; the persistent kernel then reads them there. Without host problem shapes
 * CUTLASS launches one CTA per SM and walks the groups' tiles itself, so nothing on the host ever
 * waits for the routing: no stream synchronisation, and the call can be captured in a CUDA graph
 * (once the scratch buffer has grown to size).
 *
 * Row-major operands in CUTLASS's (M, K) x (N, K) -> (M, N) terms:
 *   var-M   A = act rows (M_e, k) RowMajor; B_e (k, n): stored (n, k) row-major = ColumnMajor
 *           (trans_b), stored (k, n) row-major = RowMajor; C/D (M_e, n) RowMajor.
 *   var-K   A = A_e^T (m, R_e): A stored (R_e, m) row-major = ColumnMajor; B_e (R_e, n): stored
 *           row-major = RowMajor (N contiguous); C/D (m, n) RowMajor.
 * A group with no rows gets M = 0 and is skipped by the scheduler (var-K: its K would be 0; the
 * caller applies C_e = beta·C_e to those groups separately when beta != 1).
 * D = alpha·acc + beta·C in place (C = D); with beta = 0 CUTLASS never reads C.
 */
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "kernels/cuda/cutlass/grouped_gemm.hpp"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda::cutlass_grouped {

/// A stride type of CUTLASS's (one dynamic leading dimension, the other modes static).
template <class Stride>
__host__ __device__ Stride stride_with_ld(std::int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

template <class G>
__global__ void prepare_groups(Problem p, typename G::Arrays out);

/// The kernel schedule: cooperative (two consumer warp groups share each output tile). Ping-pong
/// (one warp group per tile) was measured for the data and the weight-gradient GEMMs and lost
/// (bench/NOTES.md, "CUTLASS tile variants for the expert data GEMMs").
struct Cooperative {
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
using Tile128x128 = cute::Shape<cute::_128, cute::_128, cute::_64>;
using Tile128x256 = cute::Shape<cute::_128, cute::_256, cute::_64>;

// Tiles of 128 rows: an expert holds a few hundred rows, so a taller tile wastes more of its
// last one. No clusters: the expert GEMMs' tiles are few per group, and a cluster's second CTA
// would often have no tile of the same group to share its loads with.
template <class LayoutA, class LayoutB, class ElementC_, class TileShape_ = Tile128x128,
          class Schedule = Cooperative>
struct GroupedGemm {
  using ElementAB = cutlass::bfloat16_t;
  using ElementC = ElementC_;
  using ElementAcc = float;
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 8;                          // 16 bytes of bf16
  static constexpr int kAlignC = 16 / sizeof(ElementC);       // 16 bytes of C
  using TileShape = TileShape_;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementAcc, ElementC, LayoutC*,
      kAlignC, ElementC, LayoutC*, kAlignC, typename Schedule::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<ElementC, ElementAcc>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA*, kAlignAB, ElementAB,
      LayoutB*, kAlignAB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::Mainloop>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;

  /// The per-group arrays, carved out of one scratch buffer.
  struct Arrays {
    Shape* shapes;
    const ElementAB** a;
    const ElementAB** b;
    const ElementC** c;
    ElementC** d;
    StrideA* sa;
    StrideB* sb;
    StrideC* sc;
    StrideD* sd;
  };

  static void run(const Problem& p, cudaStream_t stream) {
    const auto E = static_cast<std::size_t>(p.groups);
    const std::size_t sizes[] = {E * sizeof(Shape),   E * sizeof(void*),   E * sizeof(void*),
                                 E * sizeof(void*),   E * sizeof(void*),   E * sizeof(StrideA),
                                 E * sizeof(StrideB), E * sizeof(StrideC), E * sizeof(StrideD)};
    std::size_t arrays_bytes = 0;
    for (std::size_t s : sizes) arrays_bytes += scratch_align(s);

    typename Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.hw_info.device_id = p.device;
    args.hw_info.sm_count = p.sm_count;
    // Pointers into the scratch buffer are filled in below; the workspace size does not depend
    // on them (it is per SM: one set of TMA descriptors each, plus the scheduler's).
    args.problem_shape = {p.groups, nullptr, nullptr};
    auto& f = args.epilogue.thread;
    f.alpha = p.alpha;
    f.beta = p.beta;
    f.alpha_ptr = nullptr;
    f.beta_ptr = nullptr;
    const std::size_t ws_bytes = Gemm::get_workspace_size(args);

    char* base = static_cast<char*>(stream_scratch(stream, arrays_bytes + scratch_align(ws_bytes)));
    char* cur = base;
    auto take = [&](std::size_t i) {
      char* r = cur;
      cur += scratch_align(sizes[i]);
      return r;
    };
    Arrays arr{};
    arr.shapes = reinterpret_cast<Shape*>(take(0));
    arr.a = reinterpret_cast<const ElementAB**>(take(1));
    arr.b = reinterpret_cast<const ElementAB**>(take(2));
    arr.c = reinterpret_cast<const ElementC**>(take(3));
    arr.d = reinterpret_cast<ElementC**>(take(4));
    arr.sa = reinterpret_cast<StrideA*>(take(5));
    arr.sb = reinterpret_cast<StrideB*>(take(6));
    arr.sc = reinterpret_cast<StrideC*>(take(7));
    arr.sd = reinterpret_cast<StrideD*>(take(8));
    void* workspace = base + arrays_bytes;

    const int threads = 128, blocks = static_cast<int>((E + threads - 1) / threads);
    prepare_groups<GroupedGemm><<<blocks, threads, 0, stream>>>(p, arr);
    GHT_CUDA_TRY(cudaGetLastError());

    args.problem_shape = {p.groups, arr.shapes, nullptr};
    args.mainloop = {arr.a, arr.sa, arr.b, arr.sb};
    args.epilogue.ptr_C = arr.c;
    args.epilogue.dC = arr.sc;
    args.epilogue.ptr_D = arr.d;
    args.epilogue.dD = arr.sd;

    Gemm gemm;
    const cutlass::Status can = gemm.can_implement(args);
    GHT_EXPECTS(can == cutlass::Status::kSuccess,
                std::string("grouped_gemm(cutlass): CUTLASS cannot run this problem: ") +
                    cutlassGetStatusString(can));
    const cutlass::Status init = gemm.initialize(args, workspace, stream);
    if (init != cutlass::Status::kSuccess) {
      GHT_FAIL(std::string("grouped_gemm(cutlass): initialize failed: ") + cutlassGetStatusString(init));
    }
    const cutlass::Status ran = gemm.run(stream);
    if (ran != cutlass::Status::kSuccess) {
      GHT_FAIL(std::string("grouped_gemm(cutlass): launch failed: ") + cutlassGetStatusString(ran) +
               " (" + cudaGetErrorString(cudaGetLastError()) + ")");
    }
  }
};

/// Fill the per-group arrays from the offsets (one thread per group).
template <class G>
__global__ void prepare_groups(Problem p, typename G::Arrays out) {
  using ElementAB = typename G::ElementAB;
  using ElementC = typename G::ElementC;
  using Shape = typename G::Shape;
  for (int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); e < p.groups;
       e += static_cast<int>(gridDim.x * blockDim.x)) {
    const std::int64_t r0 = p.offsets[e];
    const int rows = p.offsets[e + 1] - p.offsets[e];
    const auto* a = static_cast<const ElementAB*>(p.a);
    const auto* b = static_cast<const ElementAB*>(p.b);
    auto* c = static_cast<ElementC*>(p.c);
    if (!p.var_k) {
      out.shapes[e] = Shape{rows, static_cast<int>(p.n), static_cast<int>(p.k)};
      out.a[e] = a + r0 * p.lda;
      out.b[e] = b + e * p.stride_b;
      out.d[e] = c + r0 * p.ldc;
    } else {
      out.shapes[e] = Shape{rows > 0 ? static_cast<int>(p.m) : 0, static_cast<int>(p.n), rows};
      out.a[e] = a + r0 * p.lda;
      out.b[e] = b + r0 * p.ldb;
      out.d[e] = c + e * p.stride_c;
    }
    out.c[e] = out.d[e];
    out.sa[e] = stride_with_ld<typename G::StrideA>(p.lda);
    out.sb[e] = stride_with_ld<typename G::StrideB>(p.ldb);
    out.sc[e] = stride_with_ld<typename G::StrideC>(p.ldc);
    out.sd[e] = stride_with_ld<typename G::StrideD>(p.ldc);
  }
}

}  // namespace ght::kernels::cuda::cutlass_grouped
