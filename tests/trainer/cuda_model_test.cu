// The CUDA model (trainer/cuda/model_cuda.hpp) against the fp32 CPU model (trainer/model.hpp).
//
// Both models get the same weights (the CPU model's random init rounded to bf16, so that weight
// rounding is not part of the measured error) and the same random tokens; the GPU computes with
// bf16 activations and fp32 accumulation. Error measures, per compared tensor:
//   rel_l2 = ||g - r||_2 / ||r||_2      cosine = <g, r> / (||g||·||r||)
// With top_k = experts (no discrete routing choice) gradients must reach rel_l2 <= 2e-2 and
// cosine >= 0.999. With top_k < experts a routing decision can flip for a token whose k-th and
// (k+1)-th router logits nearly tie (bf16 vs fp32 inputs); such a flip moves one token between
// experts, so that case checks the loss (1e-2 relative), cosine >= 0.99, and that >= 97% of the
// routing assignments agree.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "common/gpu.hpp"
#include "common/registry.hpp"
#include "common/vector_compare.hpp"
#include "optimizer/bf16.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/cuda/train_cuda.hpp"
#include "trainer/data.hpp"
#include "trainer/model.hpp"
#include "trainer/train.hpp"
#include "trainer/model_config.hpp"
#include "trainer/train_run_util.hpp"

namespace ght::trainer {
namespace {

using test::read_log;
using test::RunLog;
using test::small_run_config;
using ght::test::TempDir;
using test::write_random_corpus;

ModelConfig test_config(int top_k) {
  // The `small` preset's widths (d 256, 8 heads of 32, 2 kv heads, 8 experts of 256, byte
  // vocabulary) with 2 layers and 2 x 64 tokens, so the CPU reference runs in well under a second.
  ModelConfig c = preset("small");
  c.layers = 2;
  c.seq_len = 64;
  c.micro_batch = 2;
  c.top_k = top_k;
  return c;
}

struct Batch2 {
  std::vector<std::int32_t> tokens, targets;
};

Batch2 random_batch(const ModelConfig& c, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab - 1);
  const std::size_t n = static_cast<std::size_t>(c.micro_batch) * c.seq_len;
  Batch2 b;
  b.tokens.resize(n);
  b.targets.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    b.tokens[i] = tok(gen);
    b.targets[i] = (i % 17 == 5) ? kIgnoreIndex : tok(gen);  // some ignored targets
  }
  return b;
}

void round_params_to_bf16(MoEModel<float>& m) {
  for (float& x : m.params()) x = optimizer::bf16_bits_to_float(optimizer::float_to_bf16_bits(x));
}

// The CPU model's init for `seed`, rounded to bf16: the weights a GPU-only test loads.
std::vector<float> rounded_init(const ModelConfig& c, std::uint64_t seed) {
  MoEModel<float> cpu(c);
  cpu.init(seed);
  round_params_to_bf16(cpu);
  const auto p = cpu.params();
  return {p.begin(), p.end()};
}

using Cmp = ght::test::VectorError;
constexpr auto compare = ght::test::compare_vectors;

const std::vector<std::string>& checked_tensors() {
  static const std::vector<std::string> names = {
      "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.1.mlp.gate.weight",
      "model.layers.0.mlp.experts.3.down_proj.weight",
      "model.norm.weight",
  };
  return names;
}

std::vector<float> host_grads(const CudaMoEModel& m) {
  std::vector<float> g(m.num_params());
  m.store_grads(g);
  return g;
}

std::span<const float> slice(const std::vector<float>& v, const NamedTensor& t) {
  return std::span<const float>(v).subspan(t.offset, t.numel);
}

// ---- CPU-only checks (run in every CUDA build, GPU or not) ---------------------------------

TEST(CudaModelLayout, TensorListMatchesCpuModel) {
  for (const char* name : {"tiny", "small"}) {
    for (bool tied : {true, false}) {
      ModelConfig c = preset(name);
      c.tied_embeddings = tied;
      MoEModel<float> cpu(c);
      const auto list = model_tensor_list(c);
      ASSERT_EQ(list.size(), cpu.tensors().size()) << name;
      for (std::size_t i = 0; i < list.size(); ++i) {
        const auto& a = list[i];
        const auto& b = cpu.tensors()[i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.shape, b.shape) << a.name;
        EXPECT_EQ(a.offset, b.offset) << a.name;
        EXPECT_EQ(a.numel, b.numel) << a.name;
        EXPECT_EQ(a.decay, b.decay) << a.name;
      }
    }
  }
}

