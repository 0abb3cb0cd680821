// CUTLASS block-scaled FP8 grouped GEMM var_m_bt_fp8_blockwise (A e4m3 RowMajor with 1x128 scales,
// B e4m3 ColumnMajor with 128x128 scales, bf16 C, 128x128x128 tiles, cooperative); see
// grouped_fp8.hpp for the contract and grouped_gemm.cuh for how a grouped call runs.
//
// CUTLASS's blockwise mainloop (MainloopSm90ArrayTmaGmmaWarpSpecializedBlockwise) loads A and B
// with TMA and the scales with cp.async, one K tile of 128 at a time, runs that tile's WGMMAs
// into a zeroed register accumulator and adds it to the fp32 sum times sA·sB ("promotion" every
// tile: the finest granularity, which also bounds the tensor cores' reduced-precision FP8
// accumulation to 128 products). The scales' layout is derived inside the kernel from each
// group's (M, N, K), so sA must have exactly ceil(k/128) floats per row; both scale tensors are
// K-contiguous ("K-major"), the layout kernels/cuda/fp8_quant and kernels/cpu/fp8 write.
#include <cutlass/detail/blockwise_scale_layout.hpp>

#include "kernels/cuda/cutlass/grouped_fp8.hpp"
#include "kernels/cuda/cutlass/grouped_gemm.cuh"

namespace ght::kernels::cuda::cutlass_grouped {
namespace {

struct Fp8BlockwiseGemm {
  using ElementAB = cutlass::float_e4m3_t;
  using ElementC = cutlass::bfloat16_t;
  using ElementAcc = float;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // B_e stored (n, k) row-major
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;  // 16 bytes of e4m3
  static constexpr int kAlignC = 8;    // 16 bytes of bf16
  // 128 deep: one scale tile per pipeline stage. 128 wide: the blockwise mainloop keeps two
  // accumulators (the running sum and the tile's), which 128x256 would spill.
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;  // as grouped_gemm.cuh: no clusters
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K,
                                                                 cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementAcc, ElementC, LayoutC*, kAlignC,
      ElementC, LayoutC*, kAlignC, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementC, ElementAcc>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB,
      ElementAB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;

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
    const float** sfa;
    const float** sfb;
    const ElementC** c;
    ElementC** d;
    StrideA* sa;
    StrideB* sb;
    StrideC* sc;
    StrideD* sd;
    LayoutSFA* lsfa;
    LayoutSFB* lsfb;
  };
};

using G = Fp8BlockwiseGemm;

// One thread per group: shapes, pointers, strides and scale layouts from the offsets.
__global__ void prepare_fp8_groups(Fp8Problem p, G::Arrays out) {
  const auto k_tiles = static_cast<std::int64_t>((p.k + 127) / 128);
  for (int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); e < p.groups;
       e += static_cast<int>(gridDim.x * blockDim.x)) {
    const std::int64_t r0 = p.offsets[e];
    const int rows = p.offsets[e + 1] - p.offsets[e];
    const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    out.shapes[e] = G::Shape{rows, n, k};
    out.a[e] = static_cast<const G::ElementAB*>(p.a) + r0 * p.lda;
    out.b[e] = static_cast<const G::ElementAB*>(p.b) + e * p.stride_b;
    out.sfa[e] = p.sa + r0 * k_tiles;
    out.sfb[e] = p.sb + e * p.stride_sb;
    out.d[e] = static_cast<G::ElementC*>(p.c) + r0 * p.ldc;
    out.c[e] = out.d[e];
    out.sa[e] = stride_with_ld<G::StrideA>(p.lda);
    out.sb[e] = stride_with_ld<G::StrideB>(p.ldb);
    out.sc[e] = stride_with_ld<G::StrideC>(p.ldc);
    out.sd[e] = stride_with_ld<G::StrideD>(p.ldc);
    out.lsfa[e] = G::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(rows, n, k, 1));
    out.lsfb[e] = G::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(rows, n, k, 1));
  }
}

}  // namespace

