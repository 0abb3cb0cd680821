// The MPI communicator's bf16 sum (trainer/dist/comm.hpp) under `mpirun -np 2` and `-np 4`
// (tests/CMakeLists.txt): 2-byte values with a user MPI_Op, checked against the exact sum with the
// bound comm.hpp states, bit for bit for two ranks, and the same bits on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "optimizer/bf16.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/detail/comm_mpi.hpp"
#include "trainer/dist/launch.hpp"
#include "trainer/mpi/mpi_main.hpp"

namespace {

using ght::optimizer::bf16;
using ght::optimizer::to_bf16;
using ght::optimizer::to_float;
using namespace ght::dist;

std::shared_ptr<Communicator> g_comm;

// Rank r's values: mixed signs and magnitudes over 2^-20..2^20 (normal numbers, never zeros), so
// that partial sums cancel and round at every scale.
std::vector<bf16> values(int rank, std::size_t n) {
  std::mt19937 gen(1000u + static_cast<unsigned>(rank));
  std::normal_distribution<float> mant(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<bf16> v(n);
  for (auto& x : v) {
    float f = mant(gen);
    if (f == 0.0f) f = 0.5f;
    x = to_bf16(std::ldexp(f, ex(gen)));
  }
  return v;
}

// γ_k = k·u/(1 − k·u), u = 2^-8: at most N−1 roundings of partial sums.
double gamma_bound(int k) {
  const double u = std::ldexp(1.0, -8);
  return k * u / (1 - k * u);
}

// Every element against the exact sum over ranks (in double, which holds a sum of N bf16 values
// over this range exactly enough: its error is far below the bound), and rank 0's bits on every rank.
void check_sum(const std::vector<bf16>& got, std::size_t n) {
  const int ranks = g_comm->size();
  std::vector<std::vector<bf16>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(values(r, n));
  double worst = 0;  // |error| / Σ|x|
  int bad = 0;       // failures reported (a few), without leaving the collectives below unmatched
  for (std::size_t i = 0; i < n && bad < 5; ++i) {
    double exact = 0, mag = 0;
    for (int r = 0; r < ranks; ++r) {
      exact += to_float(all[static_cast<std::size_t>(r)][i]);
      mag += std::abs(to_float(all[static_cast<std::size_t>(r)][i]));
    }
    const double err = std::abs(static_cast<double>(to_float(got[i])) - exact);
    worst = std::max(worst, err / mag);
    if (err > gamma_bound(ranks - 1) * mag) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": sum " << to_float(got[i]) << ", exact " << exact << ", Σ|x| " << mag;
    }
    if (ranks == 2 && got[i].bits != to_bf16(to_float(all[0][i]) + to_float(all[1][i])).bits) {  // one addition
      ++bad;
      ADD_FAILURE() << "element " << i << ": two ranks' sum is not bf16(x_0 + x_1)";
    }
  }
  std::vector<bf16> root = got;
  g_comm->broadcast(root.data(), root.size() * sizeof(bf16), 0);
  EXPECT_EQ(std::memcmp(root.data(), got.data(), got.size() * sizeof(bf16)), 0) << "rank 0 holds other bits";
  if (g_comm->rank() == 0) {
    std::printf("%d ranks, %zu bf16: worst |sum - exact| / Σ|x| = %.2e (bound γ_%d = %.2e)\n", ranks, n, worst,
                ranks - 1, gamma_bound(ranks - 1));
  }
}

TEST(DistCommBf16Mpi, AllreduceSumIsWithinTheBoundOfTheExactSum) {
  for (std::size_t n : {std::size_t{1}, std::size_t{4099}}) {
    std::vector<bf16> x = values(g_comm->rank(), n);
    g_comm->allreduce_sum(x.data(), n);
    check_sum(x, n);
  }
}

// In pieces of 7 elements (the path of buffers beyond MPI's int counts), and in the background
// (streaming DiLoCo's fragments) with other collectives running meanwhile.
TEST(DistCommBf16Mpi, InPiecesAndInTheBackground) {
  const std::size_t n = 1000;
  const auto pieces = ght::dist::detail::make_mpi_communicator(detect_launch(process_env()), std::chrono::seconds(60), 7);
  std::vector<bf16> x = values(g_comm->rank(), n);
  pieces->allreduce_sum(x.data(), n);
  check_sum(x, n);

  x = values(g_comm->rank(), n);
  pieces->start_allreduce_sum(x.data(), n);
  float other = 1.0f;
  pieces->allreduce_sum(&other, 1);
  EXPECT_EQ(other, static_cast<float>(g_comm->size()));
  pieces->wait_allreduce();
  check_sum(x, n);
}

TEST(DistCommBf16Mpi, InfinityAndNanPropagate) {
  std::vector<bf16> x(3, to_bf16(1.0f));
  if (g_comm->rank() == 1) {
    x[0] = to_bf16(INFINITY);
    x[1] = to_bf16(NAN);
  }
  g_comm->allreduce_sum(x.data(), x.size());
  EXPECT_EQ(to_float(x[0]), INFINITY);
  EXPECT_TRUE(std::isnan(to_float(x[1])));
  EXPECT_EQ(to_float(x[2]), static_cast<float>(g_comm->size()));
}

}  // namespace

int main(int argc, char** argv) { return ght::test::run_mpi_tests(argc, argv, g_comm); }