TEST(CudaModelLayout, InitMatchesCpuModelBitForBit) {
  ModelConfig odd;  // odd tensor sizes: tensors start on the sine half of a Box-Muller pair
  odd.d_model = 7;
  odd.heads = 2;
  odd.kv_heads = 1;
  odd.head_dim = 2;
  odd.experts = 3;
  odd.top_k = 1;
  odd.expert_ffn = 5;
  odd.vocab = 11;
  odd.tied_embeddings = false;
  ModelConfig tiny = preset("tiny");
  tiny.tied_embeddings = false;
  for (const ModelConfig& c : {odd, tiny}) {
    MoEModel<float> cpu(c);
    cpu.init(42);
    std::size_t tensors = 0, mismatches = 0;
    init_params_host(cpu.tensors(), 42, [&](std::size_t ti, std::span<const float> v) {
      const auto& t = cpu.tensors()[ti];
      ASSERT_EQ(v.size(), t.numel) << t.name;
      const float* ref = cpu.params().data() + t.offset;
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (std::memcmp(&v[i], &ref[i], sizeof(float)) != 0 && mismatches++ < 5) {
          ADD_FAILURE() << t.name << "[" << i << "]: " << v[i] << " vs CPU " << ref[i];
        }
      }
      ++tensors;
    });
    EXPECT_EQ(tensors, cpu.tensors().size());
    EXPECT_EQ(mismatches, 0u);
  }
}

// ---- GPU checks -----------------------------------------------------------------------------

// Two micro-batches accumulated with loss_scale 1/2 on both models; returns the CPU grads.
void run_pair(const ModelConfig& c, MoEModel<float>& cpu, CudaMoEModel& gpu, double loss_rel_tol,
              std::vector<Loss>* cpu_losses = nullptr) {
  cpu.zero_grad();
  gpu.zero_grad();
  for (int mb = 0; mb < 2; ++mb) {
    const Batch2 b = random_batch(c, 100 + static_cast<std::uint32_t>(mb));
    const Loss lc = cpu.forward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len);
    cpu.backward(0.5f);
    const Loss lg = gpu.forward_backward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 0.5f);
    EXPECT_EQ(lg.tokens, lc.tokens);
    EXPECT_NEAR(lg.ce, lc.ce, loss_rel_tol * std::abs(lc.ce)) << "micro-batch " << mb;
    EXPECT_NEAR(lg.total, lc.total, loss_rel_tol * std::abs(lc.total)) << "micro-batch " << mb;
    EXPECT_NEAR(lg.aux, lc.aux, 1e-2 * std::abs(lc.aux) + 1e-4) << "micro-batch " << mb;
    EXPECT_NEAR(lg.z, lc.z, 2e-2 * std::abs(lc.z) + 1e-4) << "micro-batch " << mb;
    if (cpu_losses != nullptr) cpu_losses->push_back(lc);
    std::printf("micro-batch %d: ce cpu %.6f gpu %.6f | aux cpu %.6f gpu %.6f | z cpu %.6f gpu %.6f\n", mb,
                lc.ce, lg.ce, lc.aux, lg.aux, lc.z, lg.z);
  }
}

TEST(CudaModel, LossAndGradientsMatchCpuWithoutRoutingChoice) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(/*top_k=*/8);  // every token uses every expert
  MoEModel<float> cpu(c);
  cpu.init(3);
  round_params_to_bf16(cpu);
  CudaMoEModel gpu(c);
  gpu.load_weights(cpu.params());
  run_pair(c, cpu, gpu, 1e-2);
  const auto g = host_grads(gpu);
  const std::vector<float> r(cpu.grads().begin(), cpu.grads().end());
  for (const auto& name : checked_tensors()) {
    const auto& t = cpu.tensor(name);
    const Cmp m = compare(slice(g, t), slice(r, t));
    std::printf("%-48s rel_l2 %.3e cosine %.6f\n", name.c_str(), m.rel_l2, m.cosine);
    EXPECT_LE(m.rel_l2, 2e-2) << name;
    EXPECT_GE(m.cosine, 0.999) << name;
  }
  const Cmp all = compare(g, r);
  std::printf("all gradients: rel_l2 %.3e cosine %.6f\n", all.rel_l2, all.cosine);
  EXPECT_LE(all.rel_l2, 2e-2);
}

TEST(CudaModel, LossAndGradientsMatchCpuWithTopK) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(/*top_k=*/2);
  MoEModel<float> cpu(c);
  cpu.init(4);
  round_params_to_bf16(cpu);
  CudaMoEModel gpu(c);
  gpu.load_weights(cpu.params());
  run_pair(c, cpu, gpu, 1e-2);
  // Routing of the last micro-batch, layer by layer.
  for (int l = 0; l < c.layers; ++l) {
    const auto got = gpu.topk_indices(l);
    const auto ref = cpu.topk_indices(l);
    ASSERT_EQ(got.size(), ref.size());
    std::size_t same = 0;
    for (std::size_t i = 0; i < got.size(); ++i) same += got[i] == ref[i];
    const double agree = static_cast<double>(same) / static_cast<double>(got.size());
    std::printf("layer %d routing agreement %.4f\n", l, agree);
    EXPECT_GE(agree, 0.97) << "layer " << l;
  }
  const auto g = host_grads(gpu);
  const std::vector<float> r(cpu.grads().begin(), cpu.grads().end());
  for (const auto& name : checked_tensors()) {
    const auto& t = cpu.tensor(name);
    const Cmp m = compare(slice(g, t), slice(r, t));
    std::printf("%-48s rel_l2 %.3e cosine %.6f\n", name.c_str(), m.rel_l2, m.cosine);
    EXPECT_GE(m.cosine, 0.99) << name;
  }
}