void var_m_bt_fp8_blockwise(const Fp8Problem& p, cudaStream_t stream) {
  const auto E = static_cast<std::size_t>(p.groups);
  const std::size_t sizes[] = {E * sizeof(G::Shape),   E * sizeof(void*),       E * sizeof(void*),
                               E * sizeof(void*),      E * sizeof(void*),       E * sizeof(void*),
                               E * sizeof(void*),      E * sizeof(G::StrideA),  E * sizeof(G::StrideB),
                               E * sizeof(G::StrideC), E * sizeof(G::StrideD),  E * sizeof(G::LayoutSFA),
                               E * sizeof(G::LayoutSFB)};
  std::size_t arrays_bytes = 0;
  for (std::size_t s : sizes) arrays_bytes += scratch_align(s);

  G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.hw_info.device_id = p.device;
  args.hw_info.sm_count = p.sm_count;
  // The workspace (per-SM TMA descriptors and the scheduler's) does not depend on the arrays.
  args.problem_shape = {p.groups, nullptr, nullptr};
  auto& f = args.epilogue.thread;
  f.alpha = p.alpha;
  f.beta = p.beta;
  f.alpha_ptr = nullptr;
  f.beta_ptr = nullptr;
  const std::size_t ws_bytes = G::Gemm::get_workspace_size(args);

  char* base = static_cast<char*>(stream_scratch(stream, arrays_bytes + scratch_align(ws_bytes)));
  char* cur = base;
  auto take = [&](std::size_t i) {
    char* r = cur;
    cur += scratch_align(sizes[i]);
    return r;
  };
  G::Arrays arr{};
  arr.shapes = reinterpret_cast<G::Shape*>(take(0));
  arr.a = reinterpret_cast<const G::ElementAB**>(take(1));
  arr.b = reinterpret_cast<const G::ElementAB**>(take(2));
  arr.sfa = reinterpret_cast<const float**>(take(3));
  arr.sfb = reinterpret_cast<const float**>(take(4));
  arr.c = reinterpret_cast<const G::ElementC**>(take(5));
  arr.d = reinterpret_cast<G::ElementC**>(take(6));
  arr.sa = reinterpret_cast<G::StrideA*>(take(7));
  arr.sb = reinterpret_cast<G::StrideB*>(take(8));
  arr.sc = reinterpret_cast<G::StrideC*>(take(9));
  arr.sd = reinterpret_cast<G::StrideD*>(take(10));
  arr.lsfa = reinterpret_cast<G::LayoutSFA*>(take(11));
  arr.lsfb = reinterpret_cast<G::LayoutSFB*>(take(12));
  void* workspace = base + arrays_bytes;

  const int threads = 128, blocks = static_cast<int>((E + threads - 1) / threads);
  prepare_fp8_groups<<<blocks, threads, 0, stream>>>(p, arr);
  GHT_CUDA_TRY(cudaGetLastError());

  args.problem_shape = {p.groups, arr.shapes, nullptr};
  args.mainloop = {arr.a, arr.sa, arr.b, arr.sb, arr.sfa, arr.lsfa, arr.sfb, arr.lsfb};
  args.epilogue.ptr_C = arr.c;
  args.epilogue.dC = arr.sc;
  args.epilogue.ptr_D = arr.d;
  args.epilogue.dD = arr.sd;

  G::Gemm gemm;
  const cutlass::Status can = gemm.can_implement(args);
  GHT_EXPECTS(can == cutlass::Status::kSuccess,
              std::string("grouped_gemm_fp8(cutlass): CUTLASS cannot run this problem: ") +
                  cutlassGetStatusString(can));
  const cutlass::Status init = gemm.initialize(args, workspace, stream);
  if (init != cutlass::Status::kSuccess) {
    GHT_FAIL(std::string("grouped_gemm_fp8(cutlass): initialize failed: ") + cutlassGetStatusString(init));
  }
  const cutlass::Status ran = gemm.run(stream);
  if (ran != cutlass::Status::kSuccess) {
    GHT_FAIL(std::string("grouped_gemm_fp8(cutlass): launch failed: ") + cutlassGetStatusString(ran) + " (" +
             cudaGetErrorString(cudaGetLastError()) + ")");
  }
}

}  // namespace ght::kernels::cuda::cutlass_grouped
