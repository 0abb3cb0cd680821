// The accumulator must be bit-identical to a plain sequential loop for any thread count, for
// bf16 and fp32 sources, and through the double-buffered staging pipeline with odd sizes.
#include "optimizer/accumulate.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "optimizer/cpu_threads.hpp"

namespace ght::optimizer {
namespace {

struct Batch {
  std::vector<float> f32;
  std::vector<std::uint16_t> b16;
};

Batch random_batch(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Batch b;
  b.f32.resize(n);
  b.b16.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Mixed magnitudes so rounding in the additions actually happens.
    b.f32[i] = nd(rng) * (i % 3 == 0 ? 1e-3f : i % 3 == 1 ? 1.0f : 1e3f);
    b.b16[i] = float_to_bf16_bits(nd(rng));
  }
  return b;
}

std::vector<float> sequential(const std::vector<Batch>& mb, GradType t, std::size_t n) {
  std::vector<float> d(n);
  for (std::size_t k = 0; k < mb.size(); ++k) {
    for (std::size_t i = 0; i < n; ++i) {
      const float s = t == GradType::fp32 ? mb[k].f32[i] : bf16_bits_to_float(mb[k].b16[i]);
      d[i] = k == 0 ? s : d[i] + s;
    }
  }
  return d;
}

const void* src_of(const Batch& b, GradType t) {
  return t == GradType::fp32 ? static_cast<const void*>(b.f32.data())
                             : static_cast<const void*>(b.b16.data());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class AccumulateTest : public ::testing::TestWithParam<GradType> {};

TEST_P(AccumulateTest, BitExactForOneTwoAndAllThreads) {
  const GradType t = GetParam();
  std::mt19937 rng(7);
  for (std::size_t n : {1ul, 17ul, 4099ul, 300001ul}) {
    std::vector<Batch> mb;
    for (int k = 0; k < 4; ++k) mb.push_back(random_batch(n, rng));
    const std::vector<float> ref = sequential(mb, t, n);
    for (int threads : {1, 2, resolve_cpu_threads(0), 5}) {
      std::vector<float> d(n, 12345.0f);  // assign must overwrite whatever is there
      for (std::size_t k = 0; k < mb.size(); ++k) {
        accumulate(d.data(), src_of(mb[k], t), t, n,
                   k == 0 ? AccumulateMode::assign : AccumulateMode::add, threads);
      }
      EXPECT_TRUE(same_bits(d, ref)) << "n=" << n << " threads=" << threads;
    }
  }
}

TEST_P(AccumulateTest, PipelineWithOddSizesIsBitExact) {
  const GradType t = GetParam();
  std::mt19937 rng(11);
  GradStreamAccumulator::Options o;
  o.staging_bytes = 1000;  // rounds down to 960 bytes: many chunks, last one partial
  o.threads = 2;
  o.stage_host_sources = true;
  GradStreamAccumulator acc(o);
  EXPECT_EQ(acc.slot_bytes(), 960u);
  for (std::size_t n : {1ul, 239ul, 240ul, 241ul, 480ul, 10007ul, 70001ul}) {
    std::vector<Batch> mb;
    for (int k = 0; k < 3; ++k) mb.push_back(random_batch(n, rng));
    const std::vector<float> ref = sequential(mb, t, n);
    std::vector<float> d(n, -7.0f);
    for (std::size_t k = 0; k < mb.size(); ++k) {
      acc.run(d.data(), src_of(mb[k], t), t, n,
              k == 0 ? AccumulateMode::assign : AccumulateMode::add);
    }
    EXPECT_TRUE(same_bits(d, ref)) << "n=" << n;
  }
  EXPECT_GT(acc.bytes_staged(), 0u);
}

TEST_P(AccumulateTest, PlacedAccumulatorStartsAtZeroAndAddsBitExact) {
  // place_accumulator zeroes with accumulate()'s split; every later add must equal a scalar
  // loop that starts from zero, for any team size (including ones that do not divide n).
  const GradType t = GetParam();
  std::mt19937 rng(13);
  for (std::size_t n : {1ul, 4099ul, 300001ul}) {
    std::vector<Batch> mb;
    for (int k = 0; k < 3; ++k) mb.push_back(random_batch(n, rng));
    std::vector<float> ref(n, 0.0f);
    for (const Batch& b : mb) {
      for (std::size_t i = 0; i < n; ++i) {
        ref[i] = ref[i] + (t == GradType::fp32 ? b.f32[i] : bf16_bits_to_float(b.b16[i]));
      }
    }
    for (int threads : {1, 2, 5}) {
      std::vector<float> d(n, 12345.0f);
      EXPECT_LE(place_accumulator(d.data(), n, threads), n * sizeof(float));
      EXPECT_TRUE(same_bits(d, std::vector<float>(n, 0.0f))) << "n=" << n;
      for (const Batch& b : mb) accumulate(d.data(), src_of(b, t), t, n, AccumulateMode::add, threads);
      EXPECT_TRUE(same_bits(d, ref)) << "n=" << n << " threads=" << threads;
    }
  }
}

TEST(AccumulateTeam, SmallArraysUseFewerThreadsNeverNone) {
  EXPECT_EQ(accumulate_team_size(0, 8), 1);
  EXPECT_EQ(accumulate_team_size(1, 8), 1);
  EXPECT_EQ(accumulate_team_size(std::size_t{1} << 30, 8), 8);
  EXPECT_EQ(accumulate_team_size(std::size_t{1} << 30, 0), resolve_cpu_threads(0));
  EXPECT_LE(accumulate_team_size(std::size_t{1} << 16, 8), 8);
  EXPECT_GE(accumulate_team_size(std::size_t{1} << 16, 8), 1);
}

INSTANTIATE_TEST_SUITE_P(Types, AccumulateTest, ::testing::Values(GradType::bf16, GradType::fp32),
                         [](const auto& info) {
                           return std::string(info.param == GradType::bf16 ? "bf16" : "fp32");
                         });

TEST(DoubleBuffer, OverlapsCopyOfNextChunkAndNeverOverwritesAnUnconsumedSlot) {
  for (std::size_t n : {1ul, 5ul, 10ul, 11ul, 99ul}) {
    const std::size_t chunk = 5;
    std::vector<std::pair<char, std::size_t>> log;  // (c)opy or (u)se, offset
    long holding[2] = {-1, -1};  // chunk offset held (copied, not yet consumed) per slot
    std::size_t covered = 0;
    detail::StagingOps ops;
    ops.start_copy = [&](int slot, std::size_t off, std::size_t count) {
      ASSERT_EQ(holding[slot], -1) << "slot " << slot << " refilled before it was consumed";
      holding[slot] = static_cast<long>(off);
      ASSERT_LE(off + count, n);
      log.emplace_back('c', off);
    };
    ops.wait_copy = [&](int slot) { ASSERT_NE(holding[slot], -1); };
    ops.consume = [&](int slot, std::size_t off, std::size_t count) {
      ASSERT_EQ(holding[slot], static_cast<long>(off));
      ASSERT_EQ(off, covered) << "chunks consumed out of order";
      covered += count;
      holding[slot] = -1;
      log.emplace_back('u', off);
    };
    detail::run_double_buffered(n, chunk, ops);
    EXPECT_EQ(covered, n);
    // With two or more chunks the copy of chunk 1 is issued before chunk 0 is consumed.
    if (n > chunk) {
      ASSERT_GE(log.size(), 3u);
      EXPECT_EQ(log[0], std::make_pair('c', std::size_t{0}));
      EXPECT_EQ(log[1], std::make_pair('c', std::size_t{5}));
      EXPECT_EQ(log[2], std::make_pair('u', std::size_t{0}));
    }
  }
}

}  // namespace
}  // namespace ght::optimizer