TEST(CudaModel, LogitsMatchCpu) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  MoEModel<float> cpu(c);
  cpu.init(5);
  round_params_to_bf16(cpu);
  CudaMoEModel gpu(c);
  gpu.load_weights(cpu.params());
  const Batch2 b = random_batch(c, 7);
  for (bool last_only : {true, false}) {
    const std::size_t rows = last_only ? c.micro_batch : static_cast<std::size_t>(c.micro_batch) * c.seq_len;
    std::vector<float> lc(rows * c.vocab), lg(rows * c.vocab);
    cpu.logits(lc.data(), b.tokens.data(), c.micro_batch, c.seq_len, last_only);
    gpu.logits(lg.data(), b.tokens.data(), c.micro_batch, c.seq_len, last_only);
    const Cmp m = compare(lg, lc);
    std::printf("logits (last_only %d): rel_l2 %.3e cosine %.6f\n", last_only, m.rel_l2, m.cosine);
    EXPECT_LE(m.rel_l2, 2e-2);
    EXPECT_GE(m.cosine, 0.999);
  }
}

TEST(CudaModel, InitOnDeviceEqualsRoundedCpuInit) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  MoEModel<float> cpu(c);
  cpu.init(9);
  round_params_to_bf16(cpu);
  CudaMoEModel gpu(c);
  gpu.init(9);
  std::vector<float> w(gpu.num_params());
  gpu.store_weights(w);
  std::size_t diff = 0;
  for (std::size_t i = 0; i < w.size(); ++i) diff += w[i] != cpu.params()[i];
  EXPECT_EQ(diff, 0u);
}

// Variants of the GPU model must agree with its reference configuration (same bf16 math; only
// summation order, GEMM algorithms and cuDNN's atomic dQ may differ).
TEST(CudaModel, VariantsAgree) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  MoEModel<float> cpu(c);
  cpu.init(6);
  round_params_to_bf16(cpu);
  const Batch2 b = random_batch(c, 11);
  auto grads_of = [&](CudaModelOptions o, bool fused, Loss* loss) {
    CudaMoEModel m(c, std::move(o));
    m.load_weights(cpu.params());
    m.zero_grad();
    if (fused) {
      *loss = m.forward_backward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 1.0f);
    } else {
      *loss = m.forward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len);
      m.backward(1.0f);
    }
    return host_grads(m);
  };
  Loss l_ref, l;
  const auto ref = grads_of({}, true, &l_ref);
  auto check = [&](const char* what, const std::vector<float>& g, const Loss& lv, double tol) {
    const Cmp m = compare(g, ref);
    std::printf("%-28s loss %.6f (ref %.6f) grads rel_l2 %.3e cosine %.6f\n", what, lv.total, l_ref.total,
                m.rel_l2, m.cosine);
    EXPECT_LE(m.rel_l2, tol) << what;
    EXPECT_NEAR(lv.total, l_ref.total, 1e-3 * std::abs(l_ref.total)) << what;
  };
  check("forward() + backward()", grads_of({}, false, &l), l, 1e-3);
  {
    CudaModelOptions o;
    o.recompute.assign(static_cast<std::size_t>(c.layers), true);
    check("recompute every layer", grads_of(o, true, &l), l, 1e-3);
  }
  {
    CudaModelOptions o;
    o.recompute = {false, true};
    check("recompute layer 1", grads_of(o, true, &l), l, 1e-3);
  }
  {
    CudaModelOptions o;
    o.expert_impl = kernels::cuda::GroupedGemmImpl::custom;
    check("custom grouped GEMM", grads_of(o, true, &l), l, 1e-2);
  }
  {
    CudaModelOptions o;
    o.expert_impl = kernels::cuda::GroupedGemmImpl::cublaslt_streams;
    check("per-expert GEMMs on side streams", grads_of(o, true, &l), l, 1e-3);
  }
  {
    CudaModelOptions o;
    o.grad_type = optimizer::GradType::bf16;
    check("bf16 gradients", grads_of(o, true, &l), l, 1e-2);
  }
  {
    CudaModelOptions o;
    o.attention_impl = kernels::cuda::AttentionImpl::fallback;
    check("fallback attention", grads_of(o, true, &l), l, 1e-2);
  }
  {
    CudaModelOptions o;
    o.ce_chunk_rows = 24;  // several chunks, the last one partial
    check("chunked LM head", grads_of(o, true, &l), l, 1e-3);
  }
}

// GHT_FUSED_KERNELS: the fused router + permutation and q/k norm + RoPE launches change nothing,
// bit for bit. Attention is the deterministic fallback (cuDNN's dQ uses atomics); a repeat of
// the fused run first shows the rest of the step is deterministic too.
TEST(CudaModel, FusedKernelsAreBitIdentical) {
  GHT_REQUIRE_GPU();
  for (int top_k : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "top_k " << top_k);
    const ModelConfig c = test_config(top_k);
    MoEModel<float> cpu(c);
    cpu.init(8);
    round_params_to_bf16(cpu);
    const Batch2 b = random_batch(c, 13);
    auto run = [&](bool fused, Loss* loss) {
      CudaModelOptions o;
      o.attention_impl = kernels::cuda::AttentionImpl::fallback;
      o.fused_kernels = fused;
      CudaMoEModel m(c, std::move(o));
      m.load_weights(cpu.params());
      m.zero_grad();
      *loss = m.forward_backward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 1.0f);
      return host_grads(m);
    };
    Loss l_fused, l_again, l_sep;
    const auto g_fused = run(true, &l_fused), g_again = run(true, &l_again), g_sep = run(false, &l_sep);
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    ASSERT_TRUE(same(g_fused, g_again)) << "the fused step is not deterministic by itself";
    ASSERT_EQ(l_fused.total, l_again.total);
    EXPECT_TRUE(same(g_fused, g_sep)) << "fused and separate kernels give different gradients";
    EXPECT_EQ(l_fused.ce, l_sep.ce);
    EXPECT_EQ(l_fused.aux, l_sep.aux);
    EXPECT_EQ(l_fused.z, l_sep.z);
  }
}

// CudaModelOptions::cuda_graphs: micro-batches replayed from a captured graph give the losses and
// gradients of eager runs bit for bit, new tokens included; a new loss scale is a new graph.
// Attention is the deterministic fallback (cuDNN's dQ uses atomics).
TEST(CudaModel, CudaGraphReplayIsBitIdenticalToEager) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  MoEModel<float> cpu(c);
  cpu.init(9);
  round_params_to_bf16(cpu);
  const Batch2 batches[] = {random_batch(c, 21), random_batch(c, 22), random_batch(c, 23)};
  // (batch, loss scale): warm-up, capture, replay, replay; then a new scale: warm-up, capture.
  const std::pair<int, float> plan[] = {{0, 0.25f}, {1, 0.25f}, {2, 0.25f}, {0, 0.25f},
                                        {1, 0.5f},  {2, 0.5f}};
  auto run = [&](bool graphs, std::vector<Loss>& losses, std::int64_t* launches) {
    CudaModelOptions o;
    o.attention_impl = kernels::cuda::AttentionImpl::fallback;
    o.cuda_graphs = graphs;
    CudaMoEModel m(c, std::move(o));
    m.load_weights(cpu.params());
    m.zero_grad();
    for (const auto& [bi, scale] : plan) {
      const Batch2& b = batches[bi];
      losses.push_back(m.forward_backward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, scale));
    }
    *launches = m.cuda_graph_launches();
    return host_grads(m);
  };
  std::vector<Loss> eager_l, graph_l;
  std::int64_t eager_launches = -1, graph_launches = -1;
  const auto eager = run(false, eager_l, &eager_launches), graphed = run(true, graph_l, &graph_launches);
  EXPECT_EQ(eager_launches, 0);
  ASSERT_EQ(graph_launches, 4) << "micro-batches 2, 3, 4 and 6 must run as graph launches";
  for (std::size_t i = 0; i < eager_l.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "micro-batch " << i);
    EXPECT_EQ(graph_l[i].ce, eager_l[i].ce);
    EXPECT_EQ(graph_l[i].aux, eager_l[i].aux);
    EXPECT_EQ(graph_l[i].z, eager_l[i].z);
    EXPECT_EQ(graph_l[i].tokens, eager_l[i].tokens);
  }
  ASSERT_EQ(eager.size(), graphed.size());
  EXPECT_EQ(std::memcmp(eager.data(), graphed.data(), eager.size() * sizeof(float)), 0)
      << "accumulated gradients differ between graph replays and eager runs";
}

// GradWrite::assign: a backward into a buffer of garbage (every byte 0xFF: NaN in fp32 and in
// bf16) gives the gradients of zero_grad() then GradWrite::add, value for value (a zero may
// differ in sign: beta 0 writes acc, beta 1 writes acc + 0), and a second micro-batch then adds
// to them as usual. Over fp32 and bf16 gradients, tied and untied embeddings, every expert GEMM
// path and a chunked LM head, with 64 experts and top-1 over 128 tokens so that some experts get
// no token (their var-K gradient is written by the empty-group path). Attention is the
// deterministic fallback (cuDNN's dQ uses atomics).
TEST(CudaModel, AssignedGradientsEqualZeroedThenAdded) {
  GHT_REQUIRE_GPU();
  namespace kc = kernels::cuda;
  std::vector<kc::GroupedGemmImpl> impls = {kc::GroupedGemmImpl::custom, kc::GroupedGemmImpl::cublaslt_streams};
  if (kc::cutlass_available()) impls.push_back(kc::GroupedGemmImpl::cutlass);
  for (const bool tied : {true, false}) {
    ModelConfig c = test_config(1);
    c.experts = 64;
    c.tied_embeddings = tied;
    const std::vector<float> w = rounded_init(c, 12);
    const Batch2 b1 = random_batch(c, 51), b2 = random_batch(c, 52);
    for (const kc::GroupedGemmImpl impl : impls) {
      for (const optimizer::GradType gt : {optimizer::GradType::fp32, optimizer::GradType::bf16}) {
        for (const std::int64_t chunk : {std::int64_t{0}, std::int64_t{24}}) {
          SCOPED_TRACE(::testing::Message() << (tied ? "tied" : "untied") << ", " << kc::to_string(impl) << ", "
                                            << (gt == optimizer::GradType::fp32 ? "fp32" : "bf16")
                                            << " gradients, LM head chunk " << chunk);
          // Gradients after the first micro-batch and after the second.
          auto run = [&](GradWrite first, std::vector<float>* after_first, int* empty_experts) {
            CudaModelOptions o;
            o.attention_impl = kc::AttentionImpl::fallback;
            o.expert_impl = impl;
            o.grad_type = gt;
            o.ce_chunk_rows = chunk;
            CudaMoEModel m(c, std::move(o));
            m.load_weights(w);
            if (first == GradWrite::add) {
              m.zero_grad();
            } else {
              EXPECT_EQ(cudaMemset(m.grads(), 0xFF, m.num_params() * optimizer::grad_type_size(gt)), cudaSuccess);
            }
            m.forward_backward_async(b1.tokens.data(), b1.targets.data(), c.micro_batch, c.seq_len, 0.5f, 0,
                                     nullptr, first);
            (void)m.collect_loss(0);
            *after_first = host_grads(m);
            std::set<std::int32_t> used;
            for (std::int32_t e : m.topk_indices(0)) used.insert(e);
            *empty_experts = c.experts - static_cast<int>(used.size());
            m.forward_backward_async(b2.tokens.data(), b2.targets.data(), c.micro_batch, c.seq_len, 0.5f, 1);
            (void)m.collect_loss(1);
            return host_grads(m);
          };
          std::vector<float> ref1, got1;
          int empty_ref = 0, empty_got = 0;
          const std::vector<float> ref2 = run(GradWrite::add, &ref1, &empty_ref);
          const std::vector<float> got2 = run(GradWrite::assign, &got1, &empty_got);
          EXPECT_EQ(empty_got, empty_ref);
          ASSERT_GT(empty_ref, 0) << "no expert of layer 0 went without a token: the empty-group path is untested";
          auto mismatches = [](const std::vector<float>& a, const std::vector<float>& r) {
            std::size_t bad = 0;
            for (std::size_t i = 0; i < r.size(); ++i) bad += (a[i] == r[i]) ? 0 : 1;  // NaN != NaN
            return bad;
          };
          ASSERT_EQ(got1.size(), ref1.size());
          EXPECT_EQ(mismatches(got1, ref1), 0u) << "after the assigning micro-batch";
          EXPECT_EQ(mismatches(got2, ref2), 0u) << "after the adding micro-batch";
        }
      }
    }
  }
}

// A graph is captured per gradient write: a step's assigning first micro-batch and its adding
// others replay their own graphs, with the gradients of eager runs bit for bit.
TEST(CudaModel, CudaGraphsKeepAssignAndAddApart) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  const std::vector<float> w = rounded_init(c, 14);
  const Batch2 batches[] = {random_batch(c, 61), random_batch(c, 62)};
  auto run = [&](bool graphs, std::int64_t* launches) {
    CudaModelOptions o;
    o.attention_impl = kernels::cuda::AttentionImpl::fallback;
    o.cuda_graphs = graphs;
    CudaMoEModel m(c, std::move(o));
    m.load_weights(w);
    // Three steps of two micro-batches: warm-up, capture, replay for each write.
    for (int i = 0; i < 6; ++i) {
      const Batch2& b = batches[i % 2];
      m.forward_backward_async(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 0.5f, 0, nullptr,
                               i % 2 == 0 ? GradWrite::assign : GradWrite::add);
      (void)m.collect_loss(0);
    }
    *launches = m.cuda_graph_launches();
    return host_grads(m);
  };
  std::int64_t eager_launches = -1, graph_launches = -1;
  const auto eager = run(false, &eager_launches), graphed = run(true, &graph_launches);
  EXPECT_EQ(eager_launches, 0);
  EXPECT_EQ(graph_launches, 4) << "calls 3 to 6 must be graph launches, two per write";
  ASSERT_EQ(eager.size(), graphed.size());
  EXPECT_EQ(std::memcmp(eager.data(), graphed.data(), eager.size() * sizeof(float)), 0);
}

// With hooks set, graphs run only when the quiet predicate says the hooks are idle.
TEST(CudaModel, CudaGraphsWaitForQuietHooks) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(1);
  const Batch2 b = random_batch(c, 31);
  CudaModelOptions o;
  o.cuda_graphs = true;
  CudaMoEModel m(c, std::move(o));
  m.init(3);
  int calls = 0;
  bool quiet = false;
  m.set_hooks({[&](int) { ++calls; }, [&](int) { ++calls; }});
  m.set_hooks_quiet([&] { return quiet; });
  for (int i = 0; i < 3; ++i) (void)m.forward_backward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 1.0f);
  EXPECT_EQ(m.cuda_graph_launches(), 0);
  EXPECT_EQ(calls, 3 * 2 * m.num_units());
  quiet = true;
  calls = 0;
  for (int i = 0; i < 3; ++i) (void)m.forward_backward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 1.0f);
  EXPECT_EQ(m.cuda_graph_launches(), 2);  // the first quiet call runs eagerly (warm-up)
  EXPECT_EQ(calls, 2 * m.num_units());    // ... and calls the hooks, which are quiet
}

// The caller's forward-end event is recorded inside replays too (an event record node pointed at
// it at each launch: a stale one would precede the micro-batch's start), and the delayed update's
// two alternating weight/gradient pairs keep one graph each (2 captures, not one per switch),
// with the losses and both pairs' gradients of eager runs bit for bit.
TEST(CudaModel, CudaGraphsTimeTheForwardAndKeepTwoBufferPairs) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  MoEModel<float> cpu(c);
  cpu.init(10);
  round_params_to_bf16(cpu);
  const Batch2 batches[] = {random_batch(c, 41), random_batch(c, 42)};
  constexpr int kCalls = 6;  // pairs 0, 1, 0, 1, 0, 1: warm, warm, capture, capture, replay, replay
  struct Outcome {
    std::vector<Loss> losses;
    std::vector<float> grads[2];
    std::int64_t launches = 0, captures = 0;
  };
  auto run = [&](bool graphs) {
    CudaModelOptions o;
    o.attention_impl = kernels::cuda::AttentionImpl::fallback;
    o.expert_impl = kernels::cuda::cutlass_available() ? kernels::cuda::GroupedGemmImpl::cutlass
                                                       : kernels::cuda::GroupedGemmImpl::custom;
    o.cuda_graphs = graphs;
    CudaMoEModel m(c, std::move(o));
    m.load_weights(cpu.params());
    m.zero_grad();
    const std::size_t n = m.num_params();
    void* w2 = nullptr;
    void* g2 = nullptr;
    EXPECT_EQ(cudaMalloc(&w2, n * sizeof(__nv_bfloat16)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&g2, n * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(w2, m.weights(), n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(g2, 0, n * sizeof(float)), cudaSuccess);
    cudaEvent_t start = nullptr, fwd = nullptr, end = nullptr;
    EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&fwd), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&end), cudaSuccess);
    Outcome out;
    auto* other_w = static_cast<__nv_bfloat16*>(w2);
    void* other_g = g2;
    for (int i = 0; i < kCalls; ++i) {
      if (i > 0) std::tie(other_w, other_g) = m.swap_buffers(other_w, other_g);  // alternate the pairs
      const Batch2& b = batches[i % 2];
      EXPECT_EQ(cudaEventRecord(start, m.stream()), cudaSuccess);
      m.forward_backward_async(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 0.5f, 0, fwd);
      EXPECT_EQ(cudaEventRecord(end, m.stream()), cudaSuccess);
      out.losses.push_back(m.collect_loss(0));
      EXPECT_EQ(cudaEventSynchronize(end), cudaSuccess);
      float to_fwd = 0, from_fwd = 0;
      EXPECT_EQ(cudaEventElapsedTime(&to_fwd, start, fwd), cudaSuccess) << "call " << i;
      EXPECT_EQ(cudaEventElapsedTime(&from_fwd, fwd, end), cudaSuccess) << "call " << i;
      EXPECT_GT(to_fwd, 0.0f) << "call " << i << ": the forward-end event was not recorded in this call";
      EXPECT_GT(from_fwd, 0.0f) << "call " << i;
    }
    // kCalls - 1 = 5 swaps: the model holds pair 1 now; one more gives it back its own pair 0.
    out.grads[1] = host_grads(m);
    std::tie(other_w, other_g) = m.swap_buffers(other_w, other_g);
    out.grads[0] = host_grads(m);
    out.launches = m.cuda_graph_launches();
    out.captures = m.cuda_graph_captures();
    for (cudaEvent_t e : {start, fwd, end}) (void)cudaEventDestroy(e);
    // Pair 1 is free to go once the stream is idle.
    EXPECT_EQ(cudaStreamSynchronize(m.stream()), cudaSuccess);
    (void)cudaFree(w2);
    (void)cudaFree(g2);
    return out;
  };
  const Outcome eager = run(false), graphed = run(true);
  EXPECT_EQ(eager.launches, 0);
  ASSERT_EQ(graphed.launches, 4) << "calls 3 to 6 must run as graph launches";
  EXPECT_EQ(graphed.captures, 2) << "one graph per buffer pair, kept across the switches";
  ASSERT_EQ(graphed.losses.size(), eager.losses.size());
  for (std::size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_EQ(graphed.losses[i].ce, eager.losses[i].ce) << "call " << i;
    EXPECT_EQ(graphed.losses[i].aux, eager.losses[i].aux) << "call " << i;
  }
  for (int p = 0; p < 2; ++p) {
    ASSERT_EQ(graphed.grads[p].size(), eager.grads[p].size());
    EXPECT_EQ(std::memcmp(graphed.grads[p].data(), eager.grads[p].data(), eager.grads[p].size() * sizeof(float)), 0)
        << "pair " << p << ": gradients differ between graph replays and eager runs";
  }
}

TEST(CudaModel, HooksRunPerUnitInOrder) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  CudaMoEModel m(c);
  m.init(1);
  std::vector<int> fwd, bwd;
  m.set_hooks({[&](int u) { fwd.push_back(u); }, [&](int u) { bwd.push_back(u); }});
  const Batch2 b = random_batch(c, 3);
  (void)m.forward_backward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len, 1.0f);
  const int U = m.num_units();
  ASSERT_EQ(U, c.layers + 2);
  ASSERT_EQ(static_cast<int>(fwd.size()), U);
  ASSERT_EQ(static_cast<int>(bwd.size()), U);
  for (int u = 0; u < U; ++u) {
    EXPECT_EQ(fwd[static_cast<std::size_t>(u)], u);
    EXPECT_EQ(bwd[static_cast<std::size_t>(u)], U - 1 - u);
  }
  // Units tile the flat parameter array.
  std::size_t next = 0;
  for (int u = 0; u < U; ++u) {
    const auto [a, e] = m.unit_range(u);
    EXPECT_EQ(a, next) << "unit " << u;
    EXPECT_GT(e, a);
    next = e;
  }
  EXPECT_EQ(next, m.num_params());
}

TEST(CudaModel, RejectsBadInputs) {
  GHT_REQUIRE_GPU();
  const ModelConfig c = test_config(2);
  CudaMoEModel m(c);
  Batch2 b = random_batch(c, 3);
  b.tokens[7] = c.vocab;  // out of range
  EXPECT_THROW((void)m.forward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len), ::ght::logic_error);
  b = random_batch(c, 3);
  b.targets[3] = -5;
  EXPECT_THROW((void)m.forward(b.tokens.data(), b.targets.data(), c.micro_batch, c.seq_len), ::ght::logic_error);
  std::vector<float> small(10);
  EXPECT_THROW(m.load_weights(small), ::ght::logic_error);
  EXPECT_THROW(m.backward(1.0f), ::ght::logic_error);  // no forward yet
}


// ---- the training loop ------------------------------------------------------------------------

// The CUDA loop against the CPU loop on the same config, seed and data; then exact-position resume.
TEST(CudaTrain, TracksCpuLoopAndResumes) {
  GHT_REQUIRE_GPU();
  const TempDir tmp("ght_cuda_train");
  write_random_corpus(tmp / "data");
  TrainRunOptions quiet;
  quiet.quiet = true;

  TrainConfig cpu_cfg = small_run_config(tmp / "data", tmp / "cpu");
  cpu_cfg.backend = "cpu";
  (void)train(cpu_cfg, quiet);
  TrainConfig gpu_cfg = small_run_config(tmp / "data", tmp / "gpu");
  gpu_cfg.backend = "cuda";
  TrainRunOptions profiled = quiet;
  profiled.profile_steps = 4;  // of 6: the file holds exactly the first 4
  const TrainSummary sg = train_cuda(gpu_cfg, profiled);
  EXPECT_EQ(sg.backend, "cuda");
  EXPECT_EQ(sg.last_step, 6);
  EXPECT_FALSE(sg.last_checkpoint.empty());
  {
    std::ifstream pf(tmp / "gpu/profile.json");
    ASSERT_TRUE(pf.good()) << "--profile-steps 4 wrote no profile.json";
    const auto pj = nlohmann::json::parse(pf);
    ASSERT_EQ(pj.at("steps").size(), 4u);
    EXPECT_EQ(pj.at("steps")[0].at("step"), 1);
    EXPECT_EQ(pj.at("steps")[3].at("step"), 4);
    for (const auto& st : pj.at("steps")) {
      EXPECT_GT(st.at("forward_ms").get<double>(), 0.0);
      EXPECT_GT(st.at("backward_ms").get<double>(), 0.0);
    }
  }

  const RunLog lc = read_log(tmp / "cpu"), lg = read_log(tmp / "gpu");
  ASSERT_EQ(lg.loss.size(), 6u);
  for (const auto& [step, loss] : lc.loss) {
    ASSERT_TRUE(lg.loss.count(step)) << "step " << step;
    std::printf("step %lld: cpu %.5f gpu %.5f\n", static_cast<long long>(step), loss, lg.loss.at(step));
    EXPECT_NEAR(lg.loss.at(step), loss, 2e-2 * loss) << "step " << step;
  }
  EXPECT_LT(lg.loss.at(6), lg.loss.at(1));  // it learns
  for (const auto& [step, loss] : lc.eval) {
    ASSERT_TRUE(lg.eval.count(step)) << "eval at step " << step;
    EXPECT_NEAR(lg.eval.at(step), loss, 2e-2 * loss) << "eval at step " << step;
  }

  // Stop at 3 (with a checkpoint), resume to 6: same data position and optimizer state, so the
  // losses repeat those of the uninterrupted run (up to cuDNN's atomic dQ accumulation).
  TrainConfig res_cfg = small_run_config(tmp / "data", tmp / "resumed");
  TrainRunOptions first = quiet;
  first.stop_at = 3;
  (void)train_cuda(res_cfg, first);
  TrainRunOptions second = quiet;
  second.resume = "auto";
  const TrainSummary sr = train_cuda(res_cfg, second);
  EXPECT_EQ(sr.first_step, 3);
  EXPECT_EQ(sr.last_step, 6);
  const RunLog lr = read_log(tmp / "resumed");
  for (std::int64_t step = 1; step <= 6; ++step) {
    ASSERT_TRUE(lr.loss.count(step)) << "step " << step;
    EXPECT_NEAR(lr.loss.at(step), lg.loss.at(step), 1e-3 * lg.loss.at(step)) << "step " << step;
  }
}

// step -> (speculated_params, speculation_undone) from a run's profile.json.
std::map<std::int64_t, std::pair<std::size_t, bool>> read_speculation(const std::string& run_dir) {
  std::map<std::int64_t, std::pair<std::size_t, bool>> m;
  std::ifstream pf(run_dir + "/profile.json");
  if (!pf.good()) {
    ADD_FAILURE() << run_dir << "/profile.json is missing";
    return m;
  }
  const auto pj = nlohmann::json::parse(pf);  // named: a range-for over a temporary's member dangles
  for (const auto& st : pj.at("steps")) {
    m[st.at("step").get<std::int64_t>()] = {st.at("speculated_params").get<std::size_t>(),
                                            st.at("speculation_undone").get<bool>()};
  }
  return m;
}

// Updates launched during the last backward (AdamW::speculate_region) change nothing: the same
// run with GHT_OPT_SPECULATE=0 gives the same losses. Unclipped, every step keeps its
// speculation; with clipping on every step, the first step's is undone and no more are tried.
TEST(CudaTrain, SpeculativeUpdatesDuringBackwardChangeNothing) {
  GHT_REQUIRE_GPU();
  const TempDir tmp("ght_cuda_train");
  write_random_corpus(tmp / "data");
  TrainRunOptions run;
  run.quiet = true;
  run.profile_steps = 6;
  const ght::test::ScopedFlag host_state("GHT_OPTIMIZER", "gpu_link");  // the path that speculates
  auto train_with = [&](const std::string& name, const std::string& spec, double max_norm) {
    const ght::test::ScopedFlag arena("GHT_OPT_SPECULATE", spec);
    TrainConfig c = small_run_config(tmp / "data", tmp / name);
    c.backend = "cuda";
    c.adam.max_grad_norm = max_norm;
    (void)train_cuda(c, run);
    return read_log(tmp / name);
  };
  const RunLog off = train_with("off", "0", 0.0);
  const RunLog on = train_with("on", "64MiB", 0.0);
  const RunLog clipped = train_with("clipped", "64MiB", 1e-3);

  ASSERT_EQ(on.loss.size(), 6u);
  for (const auto& [step, loss] : off.loss) {
    ASSERT_TRUE(on.loss.count(step)) << "step " << step;
    // Bitwise-equal updates; the losses still differ by cuDNN's atomic dQ accumulation.
    EXPECT_NEAR(on.loss.at(step), loss, 1e-3 * loss) << "step " << step;
  }
  const auto spec_on = read_speculation(tmp / "on"), spec_off = read_speculation(tmp / "off");
  const auto spec_clipped = read_speculation(tmp / "clipped");
  ASSERT_EQ(spec_on.size(), 6u);
  for (const auto& [step, sp] : spec_on) {
    EXPECT_GT(sp.first, 0u) << "step " << step << ": nothing was speculated";
    EXPECT_FALSE(sp.second) << "step " << step << ": an unclipped step undid its speculation";
    EXPECT_EQ(spec_off.at(step).first, 0u) << "GHT_OPT_SPECULATE=0 still speculated";
  }
  ASSERT_EQ(spec_clipped.size(), 6u);
  EXPECT_GT(spec_clipped.at(1).first, 0u);
  EXPECT_TRUE(spec_clipped.at(1).second) << "a clipped step kept its speculation";
  for (std::int64_t step = 2; step <= 6; ++step) EXPECT_EQ(spec_clipped.at(step).first, 0u) << "step " << step;
  EXPECT_LT(clipped.loss.at(6), clipped.loss.at(1));  // it still learns
}

}  // namespace
}  // namespace ght::trainer
